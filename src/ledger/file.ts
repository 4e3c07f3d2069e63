import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, statSync, truncateSync, writeSync } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { LedgerBook } from './book.js';
import { nodeJournalFs, type JournalFs, type JournalHandle } from './journal-fs.js';
import { DirLock } from './lock.js';
import { decodeRecord, encodeRecord } from './record.js';
import type { AccountTotals, GroupBy, HistoryPage, Ledger, LedgerEntry, UsageRow } from './types.js';

export interface FileLedgerOptions {
  /** A segment is sealed (indexed, snapshotted) once it reaches this size. */
  maxSegmentBytes?: number;
  logger?: Logger;
  /** The file operations of the writer (tests inject faults: a full disk, short writes). */
  fs?: JournalFs;
  /** How often a failed ledger checks whether the disk takes writes again. */
  retryMs?: number;
}

/** Raised when the journal is damaged anywhere but its last record: never a silent loss. */
export class LedgerCorruptError extends Error {
  constructor(readonly file: string, readonly offset: number, why: string) {
    super(`ledger journal ${file} is damaged at byte ${offset}: ${why}. Refusing to start; restore the file or move it aside.`);
    this.name = 'LedgerCorruptError';
  }
}

const SEGMENT = /^journal-(\d{8})\.log$/;
const segmentName = (seq: number) => `journal-${String(seq).padStart(8, '0')}.log`;
const indexName = (seq: number) => `journal-${String(seq).padStart(8, '0')}.idx`;

/** account -> flat [offset, length, offset, length, ...] of its billing entries in one segment. */
type SegmentIndex = Map<string, number[]>;

interface Pending {
  line: string;
  entry: LedgerEntry;
  resolve: () => void;
  reject: (err: Error) => void;
}

