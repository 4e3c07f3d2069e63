import type { IncomingHttpHeaders } from 'node:http';
import type { ModelEntry } from '../directory.js';
import type { Usage } from '../money.js';
import type { Exchange } from '../providers/types.js';

/** The wire protocols clients call, one per endpoint. */
export type Endpoint = 'chat' | 'messages' | 'responses' | 'embeddings';

/** A request body that passed its protocol's checks. */
export interface CallRequest {
  body: Record<string, unknown>;
  model: string;
  stream: boolean;
  /** The output limit the client set (max_tokens and the like), or null. */
  maxTokens: number | null;
  /** The fields that set an output limit, with their values (each is checked against the model). */
  limits: Array<[string, number]>;
  /** How many answers the provider generates (chat's `n`), each up to the output limit. */
  choices: number;
  /**
   * Where the request asks for audio in and out (the field to name), when it does: billed at
   * audio prices, which the model must have (Chat Completions). Absent: no audio.
   */
  audio?: AudioAsked | null;
  /**
   * Web searches the provider bills for the call whatever its answer says (Chat Completions'
   * `web_search_options`: a search model bills one search a call, and its usage does not say).
   * Absent: none.
   */
  searchesPerCall?: number;
}

export interface AudioAsked {
  readonly input: string | null;
  readonly output: string | null;
  /** Audio parts in the input (each estimated at DOCUMENT_TOKENS, as the input estimate counts it). */
  readonly inputParts: number;
}

export type Checked = { ok: true; call: CallRequest } | { ok: false; message: string; param: string };

/**
 * Watches a relayed stream: which events pass, which one is final, what usage it reported.
 * Usage reported before the final count (Anthropic's `message_start`, running counts) goes to
 * `Exchange.noteUsage`; `usage()` is only ever the final count.
 */
export interface StreamWatcher {
  /** Looks at one whole event; `forward: false` drops it, `final: true` holds it until the charge is settled. */
  see(event: string): { forward: boolean; final: boolean };
  /** The final usage the stream reported, or null if it has not (yet). */
  usage(): Usage | null;
}

/**
 * One wire protocol, everything the gateway knows of it: the requests it checks, the body it
 * sends upstream, how it reads usage out of answers and streams, and how the mock provider
 * answers in it. Adding a protocol is adding one of these (src/protocols/NAME/index.ts).
 */
export interface WireProtocol {
  readonly endpoint: Endpoint;
  /** The path clients call. */
  readonly path: string;
  /** Answers also carry `request-id` (the header the Anthropic SDK reads). */
  readonly anthropic: boolean;
  /** The gateway's checks of a request body (the provider judges the rest). */
  check(body: unknown): Checked;
  /**
   * Why a provider of this protocol may not be given the request as it is (it would bill what
   * the model's prices cannot price), naming the field; null when it may. Absent: always may.
   */
  passThroughRefusal?(call: CallRequest, headers: IncomingHttpHeaders): { message: string; param: string } | null;
  /** The output one answer may produce, in tokens: the request's limit, or the model's default. */
  outputBudget(call: CallRequest, model: ModelEntry): number;
  /** The JSON sent to a provider of this protocol: the client's body with the model swapped (usage asked for, …). */
  upstreamBody(ex: Exchange): string;
  /** Usage from a complete JSON answer, or null (none, or not believable). */
  usage(json: unknown): Usage | null;
  /**
   * Whether an answer bills something outside its `usage` field (the Responses API's web
   * searches are its output items): it is then parsed whole. Absent: never.
   */
  billsOutsideUsage?(answer: Buffer): boolean;
  /**
   * The web searches a complete JSON answer lists, for an answer whose usage cannot be believed:
   * they are billed all the same (found in review: only the estimate's tokens were). Absent: none.
   */
  searchesOf?(json: unknown): number;
  /** Characters of generated output in a complete JSON answer (its estimate when usage is missing). */
  outputChars(json: unknown): number;
  /** A watcher for one stream; it also counts generated characters for estimates. */
  watch(ex: Exchange): StreamWatcher;
  /** The built-in mock's answer: it echoes the last user text, 1 token per 4 characters. */
  mock(ex: Exchange, tokensPerSecond: number): void;
}
