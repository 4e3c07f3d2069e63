import type { ServerResponse } from 'node:http';
import type { ModelEntry } from '../directory.js';
import type { ErrorCode, ErrorDetails, ErrorSpec } from '../errors.js';
import type { Usage } from '../money.js';

import type { Endpoint } from '../protocols/types.js';
import type { ParsedEvents } from './sse.js';
import type { CountEndpoint } from '../translate/count.js';

export type { Endpoint };

/**
 * One admitted model call as a provider sees it. Providers know nothing of limits: they
 * answer in the endpoint's protocol, report usage through `settle` before the final bytes,
 * and stop when the client goes away.
 */
export interface Exchange {
  readonly endpoint: Endpoint;
  /** The client's parsed, validated request body. */
  readonly body: Record<string, unknown>;
  /** The same body as text, as received (upstream bodies are spliced from it: protocols/splice.ts). */
  readonly text: string;
  readonly model: ModelEntry;
  readonly stream: boolean;
  readonly requestId: string;
  /** The account the call is made for: an origin's full connection pool serves accounts in turn (pool.ts). */
  readonly tenant: string;
  readonly res: ServerResponse;
  /** The gateway's estimate of the request's input tokens (providers/estimate.ts). */
  readonly inputTokens: number;
  /** The output budget of one answer in tokens: the request's limit or the model's default. */
  readonly maxOutputTokens: number;
  /**
   * Attempts the provider may make itself (retries before the first byte): routing.maxAttempts
   * for a model of one provider; 1 on a routed call, where the next attempt is another deployment's.
   */
  readonly maxAttempts: number;
  /** Set on a translated stream: its watcher reads each event there, for the translation to take. */
  readonly parsedEvents?: ParsedEvents;
  /**
   * One whole event of the provider's stream, once its watcher has seen it, as the client gets
   * it: the event itself (the same string), or on a translated call its translation ('' for
   * none; null when it cannot be translated: the call has then ended, cut or answered with an
   * error, and the relay stops). `write` and `end` take what it returns, the client's text; a
   * translated call's `end` adds what the client's protocol needs to end a stream.
   */
  clientEvent(event: string): string | null;
  /** True once the client has gone away. */
  readonly aborted: boolean;
  /** Registers what to stop when the client goes away (timers, the upstream request). */
  onAbort(stop: () => void): void;
  /** Writes the status line and headers (request ids added) with any extra header pairs. */
  head(status: number, contentType: string, extra?: string[]): void;
  /**
   * Writes part of an answer; false when the client is not keeping up: stop producing (pause
   * the provider) until `whenDrained`. `raw`, when given, is `chunk` exactly as the provider's
   * bytes (a chunk of whole events that `clientEvent` gave back unchanged): sent as it is,
   * rather than encoding `chunk` again.
   */
  write(chunk: string, raw?: Buffer): boolean;
  /**
   * Runs `resume` once the client has read what is buffered. Meanwhile the call is waiting for
   * the client, not for the provider; a client that reads nothing for
   * `server.clientIdleTimeoutMs` is cut.
   */
  whenDrained(resume: () => void): void;
  /** Writes the final bytes and ends the answer (after `settle`). */
  end(chunk?: string | Buffer): void;
  /** Counts generated characters relayed so far (the output estimate when usage never arrives). */
  noteOutput(chars: number): void;
  /**
   * Usage the provider reported before its final count (Anthropic's `message_start`): an
   * abnormal end is charged at least this.
   */
  noteUsage(usage: Usage): void;
  /**
   * The provider's count of the request's input, taken before the call (a stored context it
   * holds, or a file, which the request does not carry): an abnormal end is charged at least
   * this input, and the call's reservation is raised to it. Runs `then` (which sends the call)
   * unless the raise is refused: the call is then answered with the refusal, and not sent.
   */
  noteInputCount(tokens: number, then: () => void): void;
  /**
   * Input the provider bills beyond the usage it has reported so far (server tool results that
   * joined the context after its count), as the whole of it so far (set, not added; 0 once a
   * count includes it): an abnormal end adds it to the reported input, at the input price.
   */
  noteUnreportedInput(tokens: number): void;
  /**
   * Whether the provider now has the whole request (true once it is sent; false when the
   * provider refused an attempt). A call whose provider never had it is not charged.
   */
  noteDelivered(delivered: boolean): void;
  /**
   * An attempt begins (false), and its request has all gone to the provider (true): the time a
   * reasoning model's unseen output is estimated from.
   */
  noteSent(sent: boolean): void;
  /** Reports the time to the provider's response headers of one attempt (metrics). */
  observeUpstream(seconds: number): void;
  /**
   * Reports a failed attempt (metrics; routing fails over on some): 'connection', 'timeout',
   * '408', '429', '503', '529', '4xx', '5xx', 'garbage', 'cut', 'body_timeout' (an answer not
   * whole in time), 'queued' (no connection to the origin came free in time: the gateway's own
   * wait, not the provider's); with the provider's Retry-After.
   */
  upstreamFailed(kind: string, retryAfterMs?: number | null): void;
  /** A request header of the client (lowercase name). */
  header(name: string): string | undefined;
  /**
   * Charges the final `usage` (null: the provider reported none; the abnormal-end estimate is
   * charged, marked estimated), then runs `then`, which writes the final bytes.
   */
  settle(usage: Usage | null, then: () => void): void;
  /**
   * Answers with a contract error (before any byte was sent) or cuts the answer (after). If the
   * provider had the request and did not refuse it, the call is charged as an abnormal end.
   */
  fail(code: ErrorCode, details?: ErrorDetails): void;
  /** Answers with an error outside the fixed table (a provider's `upstream_<status>`). */
  failWith(code: string, spec: ErrorSpec, message: string): void;
  /**
   * Ends an answer that broke off after bytes were sent and cuts the connection: charged the
   * provider's final usage when it had already given it, else as an abnormal end.
   */
  cut(why: string, finalUsage?: Usage | null): void;
  /**
   * A bug in the gateway's own handling of this call (an exception where none was expected):
   * answered 500 when nothing was sent yet, else cut; charged as an abnormal end if the
   * provider had the request. The call fails, never the process.
   */
  crash(err: unknown): void;
}

