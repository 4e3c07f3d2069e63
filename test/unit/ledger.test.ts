import assert from 'node:assert/strict';
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { DAY_MS } from '../../src/clock.js';
import { LedgerBook } from '../../src/ledger/book.js';
import { FileLedger, LedgerCorruptError } from '../../src/ledger/file.js';
import { MemoryLedger } from '../../src/ledger/memory.js';
import { decodeRecord, encodeRecord } from '../../src/ledger/record.js';
import type { Ledger, LedgerEntry } from '../../src/ledger/types.js';
import { Logger } from '../../src/log.js';
import { rng } from '../helpers/fake-clock.js';

const T0 = Date.UTC(2026, 0, 15, 10);
let n = 0;
function charge(accountId: string, micro: number, at = T0, extra: Partial<LedgerEntry> = {}): LedgerEntry {
  n++;
  return {
    id: `txn_${n}`, type: 'charge', accountId, keyId: 'k1', amountMicro: -micro, balanceAfterMicro: null, balanceUnknown: false, createdAt: at,
    requestId: `req_${n}`, model: 'm1', inputTokens: 10, outputTokens: 5, estimated: false, note: null, idempotencyKey: null, deployment: 'p1', ...extra,
  };
}
const credit = (accountId: string, micro: number, at = T0): LedgerEntry => charge(accountId, -micro, at, { type: 'credit', model: null, keyId: null, deployment: null });
const tmp = () => mkdtempSync(join(tmpdir(), 'mg-ledger-'));
const quiet = new Logger(() => {});

/** A closed file ledger of five charges in one segment: its directory, that segment, and its size. */
async function fiveCharges(): Promise<{ dir: string; segment: string; goodSize: number }> {
  const dir = tmp();
  const ledger = await FileLedger.open(dir, { logger: quiet });
  for (let i = 0; i < 5; i++) await ledger.append(charge('a', 1));
  await ledger.close();
  const segment = join(dir, readdirSync(dir).find((f) => f.endsWith('.log'))!);
  return { dir, segment, goodSize: statSync(segment).size };
}

/** A closed file ledger (segments of 1,500 bytes) of account a: a credit of 10,000, then `n` charges of 10 on its balance. */
async function prepaidHistory(n: number): Promise<string> {
  const dir = tmp();
  const ledger = await FileLedger.open(dir, { maxSegmentBytes: 1500, logger: quiet });
  await ledger.append(credit('a', 10_000));
  for (let i = 0; i < n; i++) await ledger.append(charge('a', 10, T0 + i, { balanceAfterMicro: 10_000 - 10 * (i + 1) }));
  await ledger.close();
  return dir;
}

async function allPages(ledger: Ledger, account: string, limit: number): Promise<LedgerEntry[]> {
  const out: LedgerEntry[] = [];
  let after: string | null = null;
  for (let i = 0; i < 10_000; i++) {
    const page = await ledger.history(account, limit, after);
    out.push(...page.entries);
    if (!page.hasMore) return out;
    after = page.nextCursor;
  }
  throw new Error('pagination did not end');
}

describe('journal records', () => {
  test('round trip, and a damaged line is refused', () => {
    const e = charge('a', 5, T0, { note: 'ünïcode ✓', estimated: true });
    const line = encodeRecord(e);
    assert.ok(line.endsWith('\n'));
    assert.deepEqual(decodeRecord(line.slice(0, -1)), { entry: e, prev: undefined });
    assert.deepEqual(decodeRecord(encodeRecord(e, [3, 1200, 180]).slice(0, -1)), { entry: e, prev: [3, 1200, 180] });
    assert.deepEqual(decodeRecord(encodeRecord(e, null).slice(0, -1)), { entry: e, prev: null });
    assert.equal(decodeRecord(line.slice(0, -1).replace('"m":-5', '"m":-6')), null);
    assert.equal(decodeRecord(line.slice(0, 20)), null);
    assert.equal(decodeRecord(''), null);
  });
});