/** The same as JournalFs.writeAtomic, for recovery at start (which runs before anything else). */
function atomicWriteSync(path: string, text: string): void {
  const tmp = `${path}.tmp`;
  const fd = openSync(tmp, 'w');
  try {
    writeSync(fd, text);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
  const dir = openSync(join(path, '..'), 'r');
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}

/**
 * An append-only journal in segments. Appends wait for group commit: everything appended
 * while one write+fsync runs goes out in the next one, so many requests share an fsync and
 * the event loop never waits on the disk. Sealed segments get an index (per account, for
 * billing history) and a snapshot of the aggregates, so a restart replays only the open
 * segment, however long the history.
 */
export class FileLedger implements Ledger {
  private readonly maxSegmentBytes: number;
  private readonly logger: Logger | undefined;
  private book = new LedgerBook();
  private seq = 0;
  private handle: JournalHandle | null = null;
  private readonly fs: JournalFs;
  private readonly retryMs: number;
  private retryTimer: NodeJS.Timeout | null = null;
  private size = 0;
  private activeIndex: SegmentIndex = new Map();
  private readonly sealedIndexes = new Map<number, SegmentIndex>();
  private pending: Pending[] = [];
  private writing = false;
  private failure: Error | null = null;
  private closing: Promise<void> | null = null;
  /** Group commits done and records they carried (for tests and the bench). */
  readonly stats = { commits: 0, records: 0 };

  private constructor(readonly dir: string, options: FileLedgerOptions, private readonly lock: DirLock) {
    this.maxSegmentBytes = options.maxSegmentBytes ?? 16 * 1024 * 1024;
    this.logger = options.logger;
    this.fs = options.fs ?? nodeJournalFs;
    this.retryMs = options.retryMs ?? 1000;
  }

  /** Opens (creating) the journal in `dir` and recovers its state. Throws LedgerCorruptError on damage. */
  /**
   * Opens (creating) the journal in `dir`, locked to this instance (LedgerLockedError when
   * another holds it), and recovers its state. Throws LedgerCorruptError on damage.
   */
  static async open(dir: string, options: FileLedgerOptions = {}): Promise<FileLedger> {
    const lock = DirLock.acquire(dir);
    const ledger = new FileLedger(dir, options, lock);
    try {
      await ledger.recover();
    } catch (err) {
      lock.release();
      throw err;
    }
    return ledger;
  }

  append(entry: LedgerEntry): Promise<void> {
    if (this.failure !== null) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => {
      this.pending.push({ line: encodeRecord(entry), entry, resolve, reject });
      if (!this.writing) {
        this.writing = true;
        // One turn of the event loop gathers the appends of every request finishing in it.
        setImmediate(() => void this.flush());
      }
    });
  }

  totals(): ReadonlyMap<string, AccountTotals> {
    return this.book.totals;
  }

  usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): UsageRow[] {
    return this.book.usage(accountId, startDay, endDay, groupBy);
  }

  creditByKey(accountId: string, idempotencyKey: string): LedgerEntry | undefined {
    return this.book.creditByKey(accountId, idempotencyKey);
  }

  recentCredits(): Iterable<LedgerEntry> {
    return this.book.recentCredits();
  }

  ready(): boolean {
    return this.failure === null && this.closing === null;
  }

  /**
   * Newest first. The cursor names the position (segment.offset) of the last entry returned,
   * so pages stay stable while new entries arrive. Only durable entries are listed.
   */
  async history(accountId: string, limit: number, after: string | null): Promise<HistoryPage> {
    let below = { seq: Infinity, offset: Infinity };
    if (after !== null) {
      const m = /^(\d+)\.(\d+)$/.exec(after);
      if (m === null) throw new GatewayError('invalid_request', { message: 'The cursor "after" is not valid.', fields: { param: 'after' } });
      below = { seq: Number(m[1]), offset: Number(m[2]) };
    }
    const found: Array<{ seq: number; offset: number; length: number }> = [];
    for (let seq = Math.min(this.seq, below.seq); seq >= 1 && found.length <= limit; seq--) {
      const index = seq === this.seq ? this.activeIndex : this.sealedIndex(seq);
      const positions = index.get(accountId);
      if (positions === undefined) continue;
      for (let i = positions.length - 2; i >= 0 && found.length <= limit; i -= 2) {
        const offset = positions[i]!;
        if (seq === below.seq && offset >= below.offset) continue;
        found.push({ seq, offset, length: positions[i + 1]! });
      }
    }
    const hasMore = found.length > limit;
    if (hasMore) found.length = limit;
    const entries = await this.readEntries(found);
    const last = found.at(-1);
    return { entries, hasMore, nextCursor: hasMore && last !== undefined ? `${last.seq}.${last.offset}` : null };
  }

  close(): Promise<void> {
    if (this.closing === null) {
      this.closing = (async () => {
        if (this.retryTimer !== null) clearTimeout(this.retryTimer);
        while (this.writing || this.pending.length > 0) await new Promise((r) => setTimeout(r, 1));
        await this.handle?.close().catch(() => {});
        this.handle = null;
        this.lock.release();
      })();
    }
    return this.closing;
  }

  /** Why the ledger refuses writes now, or null (for /readyz, logs and tests). */
  get failed(): Error | null {
    return this.failure;
  }

  // --- writing -------------------------------------------------------------------------------

  /**
   * Writes what was appended, a batch (group commit) at a time, until nothing is pending or a
   * write fails. Never throws: it runs detached, and a failure is a state (`failed`), not a crash.
   */
  private async flush(): Promise<void> {
    while (this.pending.length > 0 && this.failure === null) {
      const batch = this.pending;
      this.pending = [];
      let text = '';
      for (const p of batch) text += p.line;
      try {
        await this.writeAll(Buffer.from(text));
        await this.handle!.datasync();
      } catch (err) {
        await this.fail(err as Error, batch);
        break;
      }
      let offset = this.size;
      for (const p of batch) {
        const length = Buffer.byteLength(p.line);
        this.book.apply(p.entry);
        if (p.entry.type !== 'usage') addPosition(this.activeIndex, p.entry.accountId, offset, length);
        offset += length;
      }
      this.size = offset;
      this.stats.commits++;
      this.stats.records += batch.length;
      for (const p of batch) p.resolve();
      if (this.size >= this.maxSegmentBytes) {
        try {
          await this.seal();
        } catch (err) {
          // The batch is durable (it was acknowledged); only the next one waits for the seal.
          await this.fail(err as Error, []);
        }
      }
    }
    this.writing = false;
  }

  /** Writes all of `bytes` at the end of the segment: a short write is continued, not taken as done. */
  private async writeAll(bytes: Buffer): Promise<void> {
    let done = 0;
    while (done < bytes.length) {
      const n = await this.handle!.write(bytes, done, bytes.length - done);
      if (!(n > 0)) throw new Error(`no progress writing the journal (${done} of ${bytes.length} bytes written)`);
      done += n;
    }
  }

  /**
   * The disk refused: nothing more is acknowledged (the gateway turns not ready and refuses
   * model calls), the bytes of the failed batch are cut off the segment (so the journal ends
   * with the last acknowledged record, whatever is written next), and every `retryMs` the
   * ledger checks whether the disk takes writes again, and then resumes by itself.
   */
  private async fail(err: Error, batch: Pending[]): Promise<void> {
    this.failure = new Error(`ledger write failed: ${err.message}`);
    this.logger?.error('ledger write failed; refusing charges until the disk takes writes again', { error: err.message });
    for (const p of batch) p.reject(this.failure);
    for (const p of this.pending) p.reject(this.failure);
    this.pending = [];
    await this.handle?.truncate(this.size).catch(() => { /* tried again before resuming */ });
    this.scheduleRetry();
  }

  private scheduleRetry(): void {
    if (this.closing !== null || this.retryTimer !== null) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      void this.retry();
    }, this.retryMs);
    this.retryTimer.unref();
  }

  /** Resumes once the segment is back to its last acknowledged byte and the disk takes a probe write. */
  private async retry(): Promise<void> {
    if (this.closing !== null || this.failure === null || this.writing) return;
    this.writing = true; // no flush while the writer is being checked
    try {
      await this.handle!.truncate(this.size);
      await this.handle!.datasync();
      await this.fs.probe(this.dir);
      if (this.size >= this.maxSegmentBytes) await this.seal();
      this.failure = null;
      this.logger?.warn('ledger writes work again; charges are accepted');
    } catch {
      this.scheduleRetry();
    } finally {
      this.writing = false;
    }
  }

  /**
   * Seals the open segment: its index, then a snapshot of the aggregates, then a new segment;
   * the old segment's handle is closed only once the new one is open, so a seal that fails
   * half-way leaves the writer where it was (and is simply done again).
   */
  private async seal(): Promise<void> {
    const sealed = this.seq;
    await this.fs.writeAtomic(join(this.dir, indexName(sealed)), JSON.stringify([...this.activeIndex]));
    await this.fs.writeAtomic(join(this.dir, 'snapshot.json'), JSON.stringify({ version: 1, sealed, book: this.book.save() }));
    const next = await this.fs.openAppend(join(this.dir, segmentName(sealed + 1)));
    const old = this.handle!;
    this.sealedIndexes.set(sealed, this.activeIndex);
    this.handle = next;
    this.seq = sealed + 1;
    this.size = 0;
    this.activeIndex = new Map();
    this.trimIndexCache();
    await old.close().catch(() => { /* the segment is durable; its descriptor is what is lost */ });
  }

  // --- reading -------------------------------------------------------------------------------

  private sealedIndex(seq: number): SegmentIndex {
    let index = this.sealedIndexes.get(seq);
    if (index === undefined) {
      const path = join(this.dir, indexName(seq));
      index = existsSync(path)
        ? new Map(JSON.parse(readFileSync(path, 'utf8')) as Array<[string, number[]]>)
        : scanSegment(join(this.dir, segmentName(seq)), null).index;
      this.sealedIndexes.set(seq, index);
      this.trimIndexCache();
    }
    return index;
  }

  /** Keeps the few most recently used sealed indexes in memory. */
  private trimIndexCache(): void {
    while (this.sealedIndexes.size > 8) this.sealedIndexes.delete(this.sealedIndexes.keys().next().value!);
  }

  private async readEntries(found: Array<{ seq: number; offset: number; length: number }>): Promise<LedgerEntry[]> {
    const out: LedgerEntry[] = [];
    let current = null as { seq: number; file: FileHandle } | null;
    try {
      for (const { seq, offset, length } of found) {
        if (current?.seq !== seq) {
          await current?.file.close();
          current = { seq, file: await open(join(this.dir, segmentName(seq)), 'r') };
        }
        const buffer = Buffer.alloc(length);
        await current.file.read(buffer, 0, length, offset);
        const entry = decodeRecord(buffer.toString('utf8', 0, length - 1));
        if (entry === null) throw new LedgerCorruptError(segmentName(seq), offset, 'checksum mismatch on read');
        out.push(entry);
      }
    } finally {
      await current?.file.close();
    }
    return out;
  }

  // --- recovery ------------------------------------------------------------------------------

  private async recover(): Promise<void> {
    mkdirSync(this.dir, { recursive: true });
    let sealed = 0;
    const snapshotPath = join(this.dir, 'snapshot.json');
    if (existsSync(snapshotPath)) {
      const snapshot = JSON.parse(readFileSync(snapshotPath, 'utf8')) as { version: number; sealed: number; book: unknown };
      sealed = snapshot.sealed;
      this.book = LedgerBook.load(snapshot.book);
    }
    const seqs = readdirSync(this.dir).map((f) => SEGMENT.exec(f)).filter((m) => m !== null).map((m) => Number(m[1])).sort((a, b) => a - b);
    const open_ = seqs.filter((s) => s > sealed);
    for (let i = 0; i < open_.length; i++) {
      const seq = open_[i]!;
      const last = i === open_.length - 1;
      const path = join(this.dir, segmentName(seq));
      const { index, size, torn } = scanSegment(path, (e) => this.book.apply(e));
      if (torn !== null) {
        if (!last) throw new LedgerCorruptError(segmentName(seq), size, torn);
        this.logger?.warn('ledger: cut off a torn last record (a crash during a write)', { file: segmentName(seq), offset: size, reason: torn });
        truncateSync(path, size);
      }
      if (last) {
        this.seq = seq;
        this.size = size;
        this.activeIndex = index;
      } else {
        // A segment left unsealed by a crash during sealing: seal it now. If the disk refuses
        // (full), start anyway: the segment is replayed again at the next start.
        this.sealedIndexes.set(seq, index);
        try {
          atomicWriteSync(join(this.dir, indexName(seq)), JSON.stringify([...index]));
          atomicWriteSync(snapshotPath, JSON.stringify({ version: 1, sealed: seq, book: this.book.save() }));
        } catch (err) {
          this.logger?.warn('ledger: could not seal a segment at start; it is replayed again next time', {
            file: segmentName(seq), error: (err as Error).message,
          });
        }
      }
    }
    if (this.seq === 0) this.seq = Math.max(sealed, seqs.at(-1) ?? 0) + 1;
    this.handle = await this.fs.openAppend(join(this.dir, segmentName(this.seq)));
    if (this.seq !== open_.at(-1)) this.size = statSync(join(this.dir, segmentName(this.seq))).size;
    this.trimIndexCache();
  }
}

