import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, statSync, truncateSync, writeSync } from 'node:fs';
import { open, rename, writeFile, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { LedgerBook } from './book.js';
import { decodeRecord, encodeRecord } from './record.js';
import type { AccountTotals, GroupBy, HistoryPage, Ledger, LedgerEntry, UsageRow } from './types.js';

export interface FileLedgerOptions {
  /** A segment is sealed (indexed, snapshotted) once it reaches this size. */
  maxSegmentBytes?: number;
  logger?: Logger;
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
  private handle: FileHandle | null = null;
  private size = 0;
  private activeIndex: SegmentIndex = new Map();
  private readonly sealedIndexes = new Map<number, SegmentIndex>();
  private pending: Pending[] = [];
  private writing = false;
  private failure: Error | null = null;
  private closing: Promise<void> | null = null;
  /** Group commits done and records they carried (for tests and the bench). */
  readonly stats = { commits: 0, records: 0 };

  private constructor(readonly dir: string, options: FileLedgerOptions) {
    this.maxSegmentBytes = options.maxSegmentBytes ?? 16 * 1024 * 1024;
    this.logger = options.logger;
  }

  /** Opens (creating) the journal in `dir` and recovers its state. Throws LedgerCorruptError on damage. */
  static async open(dir: string, options: FileLedgerOptions = {}): Promise<FileLedger> {
    const ledger = new FileLedger(dir, options);
    await ledger.recover();
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
        while (this.writing || this.pending.length > 0) await new Promise((r) => setTimeout(r, 1));
        await this.handle?.close();
        this.handle = null;
      })();
    }
    return this.closing;
  }

  // --- writing -------------------------------------------------------------------------------

  private async flush(): Promise<void> {
    while (this.pending.length > 0 && this.failure === null) {
      const batch = this.pending;
      this.pending = [];
      let text = '';
      for (const p of batch) text += p.line;
      try {
        await this.handle!.write(text);
        await this.handle!.datasync();
      } catch (err) {
        // The disk refused: nothing more is acknowledged (the gateway turns not ready), and
        // the partial write, if any, is cut off as a torn record on the next start.
        this.failure = new Error(`ledger write failed: ${(err as Error).message}`);
        this.logger?.error('ledger write failed; refusing further charges', { error: (err as Error).message });
        for (const p of batch) p.reject(this.failure);
        for (const p of this.pending) p.reject(this.failure);
        this.pending = [];
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
      if (this.size >= this.maxSegmentBytes) await this.seal();
    }
    this.writing = false;
  }

  /** Seals the open segment: its index, then a snapshot of the aggregates, then a new segment. */
  private async seal(): Promise<void> {
    const sealed = this.seq;
    await writeAtomic(join(this.dir, indexName(sealed)), JSON.stringify([...this.activeIndex]));
    this.sealedIndexes.set(sealed, this.activeIndex);
    await writeAtomic(join(this.dir, 'snapshot.json'), JSON.stringify({ version: 1, sealed, book: this.book.save() }));
    await this.handle!.close();
    this.seq = sealed + 1;
    this.handle = await open(join(this.dir, segmentName(this.seq)), 'a');
    this.size = 0;
    this.activeIndex = new Map();
    this.trimIndexCache();
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
        // A segment left unsealed by a crash during sealing: seal it now.
        atomicWriteSync(join(this.dir, indexName(seq)), JSON.stringify([...index]));
        this.sealedIndexes.set(seq, index);
        atomicWriteSync(snapshotPath, JSON.stringify({ version: 1, sealed: seq, book: this.book.save() }));
      }
    }
    if (this.seq === 0) this.seq = Math.max(sealed, seqs.at(-1) ?? 0) + 1;
    this.handle = await open(join(this.dir, segmentName(this.seq)), 'a');
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

async function writeAtomic(path: string, text: string): Promise<void> {
  const tmp = `${path}.tmp`;
  await writeFile(tmp, text);
  const handle = await open(tmp, 'r+');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
  await rename(tmp, path);
}
