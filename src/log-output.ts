import { write, writeSync } from 'node:fs';

/** A function that takes finished log text, synchronously (tests and embedders); the default writes to stdout. */
export type Sink = (text: string) => void;

/** Lines wait about this long before they are written (more while an earlier batch is still being written). */
const BATCH_MS = 10;
/**
 * A batch this large is written at once rather than at the end of its wait. To a descriptor:
 * each write is a thread-pool hand-off that costs the event loop 35-80 µs whatever its size, so
 * fewer, larger writes (at 100,000 lines a second, 256 KiB a write took ~0.26 µs a line less
 * than 64 KiB). To a sink, as text: 64 KiB, below the size V8 gives a string of its own heap
 * space (larger made each line dearer).
 */
const BATCH_BYTES_FD = 262_144;
const BATCH_BYTES_SINK = 65_536;
/** How soon a write is tried again when the descriptor is non-blocking and full (EAGAIN). */
const RETRY_MS = 5;

/**
 * Log lines on their way out: a bounded buffer of bytes, written in batches. To a file
 * descriptor the writes go through libuv's thread pool (`fs.write`), one batch at a time, so
 * a slow reader (a full pipe, a stalled disk) never blocks the event loop: while one batch is
 * being written the next fills the other buffer, and once that is full new lines are dropped
 * and counted. A request never waits for its log line.
 */
export class LogOutput {
  /** Lines lost: dropped because the buffer was full, or in a write that failed. */
  dropped = 0;
  /** Batches handed to the descriptor (or the sink). */
  batches = 0;
  private filling: Buffer;
  private used = 0;
  /** The other buffer: written out now, or idle. */
  private spare: Buffer;
  private writing = false;
  /** A flush gave up waiting on the write now under way: later flushes do not wait for it again. */
  private stuck = false;
  private scheduled = false;
  /** A write failed after part of a line went out: the next write starts with a newline, so that line is not glued to the next. */
  private torn = false;
  private waiting: (() => void)[] = [];
  private readonly batchBytes: number;

  constructor(private readonly target: number | Sink, capacityBytes: number) {
    // allocUnsafe: pages are touched only as lines fill them, so an idle log costs no memory.
    this.filling = Buffer.allocUnsafe(capacityBytes);
    this.spare = Buffer.allocUnsafe(capacityBytes);
    this.batchBytes = typeof target === 'function' ? BATCH_BYTES_SINK : BATCH_BYTES_FD;
  }

  /** Buffers one line (without its newline); drops it, counted, when there is no room. */
  line(text: string): void {
    const room = this.filling.length - this.used - 1;
    // A UTF-8 character takes at most 3 bytes per UTF-16 unit; count exactly only near the end.
    if (text.length * 3 > room && Buffer.byteLength(text) > room) {
      this.dropped++;
      return;
    }
    this.used += this.filling.write(text, this.used);
    this.filling[this.used++] = 10;
    this.lineAdded();
  }

  /**
   * For a line its writer encodes itself (the access log): the buffer to write at most `max`
   * bytes into, from `offset`, then `commit`; or null when they may not fit (the line is
   * dropped, counted).
   */
  reserve(max: number): Buffer | null {
    if (max > this.filling.length - this.used) {
      this.dropped++;
      return null;
    }
    return this.filling;
  }

  /** Where a reserved line starts. */
  get offset(): number {
    return this.used;
  }

  /** Ends the reserved line at `end` (just after its newline). */
  commit(end: number): void {
    this.used = end;
    this.lineAdded();
  }

  private lineAdded(): void {
    if (this.used >= this.batchBytes) this.send();
    else this.sendSoon();
  }

  /** Sends the batch when its wait is over, unless it fills first. */
  private sendSoon(): void {
    if (this.scheduled) return;
    // A short timer, not setImmediate: under load one write carries many event-loop turns.
    this.scheduled = true;
    setTimeout(this.sendLater, BATCH_MS);
  }

  /** Whether a batch is being written now. */
  get busy(): boolean {
    return this.writing;
  }

  /** Bytes free for lines now. */
  room(): number {
    return this.filling.length - this.used;
  }

