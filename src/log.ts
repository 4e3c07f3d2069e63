export type Level = 'debug' | 'info' | 'warn' | 'error';
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

  /** The access log line, built by hand: this runs for every request. */
  access(requestId: string, method: string, path: string, status: number, ms: number, accountId: string | null): void {
    if (RANK.info < this.min) return;
    this.push(
      `{"time":"${new Date().toISOString()}","level":"info","msg":"request","request_id":"${requestId}","method":${JSON.stringify(method)},"path":${JSON.stringify(path)},"status":${status},"ms":${Math.round(ms * 1000) / 1000},"account_id":${accountId === null ? 'null' : JSON.stringify(accountId)}}`,
    );
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
      this.scheduled = true;
      setImmediate(this.drain);
    }
  }

  private readonly drain = (): void => {
    this.scheduled = false;
    this.flush();
  };
}
