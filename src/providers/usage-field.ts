/**
 * The top-level `usage` object of a provider's JSON answer, found without parsing the whole
 * answer (the completion's text is most of it, and can be large). Returns undefined when it is
 * not found this way; the caller then parses the whole answer.
 *
 * Why it is exact for a JSON answer: inside a JSON string every `"` is escaped, so `"usage"`
 * preceded by `{` or `,` and followed by `:` is a key, not text. That key is top-level when what
 * follows its value closes exactly one object, which is checked (the tail after `usage` is
 * short in OpenAI's and Anthropic's answers). A few occurrences are tried from the end; when
 * none is the top-level key, the whole answer is parsed.
 */
export function usageField(text: string): unknown {
  let at = text.length;
  // A few candidates from the end: the word can also be text, or a nested key.
  for (let tries = 0; tries < 4; tries++) {
    at = text.lastIndexOf('"usage"', at - 1);
    if (at <= 0) return undefined;
    const found = usageAt(text, at);
    if (found !== undefined) return found;
  }
  return undefined;
}

/** The usage object whose key starts at `at`, if that is a top-level key with an object value. */
function usageAt(text: string, at: number): unknown {
  let i = at - 1;
  while (i > 0 && isSpace(text.charCodeAt(i))) i--;
  const before = text.charCodeAt(i);
  if (before !== 0x2c && before !== 0x7b) return undefined; // , or {
  let start = skipSpace(text, at + 7);
  if (text.charCodeAt(start) !== 0x3a) return undefined; // :
  start = skipSpace(text, start + 1);
  if (text.charCodeAt(start) !== 0x7b) return undefined; // the value is an object
  const end = closeOf(text, start, 0);
  if (end === -1 || closeOf(text, end + 1, 1) !== text.length - 1 - trailingSpace(text)) return undefined;
  try {
    return JSON.parse(text.slice(start, end + 1));
  } catch {
    return undefined;
  }
}

/**
 * Scanning from `from` with `depth` objects or arrays already open, the index of the bracket
 * that closes them all, or -1. Strings are skipped, escapes included.
 */
function closeOf(text: string, from: number, depth: number): number {
  for (let k = from; k < text.length; k++) {
    const c = text.charCodeAt(k);
    if (c === 0x22) {
      for (k++; k < text.length; k++) {
        const d = text.charCodeAt(k);
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

function trailingSpace(text: string): number {
  let n = 0;
  while (n < text.length && isSpace(text.charCodeAt(text.length - 1 - n))) n++;
  return n;
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

function skipSpace(text: string, i: number): number {
  while (i < text.length && isSpace(text.charCodeAt(i))) i++;
  return i;
}
