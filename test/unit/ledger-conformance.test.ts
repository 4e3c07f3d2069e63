import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { DAY_MS } from '../../src/clock.js';
import { LedgerBook } from '../../src/ledger/book.js';
import { FileLedger } from '../../src/ledger/file.js';
import { MemoryLedger } from '../../src/ledger/memory.js';
import { PostgresAdminStore } from '../../src/admin/postgres-state.js';
import { emptyAdminState, toJson } from '../../src/admin/state.js';
import { PostgresLedger } from '../../src/ledger/postgres.js';
import type { Ledger, LedgerEntry } from '../../src/ledger/types.js';
import { Logger } from '../../src/log.js';
import { rng } from '../helpers/fake-clock.js';
import { until } from '../helpers/gateway.js';
import { dropSchema, freshSchema, noPostgres, PG_URL, sql } from '../helpers/postgres.js';

const T0 = Date.UTC(2026, 0, 15, 10);
const quiet = new Logger(() => {});
let n = 0;
function entry(accountId: string, micro: number, extra: Partial<LedgerEntry> = {}): LedgerEntry {
  n++;
  return {
    id: `txn_c${n}`, type: 'charge', accountId, keyId: 'k1', amountMicro: -micro, balanceAfterMicro: null, balanceUnknown: false, createdAt: T0,
    requestId: `req_c${n}`, model: 'm1', inputTokens: 10, outputTokens: 5, estimated: false, note: null, idempotencyKey: null,
    deployment: 'p1', ...extra,
  };
}

/** A ledger store to run the suite against: open (again, on the same data) and clean up. */
interface Store {
  kind: string;
  skip: string | false;
  open(): Promise<Ledger>;
  /** Whether the data outlives the ledger object (reopened: the same books). */
  durable: boolean;
}

const schemas: string[] = [];
/** Ledgers open now: a test that fails before it closes its own must not leave a pool that keeps the run alive. */
const opened = new Set<Ledger>();
after(async () => {
  await Promise.all([...opened].map((l) => Promise.resolve(l.close()).catch(() => {})));
  for (const s of schemas) dropSchema(s);
});

/** Opens a store's ledger, closed by the hook above if its test does not. */
async function openTracked(store: Store): Promise<Ledger> {
  return track(await store.open());
}
async function openPostgres(options: Parameters<typeof PostgresLedger.open>[0]): Promise<PostgresLedger> {
  return track(await PostgresLedger.open(options));
}
function track<L extends Ledger>(ledger: L): L {
  if (!opened.has(ledger)) {
    opened.add(ledger);
    const close = ledger.close.bind(ledger);
    ledger.close = () => {
      opened.delete(ledger);
      return close();
    };
  }
  return ledger;
}

function stores(): Store[] {
  const dir = mkdtempSync(join(tmpdir(), 'mg-conformance-'));
  const schema = freshSchema();
  schemas.push(schema);
  let memory: MemoryLedger | null = null;
  return [
    { kind: 'memory', skip: false, durable: false, open: async () => (memory ??= new MemoryLedger()) },
    { kind: 'file', skip: false, durable: true, open: () => FileLedger.open(dir, { maxSegmentBytes: 4000, logger: quiet }) },
    { kind: 'postgres', skip: noPostgres, durable: true, open: () => openPostgres({ url: PG_URL, schema, logger: quiet }) },
  ];
}

async function allPages(ledger: Ledger, account: string, limit: number, after: string | null = null): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < 10_000; i++) {
    const page = await ledger.history(account, limit, after);
    out.push(...page.entries.map((e) => e.id));
    if (!page.hasMore) return out;
    after = page.nextCursor;
  }
  throw new Error('pagination did not end');
}

