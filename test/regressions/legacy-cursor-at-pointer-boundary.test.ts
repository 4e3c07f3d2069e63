import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { LedgerBook } from '../../src/ledger/book.js';
import { FileLedger } from '../../src/ledger/file.js';
import { encodeRecord } from '../../src/ledger/record.js';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { Logger } from '../../src/log.js';

/**
 * Found in review of the old-style cursor check (a cursor the ledger cannot have handed out is
 * 400): a page that read down the back pointers and stopped on the account's first record
 * written with one, in a segment that also holds records from before pointers, handed out an
 * old-style cursor naming that record, which the check then refused. Every page is reachable
 * again, at every page size.
 */
const T0 = Date.UTC(2026, 0, 1);
let n = 0;
function charge(accountId: string): LedgerEntry {
  n++;
  return {
    id: `txn_${n}`, type: 'charge', accountId, keyId: 'k', amountMicro: -n, balanceAfterMicro: null, balanceUnknown: false, createdAt: T0 + n,
    requestId: `req_${n}`, model: 'm', inputTokens: 1, outputTokens: 1, estimated: false, note: null, idempotencyKey: null, deployment: null,
  };
}

test('regression: an old-style cursor handed out at the back pointers\' boundary is taken back', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mg-boundary-'));
  // A journal as the version before back pointers left it: a sealed segment of a's, and an open one of b's.
  const sealed = [charge('a'), charge('a')];
  const index = new Map<string, number[]>();
  let text = '';
  for (const e of sealed) {
    const line = encodeRecord(e);
    index.set(e.accountId, [...(index.get(e.accountId) ?? []), Buffer.byteLength(text), Buffer.byteLength(line)]);
    text += line;
  }
  writeFileSync(join(dir, 'journal-00000001.log'), text);
  writeFileSync(join(dir, 'journal-00000001.idx'), JSON.stringify([...index]));
  const book = new LedgerBook();
  for (const e of sealed) book.apply(e);
  writeFileSync(join(dir, 'snapshot.json'), JSON.stringify({ version: 1, sealed: 1, book: book.save() }));
  writeFileSync(join(dir, 'journal-00000002.log'), [charge('b'), charge('b')].map((e) => encodeRecord(e)).join(''));
  const ledger = await FileLedger.open(dir, { logger: new Logger(() => {}) });
  const added = [charge('a'), charge('a')];
  for (const e of added) await ledger.append(e);
  const expected = [...sealed, ...added].reverse().map((e) => e.id);
  for (const limit of [1, 2, 3, 5]) {
    const seen: string[] = [];
    for (let after: string | null = null, i = 0; i < 10; i++) {
      const page: Awaited<ReturnType<FileLedger['history']>> = await ledger.history('a', limit, after);
      seen.push(...page.entries.map((e) => e.id));
      if (!page.hasMore) break;
      after = page.nextCursor;
    }
    assert.deepEqual(seen, expected, `limit ${limit}`);
  }
  await ledger.close();
});