describe('LedgerBook', () => {
  test('balances, spend of the latest UTC day, usage by day, model and key', () => {
    const book = new LedgerBook();
    book.apply(charge('a', 30, T0 - DAY_MS)); // while postpaid: spend, not taken from a later prepaid balance
    assert.deepEqual(book.totals.get('a'), { balanceMicro: 0, day: Math.floor((T0 - DAY_MS) / DAY_MS), spentMicro: 30, credited: false });
    book.apply(credit('a', 1000));
    book.apply(charge('a', 100, T0, { balanceAfterMicro: 900 }));
    book.apply(charge('a', 50, T0, { model: 'm2', keyId: 'k2', balanceAfterMicro: 850 }));
    book.apply(charge('a', 7, T0 + DAY_MS, { balanceAfterMicro: 843 }));
    const t = book.totals.get('a')!;
    assert.deepEqual(t, { balanceMicro: 843, day: Math.floor((T0 + DAY_MS) / DAY_MS), spentMicro: 7, credited: true });
    const d0 = Math.floor(T0 / DAY_MS);
    assert.deepEqual(book.usage('a', d0, d0 + 1, 'day').map((r) => [r.date, r.requests, r.costMicro]),
      [['2026-01-15', 2, 150], ['2026-01-16', 1, 7]]);
    assert.deepEqual(book.usage('a', d0, d0, 'model').map((r) => [r.model, r.costMicro, r.date]), [['m1', 100, null], ['m2', 50, null]]);
    assert.deepEqual(book.usage('a', d0, d0 + 1, 'key').map((r) => [r.keyId, r.requests]), [['k1', 2], ['k2', 1]]);
    assert.deepEqual(LedgerBook.load(JSON.parse(JSON.stringify(book.save()))).usage('a', d0, d0 + 1, 'day'), book.usage('a', d0, d0 + 1, 'day'));
  });

  test('totals saturate at 2^53 - 1 as the limiters do: books that add up past it still restore at the next start', () => {
    const book = new LedgerBook();
    book.apply(credit('a', 9e15));
    book.apply(credit('a', 9e15));
    assert.equal(book.totals.get('a')!.balanceMicro, Number.MAX_SAFE_INTEGER);
    book.apply(charge('a', 9e15));
    book.apply(charge('a', 9e15));
    assert.equal(book.totals.get('a')!.spentMicro, Number.MAX_SAFE_INTEGER);
  });

  test('property: usage equals a plain sum over the entries, whatever their order (runs of one cell and switches)', () => {
    const next = rng(7);
    const pick = <T>(xs: T[]): T => xs[Math.floor(next() * xs.length)]!;
    const book = new LedgerBook();
    const expected = new Map<string, number>();
    let current = { account: 'a', day: 0, model: 'm1' as string | null, key: 'k1' as string | null };
    for (let i = 0; i < 3000; i++) {
      // Mostly runs of the same cell (as under load), sometimes a switch of one field.
      if (next() < 0.3) {
        current = { ...current };
        const field = pick(['account', 'day', 'model', 'key'] as const);
        if (field === 'account') current.account = pick(['a', 'b']);
        if (field === 'day') current.day = pick([0, 1, 2]);
        if (field === 'model') current.model = pick(['m1', 'm2', null]);
        if (field === 'key') current.key = pick(['k1', 'k2', null]);
      }
      const micro = 1 + Math.floor(next() * 100);
      book.apply(charge(current.account, micro, T0 + current.day * DAY_MS, { model: current.model, keyId: current.key }));
      const cell = `${current.account}/${current.day}/${current.model}/${current.key}`;
      expected.set(cell, (expected.get(cell) ?? 0) + micro);
    }
    const d0 = Math.floor(T0 / DAY_MS);
    for (const account of ['a', 'b']) {
      for (const day of [0, 1, 2]) {
        for (const model of ['m1', 'm2', null]) {
          const rows = book.usage(account, d0 + day, d0 + day, 'model').filter((r) => r.model === model);
          const want = [...expected].filter(([k]) => k.startsWith(`${account}/${day}/${model}/`)).reduce((sum, [, v]) => sum + v, 0);
          assert.equal(rows.reduce((sum, r) => sum + r.costMicro, 0), want, `${account} day ${day} ${model}`);
        }
        for (const key of ['k1', 'k2', null]) {
          const rows = book.usage(account, d0 + day, d0 + day, 'key').filter((r) => r.keyId === key);
          const want = [...expected].filter(([k]) => k.startsWith(`${account}/${day}/`) && k.endsWith(`/${key}`)).reduce((sum, [, v]) => sum + v, 0);
          assert.equal(rows.reduce((sum, r) => sum + r.costMicro, 0), want, `${account} day ${day} ${key}`);
        }
      }
    }
  });
});