for (const store of stores()) {
  describe(`ledger conformance: ${store.kind}`, { skip: store.skip }, () => {
    test('balances, the latest day\'s spend, usage by day/model/key and billing history agree with the book (and survive a reopen)', async () => {
      const r = rng(5);
      const book = new LedgerBook();
      let ledger = await openTracked(store);
      const history: string[] = [];
      const entries: LedgerEntry[] = [];
      for (let i = 0; i < 150; i++) {
        const day = Math.floor(r() * 3);
        const account = r() < 0.8 ? 'a' : 'b';
        const kind = r();
        const e = kind < 0.1
          ? entry(account, -(1000 + i), { type: 'credit', model: null, keyId: null, deployment: null, requestId: null, balanceAfterMicro: 5000, createdAt: T0 + day * DAY_MS })
          : entry(account, kind < 0.2 ? 0 : 1 + Math.floor(r() * 500), {
            type: kind < 0.2 ? 'usage' : 'charge', createdAt: T0 + day * DAY_MS + i, model: r() < 0.5 ? 'm1' : 'm2', keyId: r() < 0.5 ? 'k1' : 'k2',
            ...(r() < 0.5 ? { balanceAfterMicro: 1000 } : { balanceAfterMicro: null, balanceUnknown: r() < 0.3 }),
          });
        entries.push(e);
      }
      // Appended in one burst (group commit) and in ones.
      await Promise.all(entries.slice(0, 100).map((e) => ledger.append(e)));
      for (const e of entries.slice(100)) await ledger.append(e);
      for (const e of entries) {
        book.apply(e);
        if (e.accountId === 'a' && e.type !== 'usage') history.push(e.id);
      }
      const check = async (l: Ledger, when: string) => {
        for (const account of ['a', 'b']) {
          assert.deepEqual(l.totals().get(account), book.totals.get(account), `${when}: totals of ${account}`);
          for (const groupBy of ['day', 'model', 'key'] as const) {
            assert.deepEqual(await l.usage(account, 0, 1_000_000, groupBy), book.usage(account, 0, 1_000_000, groupBy), `${when}: usage by ${groupBy}`);
          }
        }
        const today = Math.floor(T0 / DAY_MS) + 1;
        assert.deepEqual(await l.usage('a', today, today, 'day'), book.usage('a', today, today, 'day'), `${when}: one day`);
        for (const limit of [1, 9, 100]) assert.deepEqual(await allPages(l, 'a', limit), [...history].reverse(), `${when}: history by ${limit}`);
      };
      await check(ledger, 'live');
      if (store.durable) {
        await ledger.close();
        ledger = await openTracked(store);
        await check(ledger, 'reopened');
      }
      // New charges between pages shift nothing; bad cursors are refused; nobody's history is empty.
      const first = await ledger.history('a', 10, null);
      for (let i = 0; i < 5; i++) await ledger.append(entry('a', 1));
      assert.deepEqual([...first.entries.map((e) => e.id), ...await allPages(ledger, 'a', 10, first.nextCursor)], [...history].reverse());
      await assert.rejects(async () => ledger.history('a', 10, 'garbage'), /cursor/);
      assert.deepEqual(await ledger.history('nobody', 10, null), { entries: [], hasMore: false, nextCursor: null });
      await ledger.close();
    });

    test('an admin credit is found by its Idempotency-Key; entries keep every field', async () => {
      const ledger = await openTracked(store);
      const credit = entry('c', -7_000_000, {
        type: 'credit', model: null, keyId: null, deployment: null, balanceAfterMicro: 7_000_000, note: 'top-up', idempotencyKey: 'idem-1', requestId: 'req_admin',
        createdAt: Date.now(), // recent: given again to a shared limiter at start
      });
      const call = entry('c', 1234, { estimated: true, deployment: 'anthropic-b', inputTokens: 123_456_789, outputTokens: 42, balanceUnknown: true });
      await ledger.append(credit);
      await ledger.append(call);
      assert.deepEqual(await ledger.creditByKey('c', 'idem-1'), credit);
      assert.equal(await ledger.creditByKey('c', 'idem-2'), undefined);
      assert.equal(await ledger.creditByKey('other', 'idem-1'), undefined);
      assert.deepEqual((await ledger.history('c', 10, null)).entries, [call, credit]);
      assert.ok([...ledger.recentCredits()].some((e) => e.id === credit.id), 'a recent admin credit is among the recent credits');
      if (store.durable) {
        await ledger.close();
        const reopened = await openTracked(store);
        assert.ok([...reopened.recentCredits()].some((e) => e.id === credit.id), 'and still after a reopen');
        await reopened.close();
        return;
      }
      await ledger.close();
    });
  });
}

