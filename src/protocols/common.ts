import { MAX_TOKENS } from '../money.js';
import type { Exchange } from '../providers/types.js';
import { replaceTopLevel } from './splice.js';
import type { Checked } from './types.js';

/** Helpers the wire protocols share: JSON shapes, token counts, checks, the mock's writing. */

export const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

export const ABSENT = -1;
export const INVALID = -2;
/**
 * A token count as a provider reported it: an integer from 0 to MAX_TOKENS (a fraction is
 * rounded down), ABSENT when missing, INVALID when it is anything else. Usage with an invalid
 * count is not believed: the call is then charged an estimate instead.
 */
export function count(v: unknown): number {
  if (v === undefined || v === null) return ABSENT;
  if (typeof v !== 'number' || !(v >= 0) || v > MAX_TOKENS) return INVALID;
  return Math.floor(v);
}

/** The mock's token count, and the basis of every estimate: 1 token per 4 characters. */
export function tokensOf(chars: number): number {
  return Math.ceil(chars / 4);
}

/** Text characters of a JSON value's strings under `fields` of each object (iterative; bounded input). */
export function textChars(value: unknown, fields: ReadonlySet<string>): number {
  let n = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (Array.isArray(v)) {
      for (const item of v) stack.push(item);
    } else if (isObj(v)) {
      for (const key of Object.keys(v)) {
        const field = v[key];
        if (typeof field === 'string') {
          if (fields.has(key)) n += field.length;
        } else if (typeof field === 'object' && field !== null) {
          // Tool inputs are objects in Anthropic's answers: their JSON is generated output.
          if (key === 'input' && fields.has('input')) n += JSON.stringify(field).length;
          else stack.push(field);
        }
      }
    }
  }
  return n;
}

/** The text of a message's content: a string, or the `text` of its parts. */
export function partsText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  let text = '';
  for (const part of content) {
    if (isObj(part) && typeof part.text === 'string') text += part.text;
  }
  return text;
}

// --- request checks ----------------------------------------------------------------------------

export const bad = (param: string, message: string): Checked => ({ ok: false, param, message });

/**
 * The first of a request's `tools` the provider bills at prices a model's config has no place
 * for (hosted tools billed by the call or the session), named for a 400; null when none is.
 */
export function unpricedTool(body: Record<string, unknown>, unpriced: (type: string) => boolean): { message: string; param: string } | null {
  const tools = body.tools;
  if (!Array.isArray(tools)) return null;
  for (let i = 0; i < tools.length; i++) {
    const tool = tools[i] as unknown;
    if (isObj(tool) && typeof tool.type === 'string' && unpriced(tool.type)) {
      return { param: `tools[${i}]`, message: `"tools[${i}]" (${tool.type}) is billed by the provider at prices this gateway does not charge.` };
    }
  }
  return null;
}

/**
 * Output limits that OpenAI- and Anthropic-compatible servers read under names of their own
 * (llama.cpp's `n_predict`, which wins over `max_tokens` and takes -1 for no limit; TGI's
 * `max_new_tokens`; Ollama's `num_predict`): the gateway reserves by the API's names only, so a
 * call passed on with one of these could generate far past what it reserved (found in review).
 */
const FOREIGN_OUTPUT_LIMITS = new Set(['n_predict', 'max_new_tokens', 'num_predict']);

/**
 * A top-level key the gateway would not read as the provider might, or null. Every field of
 * both APIs is lowercase letters, digits and underscores; a compatible server written in Go
 * (Ollama) matches keys ignoring case, Unicode folds included (K, the Kelvin sign, is k), so
 * `"Model"` or `"MAX_TOKENS"` beside the checked field would pick its model or output limit
 * there, past the gateway's checks (found in review).
 */
function foreignKey(body: Record<string, unknown>): Checked | null {
  for (const key in body) {
    for (let i = 0; i < key.length; i++) {
      const c = key.charCodeAt(i);
      if ((c >= 97 && c <= 122) || c === 95 || (c >= 48 && c <= 57)) continue;
      const shown = JSON.stringify(key.length > 64 ? `${key.slice(0, 64)}…` : key);
      return bad(key.slice(0, 64), `${shown} is not a field of this API: request fields are written in lowercase letters, digits and underscores.`);
    }
    if (FOREIGN_OUTPUT_LIMITS.has(key)) {
      return bad(key, `"${key}" sets an output limit this gateway does not read: use the API's own field ("max_tokens", "max_completion_tokens" or "max_output_tokens").`);
    }
  }
  return null;
}

/**
 * The checks every model call shares: a JSON object with a model, and a boolean `stream`, whose
 * top-level keys are written as the API writes them. Null when they pass.
 */
export function checkBasics(body: unknown): Checked | null {
  if (!isObj(body)) return bad('', 'The request body must be a JSON object.');
  const foreign = foreignKey(body);
  if (foreign !== null) return foreign;
  if (typeof body.model !== 'string' || body.model === '') return bad('model', '"model" is required and must be a non-empty string.');
  if (body.stream !== undefined && body.stream !== null && typeof body.stream !== 'boolean') return bad('stream', '"stream" must be true or false.');
  return null;
}

/**
 * An OpenAI `service_tier` the gateway can price: the standard one. A priority tier is billed
 * about twice the standard price and flex half, while the gateway charges its own prices: a key
 * holder could make the provider's bill outrun the charge (found in review).
 */
