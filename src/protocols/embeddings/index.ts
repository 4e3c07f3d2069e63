import { hash } from 'node:crypto';
import type { Usage } from '../../money.js';
import { bad, checkBasics, isObj, modelSwapped, sendJson, tokensOf } from '../common.js';
import { chatUsage } from '../chat/index.js';
import type { WireProtocol } from '../types.js';

/** OpenAI Embeddings: POST /v1/embeddings, never streamed, no output tokens. */

/** The most dimensions a request may ask for (OpenAI's largest model has 3,072; the mock builds the vector). */
const MAX_DIMENSIONS = 16_384;
/** The most inputs one request may embed (OpenAI's own limit). */
const MAX_INPUTS = 2048;
/**
 * The most numbers the mock builds for one answer (inputs x dimensions): about 1 MB of JSON and
 * a few milliseconds (found in review: at 1,000,000, a 300-byte request took 127 ms of the event
 * loop and a 9 MB answer).
 */
const MAX_MOCK_NUMBERS = 100_000;

/**
 * The mock's input tokens, as the estimate counts them: 1 per 4 characters of text, 1 per
 * token id (found in review: ids were free, though reserved).
 */
function inputTokens(input: unknown): number {
  if (typeof input === 'string') return tokensOf(input.length);
  let chars = 0;
  let ids = 0;
  if (Array.isArray(input)) {
    for (const item of input) {
      if (typeof item === 'string') chars += item.length;
      else if (typeof item === 'number') ids++;
      else if (Array.isArray(item)) ids += item.length;
    }
  }
  return tokensOf(chars) + ids;
}

/** A vector as the API writes it with `encoding_format: "base64"`: its float32s, little-endian, in base64. */
function base64Of(vector: number[]): string {
  return Buffer.from(new Float32Array(vector).buffer).toString('base64');
}

/** A deterministic unit vector from the text's hash: same text, same embedding. */
function vectorOf(text: string, dimensions: number): number[] {
  const digest = Buffer.from(hash('sha256', text, 'hex'), 'hex');
  const v: number[] = [];
  let norm = 0;
  for (let i = 0; i < dimensions; i++) {
    const x = digest[i % digest.length]! / 127.5 - 1;
    v.push(x);
    norm += x * x;
  }
  norm = Math.sqrt(norm) || 1;
  return v.map((x) => Math.round((x / norm) * 1e6) / 1e6);
}

export const embeddings: WireProtocol = {
  endpoint: 'embeddings',
  path: '/v1/embeddings',
  anthropic: false,

  check(body) {
    const basic = checkBasics(body);
    if (basic !== null) return basic;
    const b = body as Record<string, unknown>;
    const input = b.input;
    const valid = (typeof input === 'string' && input !== '') || (Array.isArray(input) && input.length > 0);
    if (!valid) return bad('input', '"input" is required: a non-empty string or array.');
    if (Array.isArray(input) && input.length > MAX_INPUTS) return bad('input', `"input" may hold at most ${MAX_INPUTS} items.`);
    if (b.stream === true) return bad('stream', 'Embeddings cannot be streamed.');
    if (b.dimensions !== undefined && (typeof b.dimensions !== 'number' || !Number.isInteger(b.dimensions) || b.dimensions < 1 || b.dimensions > MAX_DIMENSIONS)) {
      return bad('dimensions', `"dimensions" must be an integer from 1 to ${MAX_DIMENSIONS}.`);
    }
    return { ok: true, call: { body: b, model: b.model as string, stream: false, maxTokens: null, limits: [], choices: 1 } };
  },

  outputBudget: () => 0,

  upstreamBody: modelSwapped,

  usage(json) {
    const usage = isObj(json) ? chatUsage(json.usage, false) : null;
    // An embedding generates nothing: a provider's completion_tokens here are no output to bill
    // (found in review: 1e9 of them were charged at the model's output price).
    if (usage !== null) {
      usage.outputTokens = 0;
      usage.audioOutputTokens = 0;
    }
    return usage;
  },

  outputChars: () => 0,

  watch: () => ({ see: () => ({ forward: true, final: false }), usage: () => null }), // never streamed

  mock(ex) {
    const input = ex.body.input;
    const texts = Array.isArray(input) ? input.map((s) => (typeof s === 'string' ? s : JSON.stringify(s))) : [String(input)];
    const dimensions = typeof ex.body.dimensions === 'number' ? ex.body.dimensions : 8;
    if (texts.length * dimensions > MAX_MOCK_NUMBERS) {
      ex.noteDelivered(false); // refused before any work: free
      return ex.fail('invalid_request', {
        message: `The mock provider builds at most ${MAX_MOCK_NUMBERS} numbers per answer (inputs x dimensions).`, fields: { param: 'dimensions' },
      });
    }
    const usage: Usage = { inputTokens: inputTokens(input), outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };
    // The official SDK asks for base64 and decodes it (found in review: it got [0, 0]).
    const base64 = ex.body.encoding_format === 'base64';
    ex.settle(usage, () => sendJson(ex, {
      object: 'list', model: ex.model.upstreamModel,
      data: texts.map((text, index) => {
        const vector = vectorOf(text, dimensions);
        return { object: 'embedding', index, embedding: base64 ? base64Of(vector) : vector };
      }),
      usage: { prompt_tokens: usage.inputTokens, total_tokens: usage.inputTokens },
    }));
  },
};