describe('postgres admin store (a stand-in database)', () => {
  test('a newer version found by the regular check is announced once until it is read (found in review: every check queued another read)', async () => {
    const state = toJson(emptyAdminState());
    let reads = 0;
    const pool = { query: () => { reads++; return Promise.resolve({ rows: [{ version: 1, state }] }); } };
    const listener = {
      connect: () => Promise.resolve(),
      query: (text: string) => Promise.resolve({ rows: text.startsWith('SELECT') ? [{ version: 5 }] : [] }),
      on: () => listener,
      end: () => Promise.resolve(),
    };
    const store = await PostgresAdminStore.open({ pool: pool as never, listener: () => listener, schema: 'stand_in', logger: quiet, checkMs: 10 });
    try {
      let announced = 0;
      store.watch(() => { announced++; });
      await until(() => announced === 1, 2000, 'the newer version announced');
      await new Promise((r) => setTimeout(r, 100)); // ten more checks
      assert.equal(announced, 1, 'once, until it is read');
      await store.reload(); // read (still behind: the stand-in never moves): announced again
      await until(() => announced === 2, 2000, 'announced again after the read');
      assert.equal(reads, 2);
    } finally {
      await store.close();
    }
  });
});

describe('postgres ledger, its database failing under it (a stand-in pool)', () => {
  test('the waiters of entries queued behind a batch that fails are refused at once, not when the database is back (found in review: they waited out the outage)', async () => {
    const pending: Array<{ reject: (err: Error) => void }> = [];
    const pool = {
      query: (q: unknown) => typeof q === 'string' ? Promise.reject(new Error('connection refused'))
        : new Promise((_resolve, reject) => { pending.push({ reject }); }),
      connect: () => Promise.reject(new Error('not used')),
      end: () => Promise.resolve(),
    };
    const Ledger = PostgresLedger as unknown as new (...args: unknown[]) => PostgresLedger;
    const ledger = new Ledger(pool, new Set(), 'stand_in', { logger: quiet, retryMs: 60_000 });
    const tick = () => new Promise((r) => setImmediate(r));
    const first = ledger.append(entry('w', 1));
    await tick();
    const second = ledger.append(entry('w', 2));
    await tick();
    const third = ledger.append(entry('w', 3)); // both writes under way: it waits in the queue
    await tick();
    assert.equal(pending.length, 2);
    for (const p of pending) p.reject(Object.assign(new Error('connection terminated'), { code: '57P01' }));
    for (const waiter of [first, second, third]) await assert.rejects(waiter, (err: { code?: string }) => err.code === 'ledger_unavailable');
    assert.equal(ledger.ready(), false);
  });

  test('a write scheduled before the database was found away waits for the retry: a refused call is never recorded as answered (found in review)', async () => {
    let writes = 0;
    const pool = {
      query: (q: unknown) => {
        if (typeof q === 'string') return Promise.reject(new Error('timeout exceeded when trying to connect'));
        writes++;
        return Promise.resolve({ rows: [] });
      },
      connect: () => Promise.reject(new Error('not used')),
      end: () => Promise.resolve(),
    };
    const Ledger = PostgresLedger as unknown as new (...args: unknown[]) => PostgresLedger;
    const ledger = new Ledger(pool, new Set(), 'stand_in', { logger: quiet, retryMs: 60_000 });
    const waiter = ledger.append(entry('w', 1)); // its write is scheduled (the next turn)
    (ledger as unknown as { beat(): void }).beat(); // and the heartbeat finds the database away first
    await assert.rejects(waiter, (err: { code?: string }) => err.code === 'ledger_unavailable');
    await new Promise((r) => setImmediate(r));
    assert.equal(writes, 0, 'not written while the ledger is down: the retry writes it');
  });
});

