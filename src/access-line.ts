import type { LogOutput } from './log-output.js';

/** JSON string literal; the common case (no quote, backslash or control character) without JSON.stringify. */
function quote(text: string): string {
  return SAFE.test(text) ? `"${text}"` : JSON.stringify(text);
}
const SAFE = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

const utf8 = (text: string): Buffer => Buffer.from(text, 'utf8');
/** The longest the digits of `ms` take (up to 2^53 µs). */
const MS_MAX = 24;
/** Paths whose parts are kept, at most (paths come from clients: the cache is bounded). */
const PATHS_MAX = 256;
/** Parts kept per path (one per method and status seen on it), at most. */
const PER_PATH_MAX = 8;
/** Longer paths are not kept: the cache stays small in bytes too (a client's 16 KB paths, escaped, would be 32 KB each). */
const PATH_KEPT_MAX = 512;

interface Middle {
  method: string;
  status: number;
  /** `","method":…,"path":…,"status":…,"ms":` */
  bytes: Buffer;
}

/**
 * The most of a path a line shows: the rest is cut, and its length said (found in review: a
 * client's 16 KB path of quotes made a 32 KB line, with no limit on how many).
 */
const PATH_LOGGED_MAX = 1024;

function middleOf(method: string, path: string, status: number): Middle {
  const shown = path.length <= PATH_LOGGED_MAX ? path : `${path.slice(0, PATH_LOGGED_MAX)}...(${path.length} characters)`;
  return { method, status, bytes: utf8(`","method":${quote(method)},"path":${quote(shown)},"status":${status},"ms":`) };
}

/** Buffer's own one-byte string copy (what buf.write(s, o, 'latin1') calls; a third cheaper direct). */
interface Latin1Writable {
  latin1Write(text: string, offset: number): number;
}

/**
 * The access log line, encoded straight into the log's buffer: it is written for every request.
 * The parts that repeat from line to line (the time, within a millisecond; method, path and
 * status; account) are kept as bytes and copied (a typed-array copy costs ~150 instructions);
 * the request id is copied as one-byte text, unchecked (the request-id check in
 * src/http/context.ts allows only [A-Za-z0-9._:-]{1,128}, nothing that needs escaping: checking
 * again with a regular expression would cost ~950 instructions) and `ms`'s digits are stored
 * one by one. Measured (bench/log-line.ts, at 100,000 lines a second): 0.65-0.83 µs a line
 * written to a file, where a string per line encoded into the buffer took about twice as much
 * to buffer, and a string per batch (encoded when written) 1.56 µs (those two variants of this
 * class were measured with the same script and not kept). A line with `dropped`
 * (rare) goes the slow way, through JSON.stringify. The time is the caller's
 * performance.now() on the wall clock, which is read again every second: cheaper than
 * Date.now() per line, and as exact to the millisecond.
 */
export class AccessLines {
  private headMs = -1;
  /** `{"time":"…","level":"info","msg":"request","request_id":"` for the millisecond `headMs`. */
  private head: Buffer = utf8('');
  private second = -1;
  /** `YYYY-MM-DDTHH:MM:SS.` of `second`: the date is formatted once a second. */
  private secondText = '';
  /** Date.now() - performance.now(), read again once `wallAt` has passed (performance.now() does not follow clock changes). */
  private wallOffset = 0;
  private wallAt = -Infinity;
  private readonly middles = new Map<string, Middle[]>();
  private account: string | null = null;
  /** `,"account_id":…}` and the newline, for `account`. */
  private accountPart: Buffer = utf8(',"account_id":null}\n');

  constructor(private readonly output: LogOutput, private readonly slow: (line: string) => void) {}

