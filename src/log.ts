import { AccessLines } from './access-line.js';
import { LogOutput, type Sink } from './log-output.js';

export type { Sink } from './log-output.js';
export type Level = 'debug' | 'info' | 'warn' | 'error';

/** The default bound on log text waiting to be written (see LogOutput). */
export const LOG_BUFFER_BYTES = 4_194_304;

const RANK: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface LoggerOptions {
  /** The bound on text waiting to be written, in bytes; lines beyond it are dropped and counted. */
  bufferBytes?: number;
}

/**
 * JSON lines to stdout (or another descriptor, or a Sink), through a bounded buffer written off
 * the event loop (LogOutput): a line costs a few copies into the buffer, never a syscall or a
 * wait. Never logs keys,
 * hashes or bodies: callers pass only ids and numbers.
 */
export class Logger {
  private readonly output: LogOutput;
  private readonly accessLines: AccessLines;
  private readonly min: number;
  /** `dropped` when it was last reported in a line of its own. */
  private reportedDropped = 0;

  /** `to`: a file descriptor (default 1, stdout) or a function taking the text. */
  constructor(to: number | Sink = 1, level: Level = 'info', options: LoggerOptions = {}) {
    this.min = RANK[level];
    this.output = new LogOutput(to, options.bufferBytes ?? LOG_BUFFER_BYTES);
    this.accessLines = new AccessLines(this.output, (line) => this.push(line));
  }

  /** Lines lost so far (mg_log_dropped_total): the buffer was full, or a write failed. */
  get dropped(): number {
    return this.output.dropped;
  }

  log(level: Level, msg: string, fields: Record<string, unknown> = {}): void {
    if (RANK[level] < this.min) return;
    this.push(JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields }));
  }

  info(msg: string, fields?: Record<string, unknown>): void { this.log('info', msg, fields); }
  warn(msg: string, fields?: Record<string, unknown>): void { this.log('warn', msg, fields); }
  error(msg: string, fields?: Record<string, unknown>): void { this.log('error', msg, fields); }

  /**
   * The access log line (src/access-line.ts encodes it): this runs for every request. The
   * request id must be as src/http/context.ts makes or accepts them ([A-Za-z0-9._:-]{1,128}): it
   * is copied unescaped. `ms` is the duration; `endPerfMs` the performance.now() it ended at, if
   * the caller has it.
   */
  access(
    requestId: string, method: string, path: string, status: number, ms: number, accountId: string | null,
    dropped: string | null = null, endPerfMs?: number,
  ): void {
    if (RANK.info < this.min) return;
    if (this.output.dropped !== this.reportedDropped) this.reportDroppedIfRoom();
    this.accessLines.write(endPerfMs ?? performance.now(), requestId, method, path, status, Math.round(ms * 1000), accountId, dropped);
  }

  /**
   * Resolves once every line logged so far has been written (each wait at most `timeoutMs`):
   * for the drain. A report of lines dropped, if any, goes last.
   */
  async flush(timeoutMs?: number): Promise<void> {
    await this.output.flush(timeoutMs);
    if (this.reportDropped()) await this.output.flush(timeoutMs);
  }

  /** Writes what is buffered, synchronously: for the moment before the process exits. */
  flushSync(): void {
    this.output.flushSync();
    if (this.reportDropped()) this.output.flushSync();
  }

  private push(line: string): void {
    if (this.output.dropped !== this.reportedDropped) this.reportDroppedIfRoom();
    this.output.line(line);
  }

  /** Lines were lost and there is room again: say so once, before the next line. */
  private reportDroppedIfRoom(): void {
    if (this.output.room() > 1024) this.reportDropped();
  }

  /** One warning line for the lines dropped since the last such line, if it fits now. */
  private reportDropped(): boolean {
    const dropped = this.output.dropped;
    if (dropped === this.reportedDropped) return false;
    const line = JSON.stringify({
      time: new Date().toISOString(), level: 'warn', msg: 'log lines dropped: the log reader did not keep up',
      dropped: dropped - this.reportedDropped, dropped_total: dropped,
    });
    if (Buffer.byteLength(line) >= this.output.room()) return false;
    this.output.line(line);
    this.reportedDropped = dropped;
    return true;
  }
}