describe('postgres ledger', { skip: noPostgres }, () => {
  test('a write sent again (same entry id) is recorded once: balances and usage count it once', async () => {
    const schema = freshSchema();
    schemas.push(schema);
    const ledger = await openPostgres({ url: PG_URL, schema, logger: quiet });
    const e = entry('dup', 300);
    await Promise.all([ledger.append(e), ledger.append(e)]); // in one statement
    await ledger.append(e); // and in another
    assert.equal(sql(`SELECT count(*) FROM "${schema}".entries`), '1');
    assert.equal(sql(`SELECT requests || ' ' || cost_micro FROM "${schema}".usage_daily`), '1 300');
    await ledger.close();
    const again = await openPostgres({ url: PG_URL, schema, logger: quiet });
    assert.equal(again.totals().get('dup')!.spentMicro, 300);
    await again.close();
  });

  test('an entry the database refuses (a NUL in a note) is logged and refused alone; the rest of its commit is recorded', async () => {
    const schema = freshSchema();
    schemas.push(schema);
    const logs: string[] = [];
    const ledger = await openPostgres({ url: PG_URL, schema, logger: new Logger((t) => logs.push(t)) });
    const good = [entry('p', 1), entry('p', 2)];
    const bad = entry('p', -5, { type: 'credit', model: null, keyId: null, deployment: null, note: 'nul\u0000', requestId: 'req_admin_x' });
    const results = await Promise.allSettled([ledger.append(good[0]!), ledger.append(bad), ledger.append(good[1]!)]);
    assert.deepEqual(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
    assert.equal(sql(`SELECT count(*) FROM "${schema}".entries`), '2');
    assert.equal(ledger.ready(), true, 'still taking entries');
    await ledger.append(entry('p', 3));
    await ledger.close();
    assert.match(logs.join(''), /refused an entry/);
  });

  test('a schema of version 1 (entries written before `balance_unknown`) is migrated: its entries read as known balances', async () => {
    const schema = freshSchema();
    schemas.push(schema);
    await (await openPostgres({ url: PG_URL, schema, logger: quiet })).close();
    sql(`DELETE FROM "${schema}".schema_version WHERE version = 2; ALTER TABLE "${schema}".entries DROP COLUMN balance_unknown`);
    sql(`INSERT INTO "${schema}".entries (id, type, account_id, amount_micro, balance_after_micro, created_at, input_tokens, output_tokens, estimated)
      VALUES ('txn_old', 'charge', 'v1', -5, 95, ${T0}, 1, 1, false)`);
    const ledger = await openPostgres({ url: PG_URL, schema, logger: quiet });
    const [old] = (await ledger.history('v1', 10, null)).entries;
    assert.equal(old!.balanceUnknown, false);
    assert.equal(old!.balanceAfterMicro, 95);
    await ledger.close();
  });

  test('instances starting at once create the schema once (advisory lock); a newer schema is refused', async () => {
    const schema = freshSchema();
    schemas.push(schema);
    const ledgers = await Promise.all([1, 2, 3, 4].map(() => openPostgres({ url: PG_URL, schema, logger: quiet })));
    assert.equal(sql(`SELECT string_agg(version::text, ',' ORDER BY version) FROM "${schema}".schema_version`), '1,2');
    await Promise.all(ledgers.map((l) => l.close()));
    sql(`INSERT INTO "${schema}".schema_version (version) VALUES (99)`);
    await assert.rejects(openPostgres({ url: PG_URL, schema, logger: quiet }), /version 99, newer than this gateway knows/);
  });
});
