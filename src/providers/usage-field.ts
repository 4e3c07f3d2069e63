/**
 * The top-level `usage` object of a provider's JSON answer, found in its bytes without
 * decoding or parsing the whole answer (the completion's text is most of it, and can be
 * large). Returns undefined when it is not found this way; the caller then parses the whole
 * answer.
 *
 * Why it is exact for a JSON answer: inside a JSON string every `"` is escaped, so `"usage"`
 * preceded by `{` or `,` and followed by `:` is a key, not text. That key is top-level when what
 * follows its value closes exactly one object, which is checked (the tail after `usage` is
 * short in OpenAI's and Anthropic's answers). A few occurrences are tried from the end; when
 * none is the top-level key, the whole answer is parsed. Scanning UTF-8 bytes is safe: every
 * byte of a multi-byte character is above 0x7f, so none looks like a quote or a bracket.
 */
export function usageField(answer: Buffer): unknown {
  let at = answer.length;
  // A few candidates from the end: the word can also be text, or a nested key.
  for (let tries = 0; tries < 4; tries++) {
    if (at === 0) return undefined;
    at = answer.lastIndexOf(USAGE_KEY, at - 1);
    if (at <= 0) return undefined;
    const found = usageAt(answer, at);
    if (found !== undefined) return found;
  }
  return undefined;
}

const USAGE_KEY = Buffer.from('"usage"');
/**
 * The most bytes scanned for a usage object, and for what follows it: a real one and its tail
 * are a few hundred bytes (found in review: a provider's 60 MB usage object was parsed whole,
 * past the bound on parsed answers, blocking the event loop 22 s). Past them, the usage is not
 * found this way, and the answer's own bound applies.
 */
const MAX_USAGE_BYTES = 256 * 1024;

/** The usage object whose key starts at `at`, if that is a top-level key with an object value. */
function usageAt(bytes: Buffer, at: number): unknown {
  let i = at - 1;
  while (i > 0 && isSpace(bytes[i]!)) i--;
  const before = bytes[i];
  if (before !== 0x2c && before !== 0x7b) return undefined; // , or {
  let start = skipSpace(bytes, at + USAGE_KEY.length);
  if (bytes[start] !== 0x3a) return undefined; // :
  start = skipSpace(bytes, start + 1);
  if (bytes[start] !== 0x7b) return undefined; // the value is an object
  const end = closeOf(bytes, start, 0, start + MAX_USAGE_BYTES);
  if (end === -1 || bytes.length - end > MAX_USAGE_BYTES) return undefined;
  if (closeOf(bytes, end + 1, 1, bytes.length) !== bytes.length - 1 - trailingSpace(bytes)) return undefined;
  try {
    return JSON.parse(bytes.toString('utf8', start, end + 1));
  } catch {
    return undefined;
  }
}

/**
 * Scanning from `from` with `depth` objects or arrays already open, the index of the bracket
 * that closes them all before `until`, or -1. Strings are skipped, escapes included.
 */
function closeOf(bytes: Buffer, from: number, depth: number, until: number): number {
  const n = Math.min(bytes.length, until);
  for (let k = from; k < n; k++) {
    const c = bytes[k]!;
    if (c === 0x22) {
      for (k++; k < n; k++) {
        const d = bytes[k]!;
        if (d === 0x5c) k++;
        else if (d === 0x22) break;
      }
    } else if (c === 0x7b || c === 0x5b) {
      depth++;
    } else if ((c === 0x7d || c === 0x5d) && --depth === 0) {
      return k;
    }
  }
  return -1;
}

function trailingSpace(bytes: Buffer): number {
  let n = 0;
  while (n < bytes.length && isSpace(bytes[bytes.length - 1 - n]!)) n++;
  return n;
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

function skipSpace(bytes: Buffer, i: number): number {
  while (i < bytes.length && isSpace(bytes[i]!)) i++;
  return i;
}
