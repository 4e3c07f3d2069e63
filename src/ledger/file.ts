import { closeSync, existsSync, fsyncSync, openSync, readdirSync, readFileSync, renameSync, statSync, truncateSync, writeSync } from 'node:fs';
import { open, readFile, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { LedgerBook, lines } from './book.js';
import { nodeJournalFs, type JournalFs, type JournalHandle } from './journal-fs.js';
import { DirLock } from './lock.js';
import { decodeRecord, encodeRecord, type Position } from './record.js';
import type { AccountTotals, GroupBy, HistoryPage, Ledger, LedgerEntry, UsageRow } from './types.js';

export interface FileLedgerOptions {
  /** A segment is sealed (snapshotted) once it reaches this size. */
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

/** The longest record billing history will read at a cursor's word (records are a few hundred bytes). */
const MAX_RECORD_BYTES = 1024 * 1024;
/**
 * A batch (one write and sync) stops taking records past this many bytes: the rest go in the
 * next. So a power loss can tear at most this much (plus the record that crossed it), and a
 * hole with more after it is damage of the disk, not a torn write (found in review: one zeroed
 * sector cut off a 10 MB journal's acknowledged history).
 */
const MAX_BATCH_BYTES = 1024 * 1024;
const MAX_TORN_BYTES = MAX_BATCH_BYTES + MAX_RECORD_BYTES;
/**
 * Records of finished calls the disk refused, kept to be written first when it takes writes
 * again (a provider billed those calls: found in review, they were dropped). Past this many,
 * each further one is logged whole instead.
 */
const MAX_HELD = 100_000;

/**
 * account -> flat [offset, length, offset, length, ...] of its billing entries in one segment.
 * Only for history older than back pointers (journals written before them): such segments
 * have an `.idx` file, or are scanned.
 */
type SegmentIndex = Map<string, number[]>;

interface Pending {
  entry: LedgerEntry;
  resolve: () => void;
  reject: (err: Error) => void;
}

/**
 * snapshot.json as versions 1 and 2 wrote it: one JSON text (version 1, before back pointers,
 * has no `last`). Version 3 is lines (see snapshotLines); both are read.
 */
interface Snapshot {
  version: 1 | 2 | 3;
  sealed: number;
  book: unknown;
  last?: Array<[string, Position]>;
  complete?: boolean;
  legacyUpTo?: number;
}

/** A snapshot as it is read back: the book already loaded. */
interface LoadedSnapshot extends Omit<Snapshot, 'book'> {
  book: LedgerBook;
}

/**
 * Reads snapshot.json in either form. Version 3's first line is its header, each line after it
 * a group of the book's or of `last`, and its last line `["end"]`: a file cut short is refused,
 * never read as a smaller book. Anything else is read as one JSON text (versions 1 and 2, with
 * or without a newline after it).
 */
function readSnapshot(path: string): LoadedSnapshot {
  const data = readFileSync(path);
  const firstEnd = data.indexOf(10);
  let header: Omit<Snapshot, 'book'> | null = null;
  try {
    if (firstEnd !== -1) header = JSON.parse(data.toString('utf8', 0, firstEnd)) as Omit<Snapshot, 'book'>;
  } catch { /* not a header line: one JSON text */ }
  if (header === null || header.version !== 3) {
    const snapshot = JSON.parse(data.toString('utf8')) as Snapshot;
    return { ...snapshot, book: LedgerBook.load(snapshot.book) };
  }
  const book = new LedgerBook();
  const last: Array<[string, Position]> = [];
  let ended = false;
  for (let start = firstEnd + 1; start < data.length && !ended;) {
    let end = data.indexOf(10, start);
    if (end === -1) end = data.length;
    const line = JSON.parse(data.toString('utf8', start, end)) as unknown;
    if (Array.isArray(line) && line[0] === 'l' && Array.isArray(line[1])) last.push(...(line[1] as Array<[string, Position]>));
    else if (Array.isArray(line) && line[0] === 'end') ended = true;
    else if (!book.loadLine(line)) throw new Error(`${path}: a line it cannot read at byte ${start}; remove the file to replay the journal`);
    start = end + 1;
  }
  if (!ended) throw new Error(`${path} is cut short (no end line); remove the file to replay the journal`);
  return { ...header, book, last };
}

/** Lines joined into chunks of about `bytes`: a write each (a thread-pool hand-off), the event loop free between them (256 KiB: about 4 ms of building each). */
function* chunks(source: Iterable<string>, bytes = 1 << 18): Generator<string> {
  let chunk = '';
  for (const line of source) {
    chunk += line;
    if (chunk.length >= bytes) {
      yield chunk;
      chunk = '';
    }
  }
  if (chunk !== '') yield chunk;
}

/**
 * The pointer of a record whose account's older history was written before back pointers:
 * follow it into the segment indexes (a real position never has segment 0).
 */
const BEFORE_POINTERS: Position = [0, 0, 0];

const badCursor = () => new GatewayError('invalid_request', { message: 'The cursor "after" is not valid.', fields: { param: 'after' } });

/** The same as JournalFs.writeAtomic, for recovery at start (which runs before anything else). */
function atomicWriteSync(path: string, text: Iterable<string>): void {
  const tmp = `${path}.tmp`;
  const fd = openSync(tmp, 'w');
  try {
    for (const chunk of text) {
      const bytes = Buffer.from(chunk);
      for (let done = 0; done < bytes.length;) done += writeSync(fd, bytes, done);
    }
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
 * the event loop never waits on the disk. A sealed segment gets a snapshot of the aggregates,
 * so a restart replays only the open segment, however long the history. Billing history
 * follows each record's pointer to its account's previous one: a page costs a read per
 * entry, whatever the size of the journal, and never blocks the event loop.
 */
/** Whether `dir` holds a file ledger's journal. */
export function hasJournal(dir: string): boolean {
  return readdirSync(dir).some((f) => SEGMENT.test(f));
}

export class FileLedger implements Ledger {
  private readonly maxSegmentBytes: number;
  private readonly logger: Logger | undefined;
  private readonly fs: JournalFs;
  private readonly retryMs: number;
  private book = new LedgerBook();
  private seq = 0;
  private handle: JournalHandle | null = null;
  private size = 0;
  /** Each account's newest durable billing record: where its history starts. */
  private readonly last = new Map<string, Position>();
  /**
   * Whether `last` knows every account with billing records. False for a journal begun before
   * back pointers (a version-1 snapshot): an account missing from `last` may have older
   * records, so its next record carries no pointer (its history goes on through the indexes).
   */
  private lastComplete = true;
  /**
   * The newest segment holding records written before back pointers (0: none). History below
   * a pointer chain never reads past it: a forged old-style cursor cannot make the ledger read
   * the whole journal.
   */
  private legacyUpTo = 0;
  /** Indexes of segments from before back pointers, a few kept. */
  private readonly legacyIndexes = new Map<number, SegmentIndex>();
  /** The pre-pointer records of the open segment (a journal upgraded mid-segment), found at start. */
  private readonly openLegacy: SegmentIndex = new Map();
  private pending: Pending[] = [];
  /** Call records refused by a failed write, oldest first (see MAX_HELD). */
  private held: LedgerEntry[] = [];
  private writing = false;
  private failure: Error | null = null;
  private retryTimer: NodeJS.Timeout | null = null;
  private closing: Promise<void> | null = null;
  /** Group commits done and records they carried (for tests and the bench). */
  readonly stats = { commits: 0, records: 0 };

  private constructor(readonly dir: string, options: FileLedgerOptions, private readonly lock: DirLock) {
    this.maxSegmentBytes = options.maxSegmentBytes ?? 16 * 1024 * 1024;
    this.logger = options.logger;
    this.fs = options.fs ?? nodeJournalFs;
    this.retryMs = options.retryMs ?? 1000;
  }

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
    if (this.failure !== null) {
      this.hold(entry);
      return Promise.reject(this.failure);
    }
    return new Promise((resolve, reject) => {
      this.pending.push({ entry, resolve, reject });
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

  /** Why the ledger refuses writes now, or null (for /readyz, logs and tests). */
  get failed(): Error | null {
    return this.failure;
  }

  /**
   * Newest first, only durable entries. The cursor names the next entry to return
   * (`segment.offset.length`), so pages stay stable while new entries arrive. A page costs one
   * read per entry, following the back pointers. (A cursor `segment.offset`, from before back
   * pointers, goes on through the segment indexes.)
   */
  async history(accountId: string, limit: number, after: string | null): Promise<HistoryPage> {
    const reader = new Reader(this.dir);
    try {
      if (after === null) {
        const start = this.last.get(accountId);
        if (start !== undefined) return await this.follow(reader, accountId, limit, start, true);
        if (this.lastComplete || !this.book.totals.has(accountId)) return { entries: [], hasMore: false, nextCursor: null };
        return await this.below(reader, accountId, limit, [Infinity, Infinity]);
      }
      let m = /^(\d{1,10})\.(\d{1,12})\.(\d{1,8})$/.exec(after);
      if (m !== null) {
        const at: Position = [Number(m[1]), Number(m[2]), Number(m[3])];
        if (at[0] < 1 || at[0] > this.seq || at[2] > MAX_RECORD_BYTES || at[2] < 10) throw badCursor();
        if (at[0] === this.seq && at[1] + at[2] > this.size) throw badCursor(); // past what is durable
        return await this.follow(reader, accountId, limit, at, false);
      }
      m = /^(\d{1,10})\.(\d{1,12})$/.exec(after);
      if (m === null) throw badCursor();
      const below: [number, number] = [Number(m[1]), Number(m[2])];
      if (!(await this.issuedBelow(reader, accountId, below))) throw badCursor();
      return await this.below(reader, accountId, limit, below);
    } finally {
      await reader.close();
    }
  }

  /** Entries from `at` down the back pointers; then, below the first record without one, through the indexes. */
  private async follow(reader: Reader, accountId: string, limit: number, at: Position, trusted: boolean): Promise<HistoryPage> {
    const entries: LedgerEntry[] = [];
    let next: Position | null | undefined = at;
    let legacyBelow: [number, number] | null = null;
    while (next !== null && next !== undefined && entries.length < limit) {
      const read = await reader.read(next);
      // A cursor is the client's word: it must name a whole record of this account.
      if (read === null || read.entry.accountId !== accountId || (read.entry.type !== 'charge' && read.entry.type !== 'credit')) {
        if (trusted) throw new LedgerCorruptError(segmentName(next[0]), next[1], 'a billing pointer names no billing record');
        throw badCursor();
      }
      trusted = true;
      entries.push(read.entry);
      if (read.prev === undefined || (read.prev !== null && read.prev[0] === 0)) {
        legacyBelow = [next[0], next[1]]; // older history: through the indexes
        next = undefined;
      } else {
        next = read.prev;
      }
    }
    if (next === undefined && legacyBelow !== null) {
      // The rest was written before back pointers: the indexes know it.
      const older = await this.below(reader, accountId, limit - entries.length, legacyBelow);
      return { entries: entries.concat(older.entries), hasMore: older.hasMore, nextCursor: older.nextCursor };
    }
    if (next === null || next === undefined) return { entries, hasMore: false, nextCursor: null };
    return { entries, hasMore: true, nextCursor: `${next[0]}.${next[1]}.${next[2]}` };
  }

  /**
   * Whether this ledger can have handed out the old-style cursor `below`: it names a billing
   * record of the account (one written before back pointers, or the last a page read down the
   * pointers, which may sit among them: found in review), or one past every such segment. A
   * journal begun with pointers never handed one out.
   */
  private async issuedBelow(reader: Reader, accountId: string, below: [number, number]): Promise<boolean> {
    if (this.legacyUpTo === 0 || below[0] < 1 || below[0] > this.seq) return false;
    if (below[0] > this.legacyUpTo) return true;
    const positions = (await this.legacyIndex(below[0])).get(accountId);
    if (positions !== undefined) for (let i = 0; i < positions.length; i += 2) if (positions[i] === below[1]) return true;
    const read = await reader.readLine(below[0], below[1], MAX_RECORD_BYTES);
    return read !== null && read.entry.accountId === accountId && (read.entry.type === 'charge' || read.entry.type === 'credit');
  }

  /** History from before back pointers: the account's entries strictly below `below`, through the segment indexes. */
  private async below(reader: Reader, accountId: string, limit: number, below: [number, number]): Promise<HistoryPage> {
    const found: Position[] = [];
    // Everything in segments above legacyUpTo has pointers: they are not read.
    const top = Math.min(this.seq, below[0], this.legacyUpTo);
    const from: [number, number] = top < below[0] ? [top, Infinity] : below;
    for (let seq = top; seq >= 1 && found.length <= limit; seq--) {
      const positions = (await this.legacyIndex(seq)).get(accountId);
      if (positions === undefined) continue;
      for (let i = positions.length - 2; i >= 0 && found.length <= limit; i -= 2) {
        const offset = positions[i]!;
        if (seq === from[0] && offset >= from[1]) continue;
        found.push([seq, offset, positions[i + 1]!]);
      }
    }
    const hasMore = found.length > limit;
    if (hasMore) found.length = limit;
    const entries: LedgerEntry[] = [];
    for (const at of found) {
      const read = await reader.read(at);
      if (read === null) throw new LedgerCorruptError(segmentName(at[0]), at[1], 'checksum mismatch on read');
      entries.push(read.entry);
    }
    // The next page starts below the last entry returned (with limit 0, the caller's last one).
    const cursorAt = limit === 0 ? below : found.at(-1)!;
    return { entries, hasMore, nextCursor: hasMore ? `${cursorAt[0]}.${cursorAt[1]}` : null };
  }

  close(): Promise<void> {
    if (this.closing === null) {
      this.closing = (async () => {
        if (this.retryTimer !== null) clearTimeout(this.retryTimer);
        while (this.writing || this.pending.length > 0) await new Promise((r) => setTimeout(r, 1));
        if (this.failure !== null) {
          // A last try: the held records, and the segment cut back to what was acknowledged
          // (found in review: a refused credit's bytes were replayed at the next start).
          try {
            await this.writeHeld();
          } catch {
            await this.handle?.truncate(this.size).catch(() => {});
            for (const entry of this.held) this.logger?.error('ledger: a call record the disk refused, not written', recordFields(entry));
          }
        }
        await this.handle?.close().catch(() => {});
        this.handle = null;
        this.lock.release();
      })();
    }
    return this.closing;
  }

  // --- writing -------------------------------------------------------------------------------

  /**
   * Writes what was appended, a batch (group commit) at a time, until nothing is pending or a
   * write fails. Never throws: it runs detached, and a failure is a state (`failed`), not a crash.
   * Records are encoded here, where their positions are known, so each billing record can point
   * to its account's previous one (in this batch or before it).
   */
  private async flush(): Promise<void> {
    while (this.pending.length > 0 && this.failure === null) {
      const batch = this.pending;
      this.pending = [];
      let taken: number;
      try {
        taken = await this.commit(batch);
      } catch (err) {
        await this.fail(err as Error, batch);
        break;
      }
      // One write was full: the rest go in the next, ahead of whatever was appended meanwhile.
      if (taken < batch.length) this.pending = batch.slice(taken).concat(this.pending);
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

  /**
   * Writes and syncs the first records of `batch`, up to MAX_BATCH_BYTES, then acknowledges
   * them; returns how many. Throws when the disk refuses (nothing acknowledged).
   */
  private async commit(batch: readonly Pending[]): Promise<number> {
    const newest = new Map<string, Position>();
    let offset = this.size;
    let text = '';
    let taken = 0;
    for (; taken < batch.length && offset - this.size < MAX_BATCH_BYTES; taken++) {
      const e = batch[taken]!.entry;
      if (e.type === 'usage') {
        const line = encodeRecord(e);
        text += line;
        offset += Buffer.byteLength(line);
        continue;
      }
      // The account's previous record; "none" only when that is known (see lastComplete).
      const prev = newest.get(e.accountId) ?? this.last.get(e.accountId) ?? (this.lastComplete ? null : BEFORE_POINTERS);
      const line = encodeRecord(e, prev);
      const length = Buffer.byteLength(line);
      newest.set(e.accountId, [this.seq, offset, length]);
      text += line;
      offset += length;
    }
    await this.writeAll(Buffer.from(text));
    await this.handle!.datasync();
    for (let i = 0; i < taken; i++) this.book.apply(batch[i]!.entry);
    for (const [account, at] of newest) this.last.set(account, at);
    this.size = offset;
    this.stats.commits++;
    this.stats.records += taken;
    for (let i = 0; i < taken; i++) batch[i]!.resolve();
    return taken;
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
    for (const p of batch) {
      this.hold(p.entry);
      p.reject(this.failure);
    }
    for (const p of this.pending) {
      this.hold(p.entry);
      p.reject(this.failure);
    }
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

  /**
   * A record refused by a failed write (its caller was told so): a call's record is kept, to be
   * written when the disk takes writes again, for the call ran and its provider billed it. An
   * admin credit is not: its caller was told nothing was credited, and may send it again.
   */
  private hold(entry: LedgerEntry): void {
    if (entry.type === 'credit') return;
    if (this.held.length < MAX_HELD) {
      this.held.push(entry);
      return;
    }
    this.logger?.error('ledger: a call record the disk refused, not kept (too many waiting)', recordFields(entry));
  }

  /**
   * Resumes once the segment is back to its last acknowledged byte, the disk takes a probe
   * write, and the records held since the failure are written: so charges are taken again only
   * once real writes fit (found in review: a probe fitting a nearly full disk let calls in whose
   * records then failed).
   */
  private async retry(): Promise<void> {
    if (this.closing !== null || this.failure === null || this.writing) return;
    this.writing = true; // no flush while the writer is being checked
    try {
      await this.writeHeld();
      this.failure = null;
      this.logger?.warn('ledger writes work again; charges are accepted');
    } catch {
      this.scheduleRetry();
    } finally {
      this.writing = false;
    }
  }

  /** Back to the last acknowledged byte, a probe write, then the held records, oldest first. Throws while the disk refuses. */
  private async writeHeld(): Promise<void> {
    await this.handle!.truncate(this.size);
    await this.handle!.datasync();
    await this.fs.probe(this.dir);
    if (this.size >= this.maxSegmentBytes) await this.seal();
    while (this.held.length > 0) {
      const taken = await this.commit(this.held.slice(0, 16_384).map((entry) => ({ entry, resolve: ignore, reject: ignore })));
      this.held.splice(0, taken); // appends held meanwhile stay after them
      if (this.size >= this.maxSegmentBytes) await this.seal();
    }
  }

  /**
   * Seals the open segment: a snapshot of the aggregates and of each account's newest record,
   * then a new segment; the old segment's handle is closed only once the new one is open, so a
   * seal that fails half-way leaves the writer where it was (and is simply done again).
   */
  private async seal(): Promise<void> {
    const sealed = this.seq;
    // Written a chunk at a time, the event loop free between them: nothing changes the book or
    // `last` meanwhile (only this writer does, and it waits for the seal).
    await this.fs.writeAtomic(join(this.dir, 'snapshot.json'), chunks(this.snapshotLines(sealed)));
    const next = await this.fs.openAppend(join(this.dir, segmentName(sealed + 1)));
    const old = this.handle!;
    this.handle = next;
    this.seq = sealed + 1;
    this.size = 0;
    this.openLegacy.clear(); // its segment is sealed: its index is built from the file when needed
    await old.close().catch(() => { /* the segment is durable; its descriptor is what is lost */ });
  }

  /** What snapshot.json holds once segment `sealed` is sealed (version 3: a header, then the book's lines and `last`'s). */
  private *snapshotLines(sealed: number): Generator<string> {
    yield `${JSON.stringify({ version: 3, sealed, complete: this.lastComplete, legacyUpTo: this.legacyUpTo })}\n`;
    yield* this.book.saveLines();
    yield* lines(this.last, (group) => ['l', group]);
    yield '["end"]\n';
  }

  // --- reading history from before back pointers ----------------------------------------------

  /**
   * A segment's index of pre-pointer records: its `.idx` file, or the open segment's (found at
   * start), or built once by reading the segment (asynchronously) and kept as its `.idx`.
   */
  private async legacyIndex(seq: number): Promise<SegmentIndex> {
    if (seq === this.seq) return this.openLegacy;
    const cached = this.legacyIndexes.get(seq);
    if (cached !== undefined) return cached;
    const idx = join(this.dir, indexName(seq));
    let index: SegmentIndex;
    if (existsSync(idx)) {
      index = new Map(JSON.parse(await readFile(idx, 'utf8')) as Array<[string, number[]]>);
    } else {
      const data = await readFile(join(this.dir, segmentName(seq)));
      index = new Map();
      scanRecords(data, data.length, segmentName(seq), (d, offset, length) => {
        if (d.entry.type !== 'usage' && d.prev === undefined) addPosition(index, d.entry.accountId, offset, length);
      });
      await this.fs.writeAtomic(idx, JSON.stringify([...index])).catch(() => { /* built again next time */ });
    }
    this.legacyIndexes.set(seq, index);
    while (this.legacyIndexes.size > 8) this.legacyIndexes.delete(this.legacyIndexes.keys().next().value!);
    return index;
  }

  /**
   * Every entry of the journal, oldest first, read from the segments on disk (for moving the
   * books to another ledger: `import-ledger`). What was appended and not yet written is not
   * among them: call it on a ledger nothing appends to.
   */
  *entries(): Generator<LedgerEntry> {
    const seqs = readdirSync(this.dir).map((f) => SEGMENT.exec(f)).filter((m) => m !== null).map((m) => Number(m[1])).sort((a, b) => a - b);
    for (const seq of seqs) {
      const data = readFileSync(join(this.dir, segmentName(seq)));
      const end = seq === this.seq ? Math.min(this.size, data.length) : data.length;
      const entries: LedgerEntry[] = [];
      scanRecords(data, end, segmentName(seq), (d) => entries.push(d.entry));
      yield* entries;
    }
  }

  // --- recovery ------------------------------------------------------------------------------

  private async recover(): Promise<void> {
    let sealed = 0;
    const snapshotPath = join(this.dir, 'snapshot.json');
    if (existsSync(snapshotPath)) {
      const snapshot = readSnapshot(snapshotPath);
      sealed = snapshot.sealed;
      this.book = snapshot.book;
      for (const [account, at] of snapshot.last ?? []) this.last.set(account, at);
      this.lastComplete = snapshot.version >= 2 && snapshot.complete === true;
      // Every segment a version-1 snapshot sealed was written before back pointers.
      this.legacyUpTo = snapshot.version >= 2 ? snapshot.legacyUpTo ?? 0 : sealed;
    }
    const seqs = readdirSync(this.dir).map((f) => SEGMENT.exec(f)).filter((m) => m !== null).map((m) => Number(m[1])).sort((a, b) => a - b);
    const open_ = seqs.filter((s) => s > sealed);
    for (let i = 0; i < open_.length; i++) {
      const seq = open_[i]!;
      const last = i === open_.length - 1;
      const path = join(this.dir, segmentName(seq));
      const data = readFileSync(path);
      const legacy: SegmentIndex = new Map();
      const { size, torn } = scanRecords(data, data.length, path, (d, offset, length) => {
        this.book.apply(d.entry);
        if (d.entry.type === 'usage') return;
        this.last.set(d.entry.accountId, [seq, offset, length]);
        if (d.prev === undefined) {
          // Written before back pointers.
          addPosition(legacy, d.entry.accountId, offset, length);
          if (seq > this.legacyUpTo) this.legacyUpTo = seq;
        }
      }, last);
      if (torn !== null) {
        if (!last) throw new LedgerCorruptError(segmentName(seq), size, torn);
        this.logger?.warn('ledger: cut off a torn last record (a crash during a write)', { file: segmentName(seq), offset: size, reason: torn });
        this.logUnacknowledged(data, size, seq);
        truncateSync(path, size);
      }
      if (last) {
        this.seq = seq;
        this.size = size;
        for (const [account, positions] of legacy) this.openLegacy.set(account, positions);
      } else {
        // A segment left unsealed by a crash during sealing: seal it now. If the disk refuses
        // (full), start anyway: the segment is replayed again at the next start.
        try {
          atomicWriteSync(snapshotPath, chunks(this.snapshotLines(seq)));
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
  }

  /**
   * The whole records a torn tail still holds after its damage (past a hole of zeros): written
   * in the last batch, never acknowledged, and cut off with it. Each is logged, so that what a
   * provider may have billed is not lost without a trace.
   */
  private logUnacknowledged(data: Buffer, from: number, seq: number): void {
    for (let offset = data.indexOf(10, from) + 1; offset > 0 && offset < data.length;) {
      const nl = data.indexOf(10, offset);
      if (nl === -1) break;
      const decoded = decodeRecord(data.toString('utf8', offset, nl));
      if (decoded !== null) {
        const e = decoded.entry;
        this.logger?.warn('ledger: cut off an unacknowledged record after the damage', {
          file: segmentName(seq), offset, entry_id: e.id, type: e.type, account_id: e.accountId, amount_micro: e.amountMicro, request_id: e.requestId,
        });
      }
      offset = nl + 1;
    }
  }
}

/** Reads records at positions, a file handle per segment, for one history call. */
class Reader {
  private readonly files = new Map<number, FileHandle>();

  constructor(private readonly dir: string) {}

  /** The record at `at`, or null when there is no whole, valid record there. */
  async read(at: Position): Promise<ReturnType<typeof decodeRecord>> {
    const file = await this.file(at[0]);
    if (file === null) return null;
    const buffer = Buffer.alloc(at[2]);
    const { bytesRead } = await file.read(buffer, 0, at[2], at[1]);
    if (bytesRead !== at[2] || buffer[at[2] - 1] !== 10) return null;
    return decodeRecord(buffer.toString('utf8', 0, at[2] - 1));
  }

  /** The record that starts at `offset` of segment `seq` (at most `most` bytes), or null. */
  async readLine(seq: number, offset: number, most: number): Promise<ReturnType<typeof decodeRecord>> {
    const file = await this.file(seq);
    if (file === null) return null;
    const buffer = Buffer.alloc(most);
    const { bytesRead } = await file.read(buffer, 0, most, offset);
    const end = buffer.subarray(0, bytesRead).indexOf(10);
    return end < 0 ? null : decodeRecord(buffer.toString('utf8', 0, end));
  }

  private async file(seq: number): Promise<FileHandle | null> {
    let file = this.files.get(seq);
    if (file === undefined) {
      try {
        file = await open(join(this.dir, segmentName(seq)), 'r');
      } catch (err) {
        // No such segment: no record there. Any other failure (too many open files, EIO) is
        // the disk's, not the journal's: 503, never reported as corruption (found in review).
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw new GatewayError('ledger_unavailable', { retryAfterS: 1 });
      }
      this.files.set(seq, file);
    }
    return file;
  }

  async close(): Promise<void> {
    for (const file of this.files.values()) await file.close().catch(() => {});
    this.files.clear();
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
 * Reads the records of a segment's first `end` bytes, checking every one. Returns the size of
 * its valid prefix, and why the rest is invalid (null when all of it is valid). Damage is
 * tolerated only as a torn tail: an invalid record followed by nothing but its own bytes, or,
 * with `holes` (the last segment, at start), one that holds zero bytes from a block boundary
 * on, followed by at most one write's bytes.
 * A record never holds a zero byte (JSON escapes it); a power loss during the last write can
 * leave blocks of zeros inside it with later blocks of the same write on disk after them. That
 * write was never acknowledged (each batch is synced before the next is written): the records
 * after the hole belong to it.
 */
function scanRecords(
  data: Buffer, end: number, name: string, each: (d: NonNullable<ReturnType<typeof decodeRecord>>, offset: number, length: number) => void,
  holes = false,
): { size: number; torn: string | null } {
  let offset = 0;
  while (offset < end) {
    const nl = data.indexOf(10, offset);
    if (nl === -1 || nl >= end) return { size: offset, torn: 'last record has no end of line' };
    const decoded = decodeRecord(data.toString('utf8', offset, nl));
    if (decoded === null) {
      if (nl === end - 1) return { size: offset, torn: 'last record fails its checksum' };
      // A hole the disk left starts on a block boundary (sectors are 512 bytes at least).
      const zero = data.indexOf(0, offset);
      if (holes && zero !== -1 && zero < nl && zero % 512 === 0) {
        // More after it than one write holds: not the last write torn, but damage.
        if (end - offset > MAX_TORN_BYTES) throw new LedgerCorruptError(name, offset, `zero bytes in a record, with ${end - offset} bytes after them (more than one write)`);
        return { size: offset, torn: 'zero bytes in a record (power lost during the last write)' };
      }
      throw new LedgerCorruptError(name, offset, 'record fails its checksum');
    }
    each(decoded, offset, nl + 1 - offset);
    offset = nl + 1;
  }
  return { size: offset, torn: null };
}

const ignore = (): void => {};

/** A record's fields for a log line: what the journal would have held. */
function recordFields(e: LedgerEntry): Record<string, unknown> {
  return {
    entry_id: e.id, type: e.type, account_id: e.accountId, key_id: e.keyId, amount_micro: e.amountMicro, request_id: e.requestId,
    model: e.model, input_tokens: e.inputTokens, output_tokens: e.outputTokens, estimated: e.estimated, created_at: e.createdAt,
  };
}
