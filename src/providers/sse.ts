import { isUtf8 } from 'node:buffer';
import { StringDecoder } from 'node:string_decoder';

/** An event (or the text before its end) grew past the splitter's bound. */
export class EventTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`a stream event over ${limit} characters`);
    this.name = 'EventTooLarge';
  }
}

/**
 * Splits a server-sent-events byte stream into whole events (each ending in a blank line),
 * so a relay can look at an event before passing it on. Multi-byte characters split across
 * chunks are kept whole; CR LF and CR line ends are normalised to LF, also when a CR LF pair
 * is split across two chunks. Each chunk's text is scanned once (text held from earlier
 * chunks is not scanned again, and is joined once, when its event ends), and an event may
 * not grow past `maxEventChars`: a provider that streams one endless line is cut, not buffered.
 */
export class SseSplitter {
  /**
   * The chunk last pushed is, byte for byte, the events it gave (valid UTF-8 after a chunk that
   * was too, no CR in it or just before it, nothing held from before it, nothing left after
   * it): a relay that passes all of them on unchanged may send the chunk itself, not encode
   * their text again (a provider usually writes whole events).
   */
  whole = false;
  private readonly decoder = new StringDecoder('utf8');
  /** The decoder holds no part of a character: the chunk before was valid UTF-8 (or there was none). */
  private decoderEmpty = true;
  /** Text of an event not yet ended, in the pieces it arrived in (the small ones joined: see push). */
  private held: string[] = [];
  /** Pieces of `held` from this index on have not been joined yet. */
  private joinedUpTo = 0;
  private heldChars = 0;
  /** The held text ends with "\n" (an event may end at the start of the next chunk). */
  private heldEndsInLf = false;
  /** The last chunk ended with "\r": a "\n" starting the next one belongs to it. */
  private pendingCr = false;

  constructor(readonly maxEventChars = Infinity) {}

  /** The complete events in `chunk` (plus what was held), each with its trailing "\n\n". Throws EventTooLarge. */
  push(chunk: Buffer): string[] {
    this.whole = false;
    if (chunk.length === 0) return NONE;
    // Valid UTF-8 decodes to text that encodes back to the same bytes, and leaves nothing in the decoder.
    const valid = isUtf8(chunk);
    const clean = valid && this.decoderEmpty && this.heldChars === 0 && !this.pendingCr;
    this.decoderEmpty = valid;
    let text = this.decoder.write(chunk);
    if (text === '') return NONE;
    if (this.pendingCr && text.charCodeAt(0) === 10) text = text.slice(1);
    this.pendingCr = text.charCodeAt(text.length - 1) === 13;
    const hasCr = text.includes('\r');
    if (hasCr) text = text.replace(/\r\n?/g, '\n');
    let events: string[] = NONE;
    let start = 0;
    if (this.heldChars > 0 && this.heldEndsInLf && text.charCodeAt(0) === 10) {
      events = [this.take('\n')];
      start = 1;
    }
    for (let end = text.indexOf('\n\n', start); end !== -1; end = text.indexOf('\n\n', start)) {
      const piece = text.slice(start, end + 2);
      if (events === NONE) events = [];
      events.push(this.heldChars > 0 ? this.take(piece) : piece);
      start = end + 2;
    }
    if (start < text.length) {
      this.held.push(start === 0 ? text : text.slice(start));
      // Every 64 pieces are joined into one, each character once: an event sent a byte or two
      // an HTTP chunk held ~16 bytes of heap a character, 17 times the bound (found in review).
      if (this.held.length - this.joinedUpTo >= 64) {
        this.held.push(this.held.splice(this.joinedUpTo).join(''));
        this.joinedUpTo = this.held.length;
      }
      this.heldChars += text.length - start;
      this.heldEndsInLf = text.charCodeAt(text.length - 1) === 10;
      if (this.heldChars > this.maxEventChars) throw new EventTooLarge(this.maxEventChars);
    } else this.whole = clean && !hasCr;
    return events;
  }

  /** Whatever is left when the stream ends (an event without its blank line), or ''. */
  rest(): string {
    const rest = this.held.join('') + this.decoder.end();
    this.held = [];
    this.joinedUpTo = 0;
    this.heldChars = 0;
    return rest.trim() === '' ? '' : `${rest.replace(/\n*$/, '')}\n\n`;
  }

  /** The held text and `tail`, joined: one copy per event, however many chunks it spanned. */
  private take(tail: string): string {
    const event = this.held.length === 1 ? this.held[0]! + tail : this.held.join('') + tail;
    this.held = [];
    this.joinedUpTo = 0;
    this.heldChars = 0;
    this.heldEndsInLf = false;
    return event;
  }
}

const NONE: string[] = [];

/**
 * The `event:` name of an event, or null when it has none. Cheap: it reads the name line only,
 * so a watcher can pass over the events it has no use for without parsing their data.
 */
