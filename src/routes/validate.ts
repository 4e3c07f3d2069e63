import type { Endpoint } from '../providers/types.js';

/** A request body that passed the endpoint's checks. */
export interface CallRequest {
  body: Record<string, unknown>;
  model: string;
  stream: boolean;
  /** The output limit the client set (max_tokens, max_completion_tokens), or null. */
  maxTokens: number | null;
  /** The fields that set an output limit, with their values (each is checked against the model). */
  limits: Array<[string, number]>;
  /** Chat's `n`: how many answers the provider generates (each up to the output limit). */
  choices: number;
}

export type Checked = { ok: true; call: CallRequest } | { ok: false; message: string; param: string };

const bad = (param: string, message: string): Checked => ({ ok: false, param, message });

/** The most answers one chat call may ask for (OpenAI's own bound on `n`). */
export const MAX_CHOICES = 128;

const OUTPUT_FIELDS: Record<Endpoint, readonly string[]> = {
  chat: ['max_completion_tokens', 'max_tokens'],
  messages: ['max_tokens'],
  embeddings: [],
};

/**
 * The gateway checks only what it needs (model, messages or input, stream, the output
 * budget); everything else is the provider's to judge and passes through untouched. The
 * output limits are checked against the model's own bound by `checkOutputLimits`, once the
 * model is known.
 */
export function checkCall(endpoint: Endpoint, body: unknown): Checked {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return bad('', 'The request body must be a JSON object.');
  const b = body as Record<string, unknown>;
  if (typeof b.model !== 'string' || b.model === '') return bad('model', '"model" is required and must be a non-empty string.');
  if (b.stream !== undefined && b.stream !== null && typeof b.stream !== 'boolean') return bad('stream', '"stream" must be true or false.');
  let maxTokens: number | null = null;
  const limits: Array<[string, number]> = [];
  let choices = 1;

  if (endpoint === 'embeddings') {
    const input = b.input;
    const valid = (typeof input === 'string' && input !== '') || (Array.isArray(input) && input.length > 0);
    if (!valid) return bad('input', '"input" is required: a non-empty string or array.');
    if (b.stream === true) return bad('stream', 'Embeddings cannot be streamed.');
  } else {
    if (!Array.isArray(b.messages) || b.messages.length === 0) {
      return bad('messages', '"messages" is required and must be a non-empty array.');
    }
    for (let i = 0; i < b.messages.length; i++) {
      const m = b.messages[i] as unknown;
      if (m === null || typeof m !== 'object' || typeof (m as { role?: unknown }).role !== 'string') {
        return bad(`messages[${i}]`, `"messages[${i}]" must be an object with a "role".`);
      }
    }
    for (const name of OUTPUT_FIELDS[endpoint]) {
      const value = b[name];
      if (value === undefined || value === null) continue;
      // Any integer is not enough: 1e308 is one, and would put Infinity into the estimate.
      if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
        return bad(name, `"${name}" must be a positive integer.`);
      }
      limits.push([name, value]);
      maxTokens ??= value;
    }
    if (endpoint === 'chat' && b.n !== undefined && b.n !== null) {
      if (typeof b.n !== 'number' || !Number.isInteger(b.n) || b.n < 1 || b.n > MAX_CHOICES) {
        return bad('n', `"n" must be an integer from 1 to ${MAX_CHOICES}.`);
      }
      choices = b.n;
    }
    if (b.stream_options !== undefined && b.stream_options !== null &&
        (typeof b.stream_options !== 'object' || Array.isArray(b.stream_options))) {
      return bad('stream_options', '"stream_options" must be an object.');
    }
  }
  return { ok: true, call: { body: b, model: b.model, stream: b.stream === true, maxTokens, limits, choices } };
}

/** Each output limit the client set is at most the model's `outputTokenLimit`; null when they are. */
export function checkOutputLimits(call: CallRequest, outputTokenLimit: number): { message: string; param: string } | null {
  for (const [name, value] of call.limits) {
    if (value > outputTokenLimit) {
      return { param: name, message: `"${name}" must be an integer from 1 to ${outputTokenLimit} for this model.` };
    }
  }
  return null;
}
