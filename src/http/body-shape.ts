import { MAX_DEPTH } from '../billing/estimate.js';

/**
 * A look at a large request body's structure before it is parsed. JSON.parse costs far more
 * per byte for many small objects and arrays than for text: 4 MB of nested brackets took over
 * half a second, and ran before any limit could refuse the key (found in review: a key out of
 * requests still stalled the event loop for everyone). A body past these bounds, which no real
 * request comes near, is refused unparsed, for a few milliseconds of scanning.
 */

/** Smaller bodies are parsed as they are: the worst of them costs a few milliseconds. */
const SCANNED_FROM_BYTES = 64 * 1024;
/** Objects and arrays in one body, at most. */
export const MAX_CONTAINERS = 100_000;
/** Keys of objects in one body, at most (a key costs the parser more than a value). */
export const MAX_KEYS = 50_000;
/**
 * Values in arrays and objects (commas) in one body, at most: above an embeddings request's
 * token ids (OpenAI takes 300,000 a request). 4 MB of small numbers parse in some 60 ms.
 */
export const MAX_VALUES = 500_000;

/** Why a body must not be parsed (its message), or null. A body that is not JSON passes: the parser says so. */
export function bodyShapeProblem(body: Buffer): string | null {
  if (body.length < SCANNED_FROM_BYTES) return null;
  let depth = 0;
  let containers = 0;
  let keys = 0;
  let values = 0;
  const n = body.length;
  for (let i = 0; i < n; i++) {
    const c = body[i]!;
    if (c === 0x22) {
      // A string: to its closing quote, found natively (text is most of a real body).
      let j = i;
      for (;;) {
        j = body.indexOf(0x22, j + 1);
        if (j === -1) return null;
        let k = j - 1;
        while (body[k] === 0x5c) k--;
        if ((j - 1 - k) % 2 === 0) break; // not escaped
      }
      i = j;
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > MAX_DEPTH) return `The request body nests deeper than ${MAX_DEPTH} levels.`;
      if (++containers > MAX_CONTAINERS) return `The request body holds more than ${MAX_CONTAINERS} objects and arrays.`;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    } else if (c === 0x2c) {
      if (++values > MAX_VALUES) return `The request body holds more than ${MAX_VALUES} values.`;
    } else if (c === 0x3a && ++keys > MAX_KEYS) {
      return `The request body holds more than ${MAX_KEYS} keys.`;
    }
  }
  return null;
}
