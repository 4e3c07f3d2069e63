import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { DAY_MS } from '../../src/clock.js';
import { FileLedger } from '../../src/ledger/file.js';
import { importFileLedger } from '../../src/ledger/import.js';
import { PostgresLedger } from '../../src/ledger/postgres.js';
import type { Ledger, LedgerEntry } from '../../src/ledger/types.js';
import { Logger } from '../../src/log.js';
import { testConfig } from '../helpers/gateway.js';
import { dropSchema, freshSchema, noPostgres, PG_URL } from '../helpers/postgres.js';

const run = promisify(execFile);
const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');
const quiet = new Logger(() => {});
const T0 = Date.UTC(2026, 10, 20, 12);
let n = 0;

function entry(accountId: string, micro: number, at: number, extra: Partial<LedgerEntry> = {}): LedgerEntry {
  n++;
  return {
    id: `txn_i${n}`, type: 'charge', accountId, keyId: 'k1', amountMicro: -micro, balanceAfterMicro: null, balanceUnknown: false, createdAt: at,
    requestId: `req_i${n}`, model: 'm1', inputTokens: 10, outputTokens: 5, estimated: false, note: null, idempotencyKey: null, deployment: 'p1', ...extra,
  };
}
const credit = (accountId: string, micro: number, at: number, idempotencyKey: string | null) => entry(accountId, -micro, at, {
  type: 'credit', keyId: null, model: null, deployment: null, inputTokens: 0, outputTokens: 0, balanceAfterMicro: micro, idempotencyKey, note: 'top-up',
});

async function historyIds(ledger: Ledger, account: string): Promise<string[]> {
  const ids: string[] = [];
  let after: string | null = null;
  for (;;) {
    const page = await ledger.history(account, 50, after);
    ids.push(...page.entries.map((e) => e.id));
    if (!page.hasMore) return ids;
    after = page.nextCursor;
  }
}

/**
 * A fleet moving from file ledgers to PostgreSQL keeps its books: `import-ledger` copies a
 * file ledger's entries (every segment, oldest first) into the config's PostgreSQL ledger, where
 * balances, today's spend, usage and billing history then read as they did from the file
 * (before: the books started empty, prepaid balances included). Running it again, or importing
 * two instances' ledgers that both recorded one admin credit, counts each once.
 */
