/**
 * Rewriting one top-level field of a JSON body without re-serialising the rest. A model call
 * usually needs only its `model` swapped for the upstream one, and an agent's body is tens of
 * kilobytes (instructions, tools, the whole history): JSON.stringify of the parsed copy costs
 * as much as the parse did, while the body's top level is a few dozen characters to scan
 * (strings are skipped with indexOf, nested values by counting their brackets).
 *
 * The text must already have parsed as a JSON object. Anything unusual makes the splice
 * decline (null), and the caller serialises as before: a key written with escapes, or any
 * top-level key present twice (JSON.parse keeps the last, a provider's parser may keep the
 * first, so the client could otherwise steer which model the provider runs, or send it an
 * output limit or messages other than those checked and reserved for).
 */

const QUOTE = 34;
const BACKSLASH = 92;
const OPEN_BRACE = 123;
const CLOSE_BRACE = 125;
const OPEN_BRACKET = 91;
const CLOSE_BRACKET = 93;
const COMMA = 44;
const COLON = 58;

function isSpace(c: number): boolean {
  return c === 32 || c === 10 || c === 13 || c === 9;
}

function skipSpace(text: string, i: number): number {
  while (isSpace(text.charCodeAt(i))) i++;
  return i;
}

/** The index just after the string that opens at `i` (a quote), or -1. */
function stringEnd(text: string, i: number): number {
  for (let from = i + 1; ;) {
    const q = text.indexOf('"', from);
    if (q < 0) return -1;
    let b = q - 1;
    while (text.charCodeAt(b) === BACKSLASH) b--;
    if ((q - 1 - b) % 2 === 0) return q + 1; // an even run of backslashes: the quote is not escaped
    from = q + 1;
  }
}

/** The index just after the value that starts at `i`, or -1. */
function valueEnd(text: string, i: number): number {
  const c = text.charCodeAt(i);
  if (c === QUOTE) return stringEnd(text, i);
  if (c === OPEN_BRACE || c === OPEN_BRACKET) {
    let depth = 0;
    for (let j = i; j < text.length; j++) {
      const d = text.charCodeAt(j);
      if (d === QUOTE) {
        j = stringEnd(text, j) - 1;
        if (j < 0) return -1;
      } else if (d === OPEN_BRACE || d === OPEN_BRACKET) depth++;
      else if ((d === CLOSE_BRACE || d === CLOSE_BRACKET) && --depth === 0) return j + 1;
    }
    return -1;
  }
  // A number, true, false or null: up to the next separator.
  let j = i;
  while (j < text.length) {
    const d = text.charCodeAt(j);
    if (d === COMMA || d === CLOSE_BRACE || isSpace(d)) break;
    j++;
  }
  return j === i ? -1 : j;
}

/**
 * `text` with the value of its top-level `key` replaced by `json` (already serialised), or null
 * when the key is not written there exactly once, plainly, or another top-level key is written
 * twice.
 */
export function replaceTopLevel(text: string, key: string, json: string): string | null {
  const quoted = `"${key}"`;
  keyCount = 0;
  let i = skipSpace(text, 0);
  if (text.charCodeAt(i) !== OPEN_BRACE) return null;
  i = skipSpace(text, i + 1);
  let start = -1;
  let end = -1;
  if (text.charCodeAt(i) === CLOSE_BRACE) return null;
  for (;;) {
    if (text.charCodeAt(i) !== QUOTE) return null;
    const keyEnd = stringEnd(text, i);
    if (keyEnd < 0) return null;
    // A key with an escape might spell `key` some other way: decline rather than decode.
    for (let k = i + 1; k < keyEnd - 1; k++) if (text.charCodeAt(k) === BACKSLASH) return null;
    const isKey = keyEnd - i === quoted.length && text.startsWith(quoted, i);
    if (!isKey) {
      // A real body has a few dozen short top-level keys: a linear search of where they are
      // written costs less than a Set of copies, and a body with more, or longer ones, is
      // serialised instead (so no body makes the search costly: 63 keys of 61 KB alike but for
      // their last characters took a second, found in review).
      if (keyCount === MAX_KEYS || keyEnd - i > MAX_KEY_CHARS || seenBefore(text, i, keyEnd)) return null;
      keys[2 * keyCount] = i;
      keys[2 * keyCount + 1] = keyEnd;
      keyCount++;
    }
    i = skipSpace(text, keyEnd);
    if (text.charCodeAt(i) !== COLON) return null;
    i = skipSpace(text, i + 1);
    const after = valueEnd(text, i);
    if (after < 0) return null;
    if (isKey) {
      if (start >= 0) return null; // twice
      start = i;
      end = after;
    }
    i = skipSpace(text, after);
    const c = text.charCodeAt(i);
    if (c === CLOSE_BRACE) break;
    if (c !== COMMA) return null;
    i = skipSpace(text, i + 1);
  }
  if (start < 0) return null;
  return text.slice(0, start) + json + text.slice(end);
}

/**
 * Where the top-level keys seen so far by replaceTopLevel are written: start and end (quotes
 * included) of each, in pairs, `keyCount` of them (it runs synchronously, one body at a time;
 * the array is reused, not emptied: setting an array's length is a call into V8's runtime).
 */
const keys: number[] = [];
let keyCount = 0;
const MAX_KEYS = 64;
/**
 * The longest top-level key the splice compares (64 characters, quotes included): the API's
 * longest is 21; a longer one makes the body serialised (63 keys of 256 alike but for their ends
 * still took 2.7 ms, found in review, where serialising takes some 30 µs).
 */
const MAX_KEY_CHARS = 66;

/** Whether the key written at text[start, end) was written before, the same way. */
function seenBefore(text: string, start: number, end: number): boolean {
  const length = end - start;
  for (let k = 0; k < 2 * keyCount; k += 2) {
    const at = keys[k]!;
    if (keys[k + 1]! - at !== length) continue;
    let j = 1; // the quotes match
    while (j < length - 1 && text.charCodeAt(at + j) === text.charCodeAt(start + j)) j++;
    if (j === length - 1) return true;
  }
  return false;
}

/**
 * `text` (a JSON object) with `"key": json` added as its first member. Only for a key the
 * parsed object does not have, in any spelling: then there is no copy for a parser to prefer.
 */
export function prependTopLevel(text: string, key: string, json: string): string {
  const open = skipSpace(text, 0);
  const next = skipSpace(text, open + 1);
  const member = `${JSON.stringify(key)}:${json}`;
  return `${text.slice(0, open + 1)}${member}${text.charCodeAt(next) === CLOSE_BRACE ? '' : ','}${text.slice(open + 1)}`;
}
