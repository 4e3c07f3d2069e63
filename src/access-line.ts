import type { LogOutput } from './log-output.js';

/** JSON string literal; the common case (no quote, backslash or control character) without JSON.stringify. */
export function quote(text: string): string {
  return SAFE.test(text) ? `"${text}"` : JSON.stringify(text);
}
const SAFE = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

const utf8 = (text: string): Uint8Array => Buffer.from(text, 'utf8');
/** The longest the status and `,"ms":` with its digits take: numbers up to 2^53. */
const NUMBERS_MAX = 46;
/** Method-and-path parts kept, at most (paths come from clients: the cache is bounded). */
const MIDDLES_MAX = 256;

interface Middle {
  method: string;
  /** `","method":…,"path":…,"status":` */
  bytes: Uint8Array;
}

/**
 * The access log line, encoded by hand straight into the log's buffer: it is written for every
 * request, and building it as a string then encoding it cost three times as much. The parts
 * that repeat from line to line (the time, within a millisecond; method and path; account) are
 * kept as bytes and copied; the request id and the numbers are written byte by byte. The
 * request id is checked as it is copied: one that would need escaping (the request-id check
 * allows none) makes the line go the slow way, through JSON.stringify, as does a line with
 * `dropped` (rare). The time is the caller's performance.now() on the wall clock, which is
 * read again every second: cheaper than Date.now() per line, and as exact to the millisecond.
 */
export class AccessLines {
  private headMs = -1;
  /** `{"time":"…","level":"info","msg":"request","request_id":"` for the millisecond `headMs`. */
  private head: Uint8Array = new Uint8Array(0);
  private second = -1;
  /** `YYYY-MM-DDTHH:MM:SS.` of `second`: the date is formatted once a second. */
  private secondText = '';
  /** Date.now() - performance.now(), read again once `wallAt` has passed (performance.now() does not follow clock changes). */
  private wallOffset = 0;
  private wallAt = -Infinity;
  private readonly middles = new Map<string, Middle>();
  private account: string | null = null;
  /** `,"account_id":…}` and the newline, for `account`. */
  private accountPart: Uint8Array = utf8(',"account_id":null}\n');

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
    let middle = this.middles.get(path);
    if (middle === undefined || middle.method !== method) middle = this.setMiddle(method, path);
    if (accountId !== this.account) this.setAccount(accountId);
    const max = this.head.length + requestId.length + middle.bytes.length + NUMBERS_MAX + this.accountPart.length;
    const out = this.output;
    const buf = out.reserve(max);
    if (buf === null) return;
    let o = out.offset;
    buf.set(this.head, o);
    o += this.head.length;
    for (let i = 0; i < requestId.length; i++) {
      const c = requestId.charCodeAt(i);
      if (c < 0x20 || c > 0x7e || c === 0x22 || c === 0x5c) return this.slowLine(nowMs, requestId, method, path, status, us, accountId, null);
      buf[o++] = c;
    }
    buf.set(middle.bytes, o);
    o = digits(buf, o + middle.bytes.length, status);
    buf[o] = 0x2c; // ,"ms":
    buf[o + 1] = 0x22;
    buf[o + 2] = 0x6d;
    buf[o + 3] = 0x73;
    buf[o + 4] = 0x22;
    buf[o + 5] = 0x3a;
    const whole = Math.floor(us / 1000);
    const frac = us - whole * 1000;
    o = digits(buf, o + 6, whole);
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

  private setMiddle(method: string, path: string): Middle {
    if (this.middles.size >= MIDDLES_MAX) this.middles.clear();
    const middle = { method, bytes: utf8(`","method":${quote(method)},"path":${quote(path)},"status":`) };
    this.middles.set(path, middle);
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