describe('import-ledger: a file ledger\'s books moved into PostgreSQL', { skip: noPostgres }, () => {
  const schemas: string[] = [];
  after(() => { for (const s of schemas) dropSchema(s); });

  async function fileLedger(entries: LedgerEntry[]): Promise<string> {
    const dir = mkdtempSync(join(tmpdir(), 'mg-import-'));
    const ledger = await FileLedger.open(dir, { maxSegmentBytes: 2000, logger: quiet });
    for (const e of entries) await ledger.append(e);
    await ledger.close();
    return dir;
  }

  test('balances, spend, usage and history read the same from PostgreSQL; a second run and a second instance\'s copy of a credit count once', async () => {
    const shared = credit('a', 5_000_000, T0, 'topup-1'); // sent to both instances, recorded by each
    const first = [credit('a', 1_000_000, T0 - DAY_MS, null), shared];
    for (let i = 0; i < 30; i++) first.push(entry(i % 3 === 0 ? 'b' : 'a', 100 + i, T0 - DAY_MS + i * 3_600_000, { balanceAfterMicro: i % 3 === 0 ? null : 1 }));
    const dirA = await fileLedger(first);
    const dirB = await fileLedger([{ ...shared, id: 'txn_other_instance' }, entry('a', 7, T0 + 1000, { balanceAfterMicro: 1 })]);
    const schema = freshSchema();
    schemas.push(schema);

    const pg = await PostgresLedger.open({ url: PG_URL, schema, logger: quiet });
    try {
      assert.deepEqual(await importFileLedger(dirA, pg, quiet), { imported: 32, refused: 0 });
      assert.deepEqual(await importFileLedger(dirA, pg, quiet), { imported: 32, refused: 0 }, 'again: each kept once');
      assert.deepEqual(await importFileLedger(dirB, pg, quiet), { imported: 2, refused: 0 });
    } finally {
      await pg.close();
    }

    const file = await FileLedger.open(dirA, { logger: quiet });
    const books = await PostgresLedger.open({ url: PG_URL, schema, logger: quiet });
    try {
      const a = file.totals().get('a')!;
      // Instance B added a charge of 7 today; its copy of the shared credit counts once.
      assert.deepEqual(books.totals().get('a'), { ...a, balanceMicro: a.balanceMicro - 7, spentMicro: a.spentMicro + 7 });
      assert.deepEqual(books.totals().get('b'), file.totals().get('b'));
      const d = Math.floor(T0 / DAY_MS);
      assert.deepEqual(await books.usage('b', d - 1, d, 'day'), await file.usage('b', d - 1, d, 'day'));
      assert.deepEqual((await historyIds(books, 'b')), await historyIds(file, 'b'));
      assert.equal((await books.creditByKey('a', 'topup-1'))?.amountMicro, 5_000_000);
    } finally {
      await file.close();
      await books.close();
    }
  });

  test('a credit whose key was used again after the file ledger forgot it (7 days on) cannot be kept by PostgreSQL (keys for ever): refused and logged, not counted as imported (found in review); a directory without a journal is refused', async () => {
    const dir = await fileLedger([credit('d', 1_000_000, T0 - 10 * DAY_MS, 'monthly'), credit('d', 2_000_000, T0, 'monthly'), entry('d', 5, T0 + 1)]);
    const schema = freshSchema();
    schemas.push(schema);
    const logs: string[] = [];
    const pg = await PostgresLedger.open({ url: PG_URL, schema, logger: quiet });
    try {
      const logger = new Logger((t) => logs.push(t));
      assert.deepEqual(await importFileLedger(dir, pg, logger), { imported: 2, refused: 1 });
      await logger.flush();
      assert.match(logs.join(''), /holds Idempotency-Key \\"monthly\\" for another credit.*"amount_micro":2000000/);
      await assert.rejects(importFileLedger(mkdtempSync(join(tmpdir(), 'mg-empty-')), pg, quiet), /holds no file ledger/);
    } finally {
      await pg.close();
    }
  });

  test('the command: copies into the config\'s PostgreSQL ledger and says how many; refuses a config that is not PostgreSQL, and a running gateway\'s directory', async () => {
    const dir = await fileLedger([credit('c', 2_000_000, T0, null), entry('c', 300, T0 + 1, { balanceAfterMicro: 1_999_700 })]);
    const schema = freshSchema();
    schemas.push(schema);
    const configs = mkdtempSync(join(tmpdir(), 'mg-import-config-'));
    const pgConfig = join(configs, 'pg.json');
    writeFileSync(pgConfig, JSON.stringify(testConfig({ ledger: { store: 'postgres', url: PG_URL, schema } })));
    const done = await run(process.execPath, [MAIN, 'import-ledger', dir, '--config', pgConfig]);
    assert.match(done.stderr, /imported 2 entries .* 0 refused/);
    const books = await PostgresLedger.open({ url: PG_URL, schema, logger: quiet });
    try {
      assert.equal(books.totals().get('c')!.balanceMicro, 1_999_700);
    } finally {
      await books.close();
    }

    const fileConfig = join(configs, 'file.json');
    writeFileSync(fileConfig, JSON.stringify(testConfig({ ledger: { store: 'file', dir } })));
    await assert.rejects(run(process.execPath, [MAIN, 'import-ledger', dir, '--config', fileConfig]), /ledger.store "file"/);
    const running = await FileLedger.open(dir, { logger: quiet }); // a gateway holding it
    try {
      await assert.rejects(run(process.execPath, [MAIN, 'import-ledger', dir, '--config', pgConfig]), /in use by another gateway/);
    } finally {
      await running.close();
    }
  });
});