/**
 * A client's token count (Anthropic's count_tokens, OpenAI's input_tokens) as a provider sees
 * it: not a billed call, no slot; the provider answers through `answer` (a count) or `fail`.
 */
export interface CountRequest {
  /** The count the client called, which says its body's protocol and its answer's form. */
  readonly endpoint: CountEndpoint;
  /** The client's parsed, checked request body. */
  readonly body: Record<string, unknown>;
  /**
   * The body for the provider's own count (`countsAs`), without `model`: the client's, or its
   * translation when the client called the other count.
   */
  readonly upstream: Record<string, unknown>;
  readonly model: ModelEntry;
  readonly requestId: string;
  /** The account the count is made for (Exchange.tenant). */
  readonly tenant: string;
  /** Attempts this deployment's count may take, section 6's retries included (a routed count moves on after one). */
  readonly attempts: number;
  /** A request header of the client (lowercase name). */
  header(name: string): string | undefined;
  /** Answers with the provider's JSON (passed through as it is) or the count. */
  answer(json: Buffer | string): void;
  fail(code: ErrorCode, details?: ErrorDetails): void;
  failWith(code: string, spec: ErrorSpec, message: string): void;
  /** Runs `stop` if the client goes away first. */
  onAbort(stop: () => void): void;
  /** The provider's server has no count (404, 405): another deployment may be asked, else the request's 400 with `message`. */
  noCount(message: string): void;
  /**
   * The provider failed as a routed call fails over (no connection, a timeout, 408, 429, 5xx,
   * 529): another deployment may be asked, else `answer` gives this failure as the answer.
   */
  unavailable(answer: () => void): void;
}

export interface Provider {
  handle(exchange: Exchange): void;
  /** The count the provider's own takes bodies of, or null for one that counts either (the mock). */
  readonly countsAs: CountEndpoint | null;
  /** Counts the input tokens of a request of either count; a provider that cannot count answers an error, never a 0. */
  countTokens(request: CountRequest): void;
}
