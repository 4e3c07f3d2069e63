import type { Endpoint } from '../providers/types.js';

/** A request body that passed the endpoint's checks. */
export interface CallRequest {
  body: Record<string, unknown>;
  model: string;
  stream: boolean;
  /** max_tokens (or max_completion_tokens) when the client set it. */
  maxTokens: number | null;
}

export type Checked = { ok: true; call: CallRequest } | { ok: false; message: string; param: string };

const bad = (param: string, message: string): Checked => ({ ok: false, param, message });

function positiveInt(value: unknown): boolean {
  return typeof value === 'number' && Number.isInteger(value) && value > 0;
}

/**
 * The gateway checks only what it needs (model, messages or input, stream, the output
 * budget); everything else is the provider's to judge and passes through untouched.
 */
export function checkCall(endpoint: Endpoint, body: unknown): Checked {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return bad('', 'The request body must be a JSON object.');
  const b = body as Record<string, unknown>;
  if (typeof b.model !== 'string' || b.model === '') return bad('model', '"model" is required and must be a non-empty string.');
  if (b.stream !== undefined && b.stream !== null && typeof b.stream !== 'boolean') return bad('stream', '"stream" must be true or false.');
  let maxTokens: number | null = null;

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
    for (const name of endpoint === 'chat' ? ['max_completion_tokens', 'max_tokens'] : ['max_tokens']) {
      const value = b[name];
      if (value === undefined || value === null) continue;
      if (!positiveInt(value)) return bad(name, `"${name}" must be a positive integer.`);
      maxTokens ??= value as number;
    }
    if (b.stream_options !== undefined && b.stream_options !== null &&
        (typeof b.stream_options !== 'object' || Array.isArray(b.stream_options))) {
      return bad('stream_options', '"stream_options" must be an object.');
    }
  }
  return { ok: true, call: { body: b, model: b.model, stream: b.stream === true, maxTokens } };
}