for (const kind of ['memory', 'file'] as const) {
  describe(`${kind} ledger: history pages`, () => {
    test('newest first; no entry skipped or repeated across pages, even while new charges arrive', async () => {
      const r = rng(7);
      const ledger: Ledger = kind === 'memory' ? new MemoryLedger() : await FileLedger.open(tmp(), { maxSegmentBytes: 2000, logger: quiet });
      const expected: string[] = [];
      for (let i = 0; i < 120; i++) {
        const e = r() < 0.7 ? charge('a', 1 + i) : charge('b', 1);
        if (e.accountId === 'a') expected.push(e.id);
        await ledger.append(e);
      }
      await ledger.append(charge('a', 1, T0, { type: 'usage' })); // free calls are not billing history
      for (const limit of [1, 7, 20, 100]) {
        const seen = (await allPages(ledger, 'a', limit)).map((e) => e.id);
        assert.deepEqual(seen, [...expected].reverse(), `limit ${limit}`);
      }
      // New charges arriving between pages do not shift the older pages.
      const first = await ledger.history('a', 10, null);
      for (let i = 0; i < 5; i++) await ledger.append(charge('a', 1));
      const rest = (await allPages2(ledger, 'a', 10, first.nextCursor)).map((e) => e.id);
      assert.deepEqual([...first.entries.map((e) => e.id), ...rest], [...expected].reverse());
      await assert.rejects(async () => ledger.history('a', 10, 'garbage'), /cursor/);
      assert.deepEqual(await ledger.history('nobody', 10, null), { entries: [], hasMore: false, nextCursor: null });
      await ledger.close();
    });
  });
}

describe('memory ledger: bounded history', () => {
  test('keeps each account\'s latest entries (memory does not grow with traffic); balances stay exact; cursors stay valid across trims', () => {
    const ledger = new MemoryLedger(40);
    const ids: string[] = [];
    for (let i = 0; i < 1000; i++) {
      const e = charge('a', 1, T0, { balanceAfterMicro: -1 - i });
      ids.push(e.id);
      ledger.append(e);
      assert.ok(ledger.entries('a').length <= 50, 'at most a quarter over the bound');
    }
    assert.ok(ledger.entries('a').length >= 40);
    assert.equal(ledger.totals().get('a')!.balanceMicro, -1000, 'totals count every entry, kept or not');
    const kept = ledger.entries('a').length;
    // A page taken, then enough new charges to trim past it: the next page resumes where it can.
    const first = ledger.history('a', 10, null);
    assert.deepEqual(first.entries.map((e) => e.id), ids.slice(-10).reverse());
    for (let i = 0; i < 10; i++) ledger.append(charge('a', 1));
    const next = ledger.history('a', 10, first.nextCursor);
    assert.deepEqual(next.entries.map((e) => e.id), ids.slice(-20, -10).reverse());
    let seen = first.entries.length + next.entries.length;
    let after = next.nextCursor;
    while (after !== null) {
      const page = ledger.history('a', 7, after);
      seen += page.entries.length;
      after = page.nextCursor;
    }
    assert.ok(seen <= kept + 10 && seen >= 30, `pages end at the oldest entry kept (${seen})`);
  });
});

async function allPages2(ledger: Ledger, account: string, limit: number, after: string | null): Promise<LedgerEntry[]> {
  const out: LedgerEntry[] = [];
  for (;;) {
    const page = await ledger.history(account, limit, after);
    out.push(...page.entries);
    if (!page.hasMore) return out;
    after = page.nextCursor;
  }
}

