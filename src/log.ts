export type Level = 'debug' | 'info' | 'warn' | 'error';

/** The longest a log line waits in the buffer. */
const FLUSH_MS = 10;

/** JSON string literal; the common case (no quote, backslash or control character) without JSON.stringify. */
function quote(text: string): string {
  return SAFE.test(text) ? `"${text}"` : JSON.stringify(text);
}
const SAFE = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;
const RANK: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/** Where finished lines go; the default is stdout (file descriptor 1). */
export type Sink = (text: string) => void;

// stdout writes to files and pipes are synchronous on Linux, so a flush at exit is not lost.
const stdoutSink: Sink = (text) => {
  process.stdout.write(text);
};

/**
 * JSON lines, buffered: lines written in one event-loop turn leave in one write, so a
 * request costs a string concatenation, not a syscall. Never logs keys, hashes or bodies:
 * callers pass only ids and numbers.
 */
export class Logger {
  private buffer = '';
  private scheduled = false;
  private readonly min: number;

  constructor(private readonly sink: Sink = stdoutSink, level: Level = 'info') {
    this.min = RANK[level];
  }

  log(level: Level, msg: string, fields: Record<string, unknown> = {}): void {
    if (RANK[level] < this.min) return;
    this.push(JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields }));
  }

  info(msg: string, fields?: Record<string, unknown>): void { this.log('info', msg, fields); }
  warn(msg: string, fields?: Record<string, unknown>): void { this.log('warn', msg, fields); }
  error(msg: string, fields?: Record<string, unknown>): void { this.log('error', msg, fields); }

  /**
   * The access log line, built by hand: this runs for every request, so the timestamp text is
   * reused within a millisecond, `ms` is formatted from integer microseconds, and strings are
   * JSON-escaped only when they need it. Request ids and account ids are restricted to safe
   * characters by the config and the request-id check.
   */
  access(requestId: string, method: string, path: string, status: number, ms: number, accountId: string | null, dropped: string | null = null): void {
    if (RANK.info < this.min) return;
    const us = Math.round(ms * 1000);
    const whole = Math.floor(us / 1000);
    const frac = us - whole * 1000;
    this.push(
      `{"time":"${this.isoNow()}","level":"info","msg":"request","request_id":"${requestId}","method":${quote(method)},"path":${this.quotePath(path)},"status":${status},"ms":${whole}.${frac < 10 ? '00' : frac < 100 ? '0' : ''}${frac},"account_id":${accountId === null ? 'null' : `"${accountId}"`}${dropped === null ? '' : `,"dropped":${quote(dropped)}`}}`,
    );
  }

  private lastPath = '';
  private lastPathQuoted = '""';

  /** quote(path), remembered for the last path: under load most requests go to the same one. */
  private quotePath(path: string): string {
    if (path !== this.lastPath) {
      this.lastPath = path;
      this.lastPathQuoted = quote(path);
    }
    return this.lastPathQuoted;
  }

  private lastMs = 0;
  private lastIso = '';
  private lastSecond = -1;
  /** `YYYY-MM-DDTHH:MM:SS.` of lastSecond: the date is formatted once a second, not once a millisecond. */
  private secondPrefix = '';

  private isoNow(): string {
    const now = Date.now();
    if (now !== this.lastMs) {
      this.lastMs = now;
      const ms = now % 1000;
      if (now - ms !== this.lastSecond) {
        this.lastSecond = now - ms;
        this.secondPrefix = new Date(this.lastSecond).toISOString().slice(0, 20);
      }
      this.lastIso = `${this.secondPrefix}${ms < 10 ? '00' : ms < 100 ? '0' : ''}${ms}Z`;
    }
    return this.lastIso;
  }

  /** Writes out whatever is buffered, synchronously (at exit). */
  flush(): void {
    if (this.buffer === '') return;
    const text = this.buffer;
    this.buffer = '';
    this.sink(text);
  }

  private push(line: string): void {
    this.buffer += line + '\n';
    if (this.buffer.length > 65_536) this.flush();
    else if (!this.scheduled) {
      // A short timer, not setImmediate: under load one write carries many event-loop turns.
      this.scheduled = true;
      setTimeout(this.drain, FLUSH_MS);
    }
  }

  private readonly drain = (): void => {
    this.scheduled = false;
    this.flush();
  };
}