  /** Resolves once everything buffered so far has been written (or lost), or after `timeoutMs`. */
  flush(timeoutMs = 5000): Promise<void> {
    this.send();
    if ((!this.writing && this.used === 0) || this.stuck) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      // Not unref'd: a drain waits for it (at most timeoutMs), even with nothing else to do.
      const timer = setTimeout(() => {
        this.stuck = this.writing;
        // Given up on: no longer waiting, so later writes go back to waiting for full batches.
        const at = this.waiting.indexOf(done);
        if (at !== -1) this.waiting.splice(at, 1);
        resolve();
      }, timeoutMs);
      this.waiting.push(done);
    });
  }

  /**
   * Writes what is buffered now, synchronously: for the moment before the process exits. Not
   * while a batch is still being written by the thread pool: that write may be stuck on a
   * reader that stopped (a blocking descriptor: a file on a stalled disk, a pipe not made
   * non-blocking), it cannot be waited for, and a second write could interleave with it on a
   * pipe; those lines are counted as dropped (at most about one batch's wait of them). A
   * non-blocking descriptor that stays full is given up on after a short while, the same way.
   */
  flushSync(): void {
    if (this.used === 0 && !this.torn) return;
    const text = this.filling.subarray(0, this.used);
    this.used = 0;
    if (typeof this.target === 'function') return this.target(text.toString('utf8'));
    if (this.writing) {
      this.dropped += countLines(text, 0);
      return;
    }
    const first = this.torn ? 1 : 0;
    const out = first === 1 ? Buffer.concat([NEWLINE, text]) : text;
    let off = 0;
    const giveUp = Date.now() + 200;
    while (off < out.length) {
      try {
        off += writeSync(this.target, out, off);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() > giveUp) return this.lost(out, off, first);
      }
    }
    this.torn = false;
  }

  /**
   * A write of `buffer` (its own lines from `first`: after a newline that ends a line cut
   * before) failed at `off`: the lines from there on are lost, counted; if it stopped inside a
   * line, the output is left torn.
   */
  private lost(buffer: Buffer, off: number, first: number): void {
    this.dropped += countLines(buffer, Math.max(off, first));
    if (off > 0) this.torn = buffer[off - 1] !== 10;
  }

  private readonly sendLater = (): void => {
    this.scheduled = false;
    this.send();
  };

  /** Hands the filled buffer to the writer unless a write is under way (its end sends the rest). */
  private send(): void {
    if (this.writing || this.used === 0) return this.settleIfIdle();
    const full = this.filling;
    const length = this.used;
    this.filling = this.spare;
    this.spare = full;
    this.used = 0;
    this.batches++;
    if (typeof this.target === 'function') {
      this.target(full.toString('utf8', 0, length));
      return this.settleIfIdle();
    }
    this.writing = true;
    if (!this.torn) return this.writeFrom(this.target, full, 0, length, 0);
    // The line a failed write cut first gets its end, on its own (a rare path: a copy is fine).
    this.writeFrom(this.target, Buffer.concat([NEWLINE, full.subarray(0, length)]), 0, length + 1, 1);
  }

  /** Writes buffer[off, end) (its own lines from `first`, see lost). */
  private writeFrom(fd: number, buffer: Buffer, off: number, end: number, first: number): void {
    write(fd, buffer, off, end - off, null, (err, written) => {
      if (err !== null) {
        if (err.code === 'EAGAIN') {
          setTimeout(() => this.writeFrom(fd, buffer, off, end, first), RETRY_MS).unref();
          return;
        }
        this.lost(buffer.subarray(0, end), off, first); // a closed pipe, a full disk: lose the batch, not the process
      } else if (off + written < end) {
        return this.writeFrom(fd, buffer, off + written, end, first);
      } else {
        this.torn = false;
      }
      this.writing = false;
      this.stuck = false;
      // What came in meanwhile waits for its batch to fill or its time to pass, like any other
      // batch: sent at once, it would make under load one write (a thread-pool hand-off, ~30 µs
      // of the event loop's time) per few lines. A flush that waits is served at once.
      if (this.used >= this.batchBytes || this.waiting.length > 0) this.send();
      else if (this.used > 0) this.sendSoon();
      else this.settleIfIdle();
    });
  }

  private settleIfIdle(): void {
    if (this.writing || this.used > 0 || this.waiting.length === 0) return;
    const waiting = this.waiting;
    this.waiting = [];
    for (const resolve of waiting) resolve();
  }
}

const NEWLINE = Buffer.from('\n');

/** Lines (newlines) in buffer from `off` on. */
function countLines(buffer: Buffer, off: number): number {
  let n = 0;
  for (let i = buffer.indexOf(10, off); i !== -1; i = buffer.indexOf(10, i + 1)) n++;
  return n;
}