describe('file ledger', () => {
  test('group commit: appends of one turn share one write and fsync', async () => {
    const ledger = await FileLedger.open(tmp(), { logger: quiet });
    await Promise.all(Array.from({ length: 200 }, (_, i) => ledger.append(charge('a', i + 1))));
    assert.equal(ledger.stats.records, 200);
    assert.ok(ledger.stats.commits <= 2, `${ledger.stats.commits} commits for 200 records`);
    await ledger.close();
  });

  test('restart restores balances, today\'s spend and usage; sealed segments keep their history', async () => {
    const dir = await prepaidHistory(40);
    const files = readdirSync(dir);
    assert.ok(files.filter((f) => f.endsWith('.log')).length > 3, 'several segments');
    assert.ok(files.includes('snapshot.json'));
    assert.ok(!files.some((f) => f.endsWith('.idx')), 'history follows back pointers: no index files');

    const second = await FileLedger.open(dir, { maxSegmentBytes: 1500, logger: quiet });
    assert.deepEqual(second.totals().get('a'), { balanceMicro: 9600, day: Math.floor(T0 / DAY_MS), spentMicro: 400, credited: true });
    assert.equal((await allPages(second, 'a', 15)).length, 41);
    const d = Math.floor(T0 / DAY_MS);
    assert.equal(second.usage('a', d, d, 'day')[0]!.requests, 40);
    await second.close();
    // Without its snapshot, the journal is replayed whole and history is the same.
    rmSync(join(dir, 'snapshot.json'));
    const third = await FileLedger.open(dir, { maxSegmentBytes: 1500, logger: quiet });
    assert.equal((await allPages(third, 'a', 100)).length, 41);
    await third.close();
  });

  test('a large book is snapshotted in lines of bounded size, read back whole (found in review: one JSON text of it could not be written past some 5 million cells, and stalled the event loop while it was built)', async () => {
    const dir = tmp();
    const ledger = await FileLedger.open(dir, { maxSegmentBytes: 200_000, logger: quiet });
    // 6,000 usage cells (3 accounts x 2,000 days), written in one burst, then a seal.
    await Promise.all(Array.from({ length: 6000 }, (_, i) => ledger.append(charge(['a', 'b', 'c'][i % 3]!, 1 + (i % 7), T0 + Math.floor(i / 3) * DAY_MS))));
    for (let i = 0; i < 3; i++) await ledger.append(charge('a', 1, T0));
    await ledger.close();
    const text = readFileSync(join(dir, 'snapshot.json'), 'utf8');
    const lines = text.trimEnd().split('\n');
    assert.equal((JSON.parse(lines[0]!) as { version: number }).version, 3);
    assert.ok(lines.length > 6, `${lines.length} lines`);
    for (const line of lines) assert.ok(line.length < 200_000, `a line of ${line.length} characters`);
    const first = await FileLedger.open(dir, { maxSegmentBytes: 200_000, logger: quiet });
    const d0 = Math.floor(T0 / DAY_MS);
    const usage = first.usage('b', d0, d0 + 3000, 'day');
    await first.close();
    // The same books replayed from the journal alone.
    rmSync(join(dir, 'snapshot.json'));
    const replayed = await FileLedger.open(dir, { maxSegmentBytes: 200_000, logger: quiet });
    assert.equal(usage.length, 2000);
    assert.deepEqual(usage, replayed.usage('b', d0, d0 + 3000, 'day'));
    assert.deepEqual(first.totals(), replayed.totals());
    await replayed.close();
  });

  test('snapshots: version 3 cut short is refused (remove it to replay); a version-2 one with a newline after it is still read (found in review: it was read as an empty book)', async () => {
    const dir = await prepaidHistory(20);
    const path = join(dir, 'snapshot.json');
    const text = readFileSync(path, 'utf8');
    const lines = text.trimEnd().split('\n').map((l) => JSON.parse(l) as unknown[]);
    assert.deepEqual(lines.at(-1), ['end']);
    const expected = (await FileLedger.open(dir, { maxSegmentBytes: 1500, logger: quiet }));
    const totals = expected.totals().get('a');
    await expected.close();
    // Cut short at a line's end: refused, not read as a smaller book.
    writeFileSync(path, text.split('\n').slice(0, -2).join('\n') + '\n');
    await assert.rejects(FileLedger.open(dir, { maxSegmentBytes: 1500, logger: quiet }), /cut short.*remove the file/);
    // The same snapshot as version 2 wrote it (one JSON text), then a newline an editor added.
    const header = lines[0] as unknown as { sealed: number; complete: boolean; legacyUpTo: number };
    const cells = new Map<string, unknown[]>();
    for (const [tag, account, group] of lines.filter((l) => l[0] === 'c') as Array<[string, string, unknown[]]>) cells.set(account, [...(cells.get(account) ?? []), ...group]);
    const v2 = {
      version: 2, sealed: header.sealed, complete: header.complete, legacyUpTo: header.legacyUpTo,
      book: { totals: lines.filter((l) => l[0] === 't').flatMap((l) => l[1] as unknown[]), cells: [...cells], credits: lines.filter((l) => l[0] === 'r').flatMap((l) => l[1] as unknown[]) },
      last: lines.filter((l) => l[0] === 'l').flatMap((l) => l[1] as unknown[]),
    };
    writeFileSync(path, `${JSON.stringify(v2)}\n`);
    const old = await FileLedger.open(dir, { maxSegmentBytes: 1500, logger: quiet });
    assert.deepEqual(old.totals().get('a'), totals);
    assert.equal((await allPages(old, 'a', 100)).length, 21);
    await old.close();
  });

  test('a torn last record is cut off with a warning; damage elsewhere stops the start naming file and offset', async () => {
    const { dir, segment, goodSize } = await fiveCharges();
    appendFileSync(segment, encodeRecord(charge('a', 99)).slice(0, 30)); // a crash mid-write
    const warnings: string[] = [];
    const reopened = await FileLedger.open(dir, { logger: new Logger((t) => warnings.push(t)) });
    reopened['logger']?.flush();
    assert.match(warnings.join(''), /torn last record/);
    assert.equal(statSync(segment).size, goodSize);
    assert.equal(reopened.totals().get('a')!.spentMicro, 5);
    await reopened.append(charge('a', 1));
    await reopened.close();

    // Flip one byte in the middle: refused, with the file and the offset.
    const bytes = readFileSync(segment);
    const second = bytes.indexOf(10) + 1;
    bytes[second + 20] = bytes[second + 20] === 0x31 ? 0x32 : 0x31;
    writeFileSync(segment, bytes);
    await assert.rejects(FileLedger.open(dir, { logger: quiet }), (err: unknown) => {
      assert.ok(err instanceof LedgerCorruptError);
      assert.equal(err.offset, second);
      assert.match(err.message, /journal-00000001\.log/);
      return true;
    });
  });

  test('a power loss during the last write: a hole of zeros inside it, later records of the same write after it: the ledger opens, cuts them off and logs each (found in review: it refused to start)', async () => {
    const { dir, segment, goodSize } = await fiveCharges();
    // The last batch, six records, with a disk block never written: zeros from the block's start
    // (the file's next 512-byte boundary) to the end of the record it falls in.
    const records = [10, 20, 30, 40, 50, 60].map((n) => encodeRecord(charge('a', n)));
    const batch = Buffer.from(records.join(''));
    const hole = Math.ceil(goodSize / 512) * 512 - goodSize;
    let k = 0;
    let end = Buffer.byteLength(records[0]!);
    while (end <= hole) end += Buffer.byteLength(records[++k]!);
    assert.ok(k < 5 && hole < end - 1, 'the block boundary falls inside a record with records after it');
    // Zeros that do not start on a block boundary are damage, not a hole: refused.
    appendFileSync(segment, Buffer.from(batch).fill(0, hole + 1, end - 1));
    await assert.rejects(FileLedger.open(dir, { logger: quiet }), LedgerCorruptError);
    truncateSync(segment, goodSize);
    appendFileSync(segment, batch.fill(0, hole, end - 1));
    const warnings: string[] = [];
    const reopened = await FileLedger.open(dir, { logger: new Logger((t) => warnings.push(t)) });
    reopened['logger']?.flush();
    const text = warnings.join('');
    assert.match(text, /zero bytes in a record/);
    assert.equal(text.match(/cut off an unacknowledged record/g)?.length, 5 - k, 'the whole records after the hole, each logged');
    assert.match(text, /"amount_micro":-60/);
    // The records of the batch before the hole were whole: kept, like any torn tail's prefix.
    const kept = records.slice(0, k);
    assert.equal(statSync(segment).size, goodSize + Buffer.byteLength(kept.join('')));
    assert.equal(reopened.totals().get('a')!.spentMicro, 5 + [10, 20, 30, 40, 50].slice(0, k).reduce((x, y) => x + y, 0));
    await reopened.append(charge('a', 1));
    await reopened.close();
    // Zeros in a sealed segment are damage like any other: refused.
    const sealedDir = tmp();
    const sealed = await FileLedger.open(sealedDir, { maxSegmentBytes: 600, logger: quiet });
    for (let i = 0; i < 12; i++) await sealed.append(charge('a', 1));
    await sealed.close();
    const first = join(sealedDir, readdirSync(sealedDir).filter((f) => f.endsWith('.log')).sort()[0]!);
    const bytes = readFileSync(first);
    bytes.fill(0, 512, 560); // on a block boundary, as a hole would be
    writeFileSync(first, bytes);
    rmSync(join(sealedDir, 'snapshot.json')); // replayed from the journal
    await assert.rejects(FileLedger.open(sealedDir, { maxSegmentBytes: 600, logger: quiet }), LedgerCorruptError);
  });

  test('a batch is at most about 1 MiB, so a power loss tears at most that: zeros with more after them stop the start (found in review: one zeroed sector cut a 10 MB journal down to its first 4 KB)', async () => {
    const dir = tmp();
    const ledger = await FileLedger.open(dir, { logger: quiet });
    // 3 MB appended at once: three writes or more, in order, each acknowledged.
    const note = 'n'.repeat(600);
    await Promise.all(Array.from({ length: 5000 }, (_, i) => ledger.append(charge('a', 1, T0 + i, { note }))));
    assert.ok(ledger.stats.commits >= 3, `${ledger.stats.commits} writes`);
    assert.equal(ledger.totals().get('a')!.spentMicro, 5000);
    await ledger.close();
    const segment = join(dir, readdirSync(dir).filter((f) => f.endsWith('.log'))[0]!);
    const bytes = readFileSync(segment);
    const times = bytes.toString('utf8').trimEnd().split('\n').map((line) => JSON.parse(line.slice(line.indexOf('{'))).c as number);
    assert.deepEqual(times, times.toSorted((x, y) => x - y), 'the records in the order appended');
    // One sector of zeros early in the file (a bad sector, not a torn write): refused, nothing cut.
    bytes.fill(0, 4096, 4608);
    writeFileSync(segment, bytes);
    await assert.rejects(FileLedger.open(dir, { logger: quiet }), (err: unknown) => {
      assert.ok(err instanceof LedgerCorruptError);
      assert.match(err.message, /more than one write/);
      return true;
    });
    assert.equal(statSync(segment).size, bytes.length);
  });

  test('a crash between sealing steps is finished on the next start', async () => {
    const dir = tmp();
    const ledger = await FileLedger.open(dir, { maxSegmentBytes: 600, logger: quiet });
    for (let i = 0; i < 12; i++) await ledger.append(charge('a', 1));
    await ledger.close();
    rmSync(join(dir, 'snapshot.json')); // as if the process died before the snapshot was written
    const reopened = await FileLedger.open(dir, { maxSegmentBytes: 600, logger: quiet });
    assert.equal(reopened.totals().get('a')!.spentMicro, 12);
    assert.ok(existsSync(join(dir, 'snapshot.json')));
    assert.equal((await allPages(reopened, 'a', 5)).length, 12);
    await reopened.close();
  });

  test('a failing disk refuses further appends and makes the ledger not ready', async () => {
    const ledger = await FileLedger.open(tmp(), { logger: quiet });
    await ledger['handle']!.close(); // the file handle goes bad underneath
    await assert.rejects(ledger.append(charge('a', 1)), /ledger write failed/);
    assert.equal(ledger.ready(), false);
    await assert.rejects(ledger.append(charge('a', 1)), /ledger write failed/);
  });
});

