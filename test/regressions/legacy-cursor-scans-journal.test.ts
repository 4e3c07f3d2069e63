import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { GatewayError } from '../../src/errors.js';
import { FileLedger } from '../../src/ledger/file.js';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { Logger } from '../../src/log.js';

/**
 * Found in review: an old-style cursor (`segment.offset`, from before back pointers) was still
 * accepted on journals that have pointers, and sent history down the segment indexes: any key
 * could make the ledger read and parse every segment of the journal (1.4 s and 118 ms stalls on
 * 300,000 records). Now the index walk never goes above the newest segment written before
 * pointers, which a journal begun with pointers does not have; and such a cursor, which that
 * journal never handed out, is a 400 naming `after` (it was an empty page).
 */
test('regression: an old-style cursor reads nothing of a journal that has back pointers', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mg-legacy-cursor-'));
  const ledger = await FileLedger.open(dir, { maxSegmentBytes: 1000, logger: new Logger(() => {}) });
  let n = 0;
  const charge = (accountId: string): LedgerEntry => ({
    id: `t${++n}`, type: 'charge', accountId, keyId: 'k', amountMicro: -1, balanceAfterMicro: null, balanceUnknown: false, createdAt: Date.now(),
    requestId: `r${n}`, model: 'm', inputTokens: 1, outputTokens: 1, estimated: false, note: null, idempotencyKey: null, deployment: null,
  });
  for (let i = 0; i < 60; i++) await ledger.append(charge(i % 2 === 0 ? 'a' : 'b'));
  assert.ok(readdirSync(dir).filter((f) => f.endsWith('.log')).length > 3, 'several segments');
  // And it is refused as what it is, a cursor this ledger never handed out (it was an empty page).
  for (const cursor of ['9999999999.0', '3.0', '1.999999']) {
    await assert.rejects(ledger.history('a', 20, cursor), (err: GatewayError) => err.code === 'invalid_request' && err.details.fields?.param === 'after', cursor);
  }
  assert.equal((ledger as unknown as { legacyIndexes: Map<number, unknown> }).legacyIndexes.size, 0, 'no segment index was built');
  assert.ok(!readdirSync(dir).some((f) => f.endsWith('.idx')), 'no segment was scanned');
  assert.equal((await ledger.history('a', 100, null)).entries.length, 30);
  await ledger.close();
});
