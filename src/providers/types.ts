import type { ServerResponse } from 'node:http';
import type { ModelEntry } from '../directory.js';
import type { ErrorCode, ErrorDetails, ErrorSpec } from '../errors.js';
import type { Usage } from '../money.js';

export type Endpoint = 'chat' | 'messages' | 'embeddings';

/**
 * One admitted model call as a provider sees it. Providers know nothing of limits: they
 * answer in the endpoint's protocol, report usage through `settle` before the final bytes,
 * and stop when the client goes away.
 */
export interface Exchange {
  readonly endpoint: Endpoint;
  /** The client's parsed, validated request body. */
  readonly body: Record<string, unknown>;
  readonly model: ModelEntry;
  readonly stream: boolean;
  readonly requestId: string;
  readonly res: ServerResponse;
  /** Input size in characters of all message text (the basis of estimates). */
  readonly inputChars: number;
  /** The output budget in tokens: the request's max_tokens or the model's default. */
  readonly maxOutputTokens: number;
  /** True once the client has gone away. */
  readonly aborted: boolean;
  /** Registers what to stop when the client goes away (timers, the upstream request). */
  onAbort(stop: () => void): void;
  /** Writes the status line and headers (request ids added) with any extra header pairs. */
  head(status: number, contentType: string, extra?: string[]): void;
  /** Counts generated characters relayed so far (the estimate when usage never arrives). */
  noteOutput(chars: number): void;
  /** Reports the time to the provider's response headers of one attempt (metrics). */
  observeUpstream(seconds: number): void;
  /** Reports a failed attempt: 'connection', 'timeout', '429', '4xx', '5xx', 'garbage', 'cut' (metrics). */
  upstreamFailed(kind: string): void;
  /** A request header of the client (lowercase name). */
  header(name: string): string | undefined;
  /**
   * Charges `usage` (null: the provider reported none, so an estimate from input and noted
   * output is charged and marked estimated), then runs `then`, which writes the final bytes.
   */
  settle(usage: Usage | null, then: () => void): void;
  /** Answers with a contract error (before any byte was sent) or cuts the stream (after). */
  fail(code: ErrorCode, details?: ErrorDetails): void;
  /** Answers with an error outside the fixed table (a provider's `upstream_<status>`). */
  failWith(code: string, spec: ErrorSpec, message: string): void;
  /** Ends a stream that broke off after bytes were sent: charges `usage` or an estimate, cuts the connection. */
  cut(usage: Usage | null, why: string): void;
}

export interface Provider {
  handle(exchange: Exchange): void;
}