function addPosition(index: SegmentIndex, accountId: string, offset: number, length: number): void {
  let positions = index.get(accountId);
  if (positions === undefined) {
    positions = [];
    index.set(accountId, positions);
  }
  positions.push(offset, length);
}

/**
 * Reads a whole segment, checking every record. Returns its billing index, the size of its
 * valid prefix, and why the rest is invalid (null when the whole file is valid). Damage is
 * tolerated only as a torn tail: an invalid record followed by nothing but its own bytes.
 */
function scanSegment(path: string, apply: ((e: LedgerEntry) => void) | null): { index: SegmentIndex; size: number; torn: string | null } {
  const data = readFileSync(path);
  const index: SegmentIndex = new Map();
  let offset = 0;
  while (offset < data.length) {
    const nl = data.indexOf(10, offset);
    if (nl === -1) return { index, size: offset, torn: 'last record has no end of line' };
    const entry = decodeRecord(data.toString('utf8', offset, nl));
    if (entry === null) {
      if (nl === data.length - 1) return { index, size: offset, torn: 'last record fails its checksum' };
      throw new LedgerCorruptError(path, offset, 'record fails its checksum');
    }
    apply?.(entry);
    if (entry.type !== 'usage') addPosition(index, entry.accountId, offset, nl + 1 - offset);
    offset = nl + 1;
  }
  return { index, size: offset, torn: null };
}
