import { MAX_TOKENS } from '../money.js';

/**
 * The gateway's estimate of what a request bills as input, before the provider says: it
 * sizes the reservation at admission, and the charge of a call that ends without the
 * provider's final usage. It counts everything the providers bill as input, not only the
 * last message: every key and value under the request's input fields (system prompt,
 * messages with their tool calls and tool results, tool definitions, response formats,
 * Responses `input` and `instructions`), 4 characters to a token, and a fixed number of
 * tokens per image and per document, file or audio part (their base64 bytes say little about
 * what they cost).
 */

/** An image: about what Anthropic bills for a 1.15-megapixel image, above OpenAI's high-detail tiles. */
export const IMAGE_TOKENS = 1_600;
/** A document, file or audio part (one PDF page is 1,500 to 3,000 tokens at Anthropic). */
export const DOCUMENT_TOKENS = 3_000;
/** Deeper JSON than this is refused: nothing real nests so deep, and deep enough JSON overflows the stack of whatever recurses over it. */
export const MAX_DEPTH = 128;

const INPUT_FIELDS = new Set(['system', 'messages', 'tools', 'functions', 'tool_choice', 'response_format', 'input', 'instructions', 'text']);
const IMAGE_TYPES = new Set(['image', 'image_url', 'input_image']);
const DOCUMENT_TYPES = new Set(['document', 'file', 'input_file', 'input_audio', 'audio']);

/** Input tokens a request body is estimated to bill (at most MAX_TOKENS), or null when it nests deeper than MAX_DEPTH. */
export function estimateInputTokens(body: Record<string, unknown>): number | null {
  let chars = 0;
  let media = 0;
  // An explicit stack, not recursion. Each entry is a value and (depth * 2 + 1 if it counts).
  const values: unknown[] = [];
  const marks: number[] = [];
  for (const key of Object.keys(body)) {
    values.push(body[key]);
    marks.push(INPUT_FIELDS.has(key) ? 3 : 2);
  }
  while (values.length > 0) {
    const value = values.pop();
    const mark = marks.pop()!;
    let counts = (mark & 1) === 1;
    const depth = mark >> 1;
    if (typeof value === 'string') {
      if (counts) chars += value.length;
      continue;
    }
    if (value === null || typeof value !== 'object') {
      if (counts && value !== undefined) chars += 4; // a number or a boolean: one token (embeddings take token ids)
      continue;
    }
    if (depth >= MAX_DEPTH) return null;
    const next = (depth + 1) * 2;
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        values.push(value[i]);
        marks.push(next + (counts ? 1 : 0));
      }
      continue;
    }
    const o = value as Record<string, unknown>;
    if (counts && typeof o.type === 'string') {
      if (IMAGE_TYPES.has(o.type)) {
        media += IMAGE_TOKENS;
        counts = false; // its bytes are not text; still walked for depth
      } else if (DOCUMENT_TYPES.has(o.type) && !textSource(o.source)) {
        media += DOCUMENT_TOKENS;
        counts = false;
      }
    }
    for (const key of Object.keys(o)) {
      if (counts) chars += key.length;
      values.push(o[key]);
      marks.push(next + (counts ? 1 : 0));
    }
  }
  return Math.min(MAX_TOKENS, Math.ceil(chars / 4) + media);
}

/** An Anthropic document whose source is plain text (or content blocks): counted as its text. */
function textSource(source: unknown): boolean {
  if (source === null || typeof source !== 'object') return false;
  const type = (source as { type?: unknown }).type;
  return type === 'text' || type === 'content';
}