export function checkServiceTier(b: Record<string, unknown>): Checked | null {
  const tier = b.service_tier;
  if (tier === undefined || tier === null || tier === 'auto' || tier === 'default') return null;
  return bad('service_tier', 'This gateway prices calls at the standard tier: "service_tier" may be "auto" or "default".');
}

/**
 * The output-limit fields of a body, each an integer from 1 (the model's bound is checked once
 * the model is known): any integer is not enough, 1e308 is one, and would put Infinity into
 * the estimate. Returns the fields set, or the first bad one.
 */
export function outputLimits(body: Record<string, unknown>, names: readonly string[]): Array<[string, number]> | Checked {
  const limits: Array<[string, number]> = [];
  for (const name of names) {
    const value = body[name];
    if (value === undefined || value === null) continue;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) return bad(name, `"${name}" must be a positive integer.`);
    limits.push([name, value]);
  }
  return limits;
}

/**
 * The largest of the output limits set, or null: the one to reserve by. A provider may honour
 * any of them (OpenAI refuses two, vLLM takes `max_completion_tokens`, Ollama only
 * `max_tokens`), so `{"max_completion_tokens": 1, "max_tokens": 128000}` reserved 1 (found in
 * review).
 */
export function largestLimit(limits: ReadonlyArray<readonly [string, number]>): number | null {
  let largest: number | null = null;
  for (const [, value] of limits) if (largest === null || value > largest) largest = value;
  return largest;
}

// --- the mock's writing ------------------------------------------------------------------------

export function sendJson(ex: Exchange, value: unknown): void {
  const body = JSON.stringify(value);
  ex.head(200, 'application/json', ['content-length', String(Buffer.byteLength(body))]);
  ex.end(body);
}

/** An SSE event with a name (Anthropic's and the Responses API's style). */
export function sseEvent(type: string, data: unknown): string {
  return `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
}

/** One piece per token (4 characters). */
export function pieces(text: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < text.length; i += 4) out.push(text.slice(i, i + 4));
  return out;
}

/**
 * Writes pieces at `tokensPerSecond` (0: as fast as the client reads), waiting for the client
 * whenever its socket buffer is full, so a slow client never makes the gateway buffer.
 */
export function pump(ex: Exchange, parts: string[], tokensPerSecond: number, render: (piece: string) => string, done: () => void): void {
  const interval = tokensPerSecond > 0 ? 1000 / tokensPerSecond : 0;
  let i = 0;
  let timer: NodeJS.Timeout | null = null;
  const step = (): void => {
    timer = null;
    if (ex.aborted) return;
    while (i < parts.length) {
      const piece = parts[i++]!;
      ex.noteOutput(piece.length);
      const flowing = ex.write(render(piece));
      if (interval > 0 && i < parts.length) {
        if (flowing) timer = setTimeout(step, interval);
        else ex.whenDrained(() => { timer = setTimeout(step, interval); });
        return;
      }
      if (!flowing) {
        ex.whenDrained(step);
        return;
      }
    }
    done();
  };
  ex.onAbort(() => {
    if (timer !== null) clearTimeout(timer);
  });
  step();
}

/** The last user message's text, cut to the answer's budget (4 characters a token): what the mock says. */
export function echo(text: string, budgetTokens: number): { text: string; truncated: boolean } {
  const limit = budgetTokens * 4;
  return text.length > limit ? { text: text.slice(0, limit), truncated: true } : { text, truncated: false };
}

// --- chat and messages bodies ------------------------------------------------------------------

/** Characters of all message text of a chat or messages body, the system prompt included (the mock's input count). */
export function messagesChars(body: Record<string, unknown>): number {
  let n = partsText(body.system).length;
  if (Array.isArray(body.messages)) {
    for (const m of body.messages) if (isObj(m)) n += partsText(m.content).length;
  }
  return n;
}

/** The text of the last user message of a chat or messages body ('' when there is none). */
export function lastUserText(body: Record<string, unknown>): string {
  const messages = body.messages;
  if (!Array.isArray(messages)) return '';
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as unknown;
    if (isObj(m) && m.role === 'user') return partsText(m.content);
  }
  return '';
}

/** `messages`: a non-empty array of objects with a role. Null when it is. */
export function checkMessages(body: Record<string, unknown>): Checked | null {
  if (!Array.isArray(body.messages) || body.messages.length === 0) return bad('messages', '"messages" is required and must be a non-empty array.');
  for (let i = 0; i < body.messages.length; i++) {
    const m = body.messages[i] as unknown;
    if (!isObj(m) || typeof m.role !== 'string') return bad(`messages[${i}]`, `"messages[${i}]" must be an object with a "role".`);
  }
  return null;
}

/**
 * A copy of the client's body with the upstream model, for protocols that change more. Copied
 * whole, then `model` assigned: `{ ...body, model }` would define `model` again through V8's
 * slow path on every call.
 */
export function withModel(ex: Exchange): Record<string, unknown> {
  const body = { ...ex.body };
  body.model = ex.model.upstreamModel;
  return body;
}

/** The client's body as JSON with the upstream model: spliced into the text as received when it can be. */
export function modelSwapped(ex: Exchange): string {
  return replaceTopLevel(ex.text, 'model', JSON.stringify(ex.model.upstreamModel)) ?? JSON.stringify(withModel(ex));
}