describe('file ledger: billing history by back pointers', () => {
  /** A journal as the version before back pointers wrote it: a sealed segment with its index and a v1 snapshot, then an open one. */
  function legacyJournal(dir: string, sealedEntries: LedgerEntry[], openEntries: LedgerEntry[]): void {
    const index = new Map<string, number[]>();
    let text = '';
    for (const e of sealedEntries) {
      const line = encodeRecord(e);
      if (e.type !== 'usage') index.set(e.accountId, [...(index.get(e.accountId) ?? []), Buffer.byteLength(text), Buffer.byteLength(line)]);
      text += line;
    }
    writeFileSync(join(dir, 'journal-00000001.log'), text);
    writeFileSync(join(dir, 'journal-00000001.idx'), JSON.stringify([...index]));
    const book = new LedgerBook();
    for (const e of sealedEntries) book.apply(e);
    writeFileSync(join(dir, 'snapshot.json'), JSON.stringify({ version: 1, sealed: 1, book: book.save() }));
    writeFileSync(join(dir, 'journal-00000002.log'), openEntries.map((e) => encodeRecord(e)).join(''));
  }

  test('a journal written before back pointers: old and new entries page together, old cursors still work', async () => {
    const dir = tmp();
    const mixed = (n: number) => Array.from({ length: n }, (_, i) => charge(i % 3 === 0 ? 'b' : 'a', 1 + i));
    const sealed = mixed(30);
    const open = mixed(12);
    legacyJournal(dir, sealed, open);
    const expected = [...sealed, ...open].filter((e) => e.accountId === 'a').map((e) => e.id);
    let ledger = await FileLedger.open(dir, { maxSegmentBytes: 4000, logger: quiet });
    // An old-format cursor (segment.offset of the last entry returned) from before the upgrade.
    const firstOld = await ledger.history('a', 5, null);
    assert.deepEqual(firstOld.entries.map((e) => e.id), [...expected].reverse().slice(0, 5));
    for (let i = 0; i < 25; i++) {
      const e = charge(i % 2 === 0 ? 'a' : 'c', 100 + i);
      if (e.accountId === 'a') expected.push(e.id);
      await ledger.append(e);
    }
    await ledger.close();
    ledger = await FileLedger.open(dir, { maxSegmentBytes: 4000, logger: quiet });
    for (let i = 0; i < 7; i++) {
      const e = charge('a', 200 + i);
      expected.push(e.id);
      await ledger.append(e);
    }
    for (const limit of [1, 4, 9, 100]) {
      assert.deepEqual((await allPages(ledger, 'a', limit)).map((e) => e.id), [...expected].reverse(), `limit ${limit}`);
    }
    assert.equal((await allPages(ledger, 'c', 3)).length, 12);
    assert.equal((await allPages(ledger, 'b', 2)).length, sealed.concat(open).filter((e) => e.accountId === 'b').length);
    const legacy = /^\d+\.\d+$/;
    const pages: string[] = [];
    for (let after: string | null = null, i = 0; i < 100; i++) {
      const page: Awaited<ReturnType<FileLedger['history']>> = await ledger.history('a', 6, after);
      if (page.nextCursor !== null) pages.push(page.nextCursor);
      if (!page.hasMore) break;
      after = page.nextCursor;
    }
    assert.ok(pages.some((c) => legacy.test(c)) && pages.some((c) => !legacy.test(c)), `both kinds of cursor: ${pages.join(' ')}`);
    // An old-style cursor too must name a record of this account the ledger could have handed out.
    const oldOne = pages.find((c) => legacy.test(c))!;
    const [seg, offset] = oldOne.split('.').map(Number) as [number, number];
    let theirs: string | null = null;
    for (let after: string | null = null; theirs === null;) {
      const page: Awaited<ReturnType<FileLedger['history']>> = await ledger.history('b', 2, after);
      if (page.nextCursor !== null && legacy.test(page.nextCursor)) theirs = page.nextCursor;
      assert.ok(page.hasMore || theirs !== null, 'b has an old-style cursor');
      after = page.nextCursor;
    }
    for (const cursor of [theirs, `${seg}.${offset + 1}`, `0.${offset}`, `${seg + 99}.0`]) {
      await assert.rejects(async () => ledger.history('a', 5, cursor), (err: Error) => /cursor/.test(err.message), cursor);
    }
    await ledger.close();
  });

  test('a cursor names a whole record of this account, within what is durable, or it is refused', async () => {
    const ledger = await FileLedger.open(tmp(), { logger: quiet });
    for (let i = 0; i < 6; i++) await ledger.append(charge(i % 2 === 0 ? 'a' : 'b', 1));
    const page = await ledger.history('a', 1, null);
    const [seq, offset, length] = page.nextCursor!.split('.').map(Number) as [number, number, number];
    const theirs = (await ledger.history('b', 1, null)).nextCursor!;
    for (const cursor of [theirs, `${seq}.${offset + 1}.${length}`, `${seq}.${offset}.${length + 1}`, `${seq}.${offset}.99999999`,
      `${seq + 1}.0.200`, `${seq}.9999999.200`, 'x', '1.2.3.4', '']) {
      await assert.rejects(async () => ledger.history('a', 5, cursor), (err: Error) => /cursor/.test(err.message), cursor);
    }
    assert.equal((await ledger.history('a', 5, page.nextCursor)).entries.length, 2);
    await ledger.close();
  });
});
