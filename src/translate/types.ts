import type { OutputLimitField } from '../config/types.js';
import type { Endpoint } from '../protocols/types.js';
import type { ParsedEvents } from '../providers/sse.js';

/** What a translation knows of the call it translates. */
export interface CallFacts {
  /** The model id the client called (answers name it, not the upstream one). */
  readonly model: string;
  /** The output budget of the answer: the request's limit, or the model's default. */
  readonly maxOutputTokens: number;
  /** The gateway's estimate of the input tokens (what a stream says before the provider counts). */
  readonly inputTokens: number;
  readonly requestId: string;
  /** The client's body, as checked by its protocol. */
  readonly clientBody: Record<string, unknown>;
  /** Where an OpenAI-protocol provider reads a chat call's output limit (its `outputLimitField`). */
  readonly outputLimitField?: OutputLimitField;
}

/** A request in the provider's protocol. */
export interface TranslatedRequest {
  readonly body: Record<string, unknown>;
  /** Optional fields with no equivalent that were left out (the `x-gateway-dropped` header). */
  readonly dropped: string[];
  /** Tool names shortened for the provider, mapped back to the client's. */
  readonly names: Map<string, string>;
}

/** One call's translation state: the facts and what the request's translation decided. */
export interface Translation extends CallFacts {
  readonly names: Map<string, string>;
  /** The answer's `created` (Unix seconds), fixed once per call. */
  readonly created: number;
  /** Given a finished Responses answer's output items, which later calls may refer to (ItemMemory). */
  readonly remember?: (output: readonly unknown[]) => void;
  /** What the answer's item ids are made of: the gateway's own (a client's `x-request-id` may be reused: found in review). */
  readonly itemPrefix: string;
}

/**
 * Translation from a client protocol to a provider's: pure and synchronous, so each direction is
 * tested without sockets. `request` throws Untranslatable (400 naming the field).
 */
export interface Translator {
  /** The endpoint the provider is called on. */
  readonly provider: Endpoint;
  request(body: Record<string, unknown>, facts: CallFacts): TranslatedRequest;
  /** A complete JSON answer of the provider, in the client's protocol. */
  answer(json: Record<string, unknown>, call: Translation): Record<string, unknown>;
  /**
   * A stream transducer: one whole provider event in, the client's events out (maybe none);
   * null when the provider's stream has ended, for what the client's protocol still needs.
   */
  stream(call: Translation, parsed?: ParsedEvents): (event: string | null) => string;
}