  /** One line; `perfNow` is performance.now() at the end of the request, `us` its duration. */
  write(perfNow: number, requestId: string, method: string, path: string, status: number, us: number, accountId: string | null, dropped: string | null): void {
    if (perfNow >= this.wallAt) {
      this.wallOffset = Date.now() - perfNow;
      this.wallAt = perfNow + 1000;
    }
    const nowMs = Math.floor(perfNow + this.wallOffset);
    if (dropped !== null) return this.slowLine(nowMs, requestId, method, path, status, us, accountId, dropped);
    if (nowMs !== this.headMs) this.setHead(nowMs);
    const middle = this.middle(method, path, status);
    if (accountId !== this.account) this.setAccount(accountId);
    const max = this.head.length + requestId.length + middle.length + MS_MAX + this.accountPart.length;
    const out = this.output;
    const buf = out.reserve(max);
    if (buf === null) return;
    let o = out.offset;
    buf.set(this.head, o);
    o += this.head.length;
    o += (buf as unknown as Latin1Writable).latin1Write(requestId, o);
    buf.set(middle, o);
    o += middle.length;
    const whole = Math.floor(us / 1000);
    const frac = us - whole * 1000;
    o = digits(buf, o, whole);
    buf[o] = 0x2e; // .
    buf[o + 1] = 0x30 + Math.floor(frac / 100);
    buf[o + 2] = 0x30 + (Math.floor(frac / 10) % 10);
    buf[o + 3] = 0x30 + (frac % 10);
    o += 4;
    buf.set(this.accountPart, o);
    out.commit(o + this.accountPart.length);
  }

  /** The same line through JSON.stringify, for values the fast path does not copy as they are. */
  private slowLine(nowMs: number, requestId: string, method: string, path: string, status: number, us: number, accountId: string | null, dropped: string | null): void {
    this.slow(JSON.stringify({
      time: this.isoTime(nowMs), level: 'info', msg: 'request', request_id: requestId, method, path, status, ms: us / 1000,
      account_id: accountId, ...(dropped === null ? {} : { dropped }),
    }));
  }

  private setHead(nowMs: number): void {
    this.headMs = nowMs;
    this.head = utf8(`{"time":"${this.isoTime(nowMs)}","level":"info","msg":"request","request_id":"`);
  }

  private isoTime(nowMs: number): string {
    const ms = nowMs % 1000;
    if (nowMs - ms !== this.second) {
      this.second = nowMs - ms;
      this.secondText = new Date(this.second).toISOString().slice(0, 20);
    }
    return `${this.secondText}${ms < 10 ? '00' : ms < 100 ? '0' : ''}${ms}Z`;
  }

  private lastMiddle: Middle = { method: '', status: 0, bytes: utf8('') };
  private lastPath = '';

  /** The bytes from the end of the request id to `ms`'s digits, kept per path, method and status. */
  private middle(method: string, path: string, status: number): Buffer {
    // Under load most lines repeat the last one's: comparing is cheaper than hashing the path.
    const last = this.lastMiddle;
    if (path === this.lastPath && status === last.status && method === last.method) return last.bytes;
    const found = this.findMiddle(method, path, status);
    this.lastPath = path;
    this.lastMiddle = found;
    return found.bytes;
  }

  private findMiddle(method: string, path: string, status: number): Middle {
    if (path.length > PATH_KEPT_MAX) return middleOf(method, path, status);
    let kept = this.middles.get(path);
    if (kept !== undefined) {
      for (let i = 0; i < kept.length; i++) {
        const m = kept[i]!;
        if (m.status === status && m.method === method) return m;
      }
      if (kept.length >= PER_PATH_MAX) kept.length = 0;
    } else {
      if (this.middles.size >= PATHS_MAX) this.middles.clear();
      kept = [];
      this.middles.set(path, kept);
    }
    const middle = middleOf(method, path, status);
    kept.push(middle);
    return middle;
  }

  private setAccount(accountId: string | null): void {
    this.account = accountId;
    this.accountPart = utf8(`,"account_id":${accountId === null ? 'null' : quote(accountId)}}\n`);
  }
}

/** Writes the decimal digits of a non-negative integer; returns the offset after them. */
function digits(buf: Buffer, o: number, n: number): number {
  if (n < 10) {
    buf[o] = 0x30 + n;
    return o + 1;
  }
  let length = 1;
  for (let p = 10; p <= n; p *= 10) length++;
  for (let i = o + length - 1; i >= o; i--) {
    const q = Math.floor(n / 10);
    buf[i] = 0x30 + (n - q * 10);
    n = q;
  }
  return o + length;
}