export function eventName(event: string): string | null {
  let at: number;
  if (event.startsWith('event:')) at = 6;
  else {
    at = event.indexOf('\nevent:');
    if (at < 0) return null;
    at += 7;
  }
  if (event.charCodeAt(at) === 32) at++;
  const end = event.indexOf('\n', at);
  return end < 0 ? event.slice(at) : event.slice(at, end);
}

const TYPE_FIRST = '{"type":"';

/**
 * Whether an event's data starts with `{"type":"<name>"`, the way OpenAI writes every event:
 * only then may a watcher skip it by its `event:` name. A name is the server's word, and a
 * client goes by the data's `type` (found in review: text deltas labelled
 * `response.in_progress` were relayed unmetered). Cheap: no copy, no scan. (A second `type`
 * key later in the data, which JSON.parse would take, is not looked for: only a provider out
 * to deceive writes one, and finding it would mean reading the whole event.)
 */
export function dataTypeIs(event: string, name: string): boolean {
  let at = 0;
  if (!event.startsWith('data:')) {
    at = event.indexOf('\ndata:') + 1;
    if (at === 0) return false;
  }
  at += event.charCodeAt(at + 5) === 32 ? 6 : 5;
  return event.startsWith(TYPE_FIRST, at) && event.startsWith(name, at + TYPE_FIRST.length) &&
    event.charCodeAt(at + TYPE_FIRST.length + name.length) === 34;
}

/** The `data:` payload of an event (multi-line data joined with "\n"), or null when it has none. */
export function eventData(event: string): string | null {
  // Line by line with indexOf, not split: every event of a stream comes here (the metering
  // watcher's reading), and split allocates an array and every line.
  let data: string | null = null;
  for (let start = 0; start <= event.length;) {
    let end = event.indexOf('\n', start);
    if (end === -1) end = event.length;
    if (event.startsWith('data:', start)) {
      const value = event.slice(event.charCodeAt(start + 5) === 32 ? start + 6 : start + 5, end);
      data = data === null ? value : `${data}\n${value}`;
    }
    start = end + 1;
  }
  return data;
}

/** Parses handed on and not yet taken, at most (beyond it they are dropped and parsed again). */
const MAX_PENDING = 256;
/**
 * Characters of data whose readings are kept at most, together: a translation that stopped
 * taking them (its answer is over, the provider's stream is not) must not make a call hold
 * every event it is sent. A larger event's reading is not kept: it is parsed again if taken.
 */
const MAX_KEPT_CHARS = 256 * 1024;

/**
 * One call's event data, read once for two readers: the stream's metering watcher reads each
 * event (`parse`), and a translation that reads the same events next, in the same order, takes
 * that reading (`take`) instead of reading again. Only readings not yet taken are kept, by this
 * call alone; data that does not match what was read is read again. `read` is JSON.parse, or a
 * protocol's faster reader of its most common events. A value may be read by both: never change it.
 * A reading is found by `key`: the data, or the whole event it came from, which both readers are
 * handed as the same string, so that the match costs no comparison of its text.
 */
export class ParsedEvents {
  // Readings are kept in keys/values[0, count); those before `next` were taken or passed over.
  // Cleared by resetting the counts, not the arrays' lengths: a relay reads one event, the
  // translation takes it, so this clears once per event, and setting an array's length is a
  // call into V8's runtime.
  private readonly keys: string[] = [];
  private readonly values: unknown[] = [];
  private count = 0;
  private next = 0;
  private chars = 0;

  /** `read(data)` (throws as it does), kept for `take`. */
  parse(data: string, read: (data: string) => unknown = JSON.parse, key = data): unknown {
    const value = read(data);
    if (data.length > MAX_KEPT_CHARS) return value;
    if (this.count >= MAX_PENDING || this.chars + data.length > MAX_KEPT_CHARS) this.clear();
    this.keys[this.count] = key;
    this.values[this.count] = value;
    this.count++;
    this.chars += data.length;
    return value;
  }

  /** The reading `parse` made of `data` (kept under `key`), or a new one with `read` (throws as it does). */
  take(data: string, read: (data: string) => unknown = JSON.parse, key = data): unknown {
    const kept = this.taken(key);
    return kept !== undefined ? kept : read(data);
  }

  /** The reading kept under `key`, or undefined (no reader makes undefined of any data). */
  taken(key: string): unknown {
    while (this.next < this.count) {
      const i = this.next++;
      if (this.keys[i] === key) {
        const value = this.values[i];
        if (this.next === this.count) this.clear();
        return value;
      }
    }
    this.clear();
    return undefined;
  }

  private clear(): void {
    // The slots are emptied, so the readings dropped can be collected (usually one slot).
    for (let i = 0; i < this.count; i++) {
      this.keys[i] = '';
      this.values[i] = undefined;
    }
    this.count = 0;
    this.next = 0;
    this.chars = 0;
  }
}
