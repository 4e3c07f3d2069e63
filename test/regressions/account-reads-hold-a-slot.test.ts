import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MemoryLedger } from '../../src/ledger/memory.js';
import type { GroupBy, HistoryPage, UsageRow } from '../../src/ledger/types.js';
import { chatBody, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: billing history and usage, which await the file or PostgreSQL ledger, were
 * admitted as instant requests and held no concurrency slot while they waited: thousands of one
 * key's reads ran at once and slowed every other tenant's calls. The contract counts every
 * authenticated /v1/ request toward concurrency; they now hold a slot until their answer closes.
 */
/**
 * A ledger whose reads wait until the test lets them go, as a file or PostgreSQL read waits for
 * its I/O (the Ledger interface allows a promise; the memory ledger's own type says it never
 * gives one, hence the casts).
 */
class SlowReads extends MemoryLedger {
  waiting: Array<() => void> = [];
  override history(accountId: string, limit: number, after: string | null): HistoryPage {
    return new Promise((resolve) => this.waiting.push(() => resolve(super.history(accountId, limit, after)))) as unknown as HistoryPage;
  }
  override usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): UsageRow[] {
    return new Promise((resolve) => this.waiting.push(() => resolve(super.usage(accountId, startDay, endDay, groupBy)))) as unknown as UsageRow[];
  }
}

const ledger = new SlowReads();
let gw: Running;
before(async () => {
  gw = await startGateway(testConfig({
    plans: { one: { rpm: 1000, concurrency: 1 } },
    accounts: { acct_c: { plan: 'one' } },
    keys: { key_c: { account: 'acct_c', key: 'sk-c' } },
  }), { ledger });
});
after(() => gw.close());

for (const path of ['/v1/billing/history', '/v1/usage']) {
  test(`regression: ${path} holds the plan's one slot while it reads, and gives it back when answered`, async () => {
    const reading = fetch(`${gw.url}${path}`, { headers: { authorization: 'Bearer sk-c' } });
    await until(() => ledger.waiting.length === 1, 2000, 'the read waiting for the ledger');
    const refused = await postJson(`${gw.url}/v1/chat/completions`, 'sk-c', chatBody('echo-1'));
    assert.equal(refused.status, 429);
    assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'concurrency_limit_exceeded');
    ledger.waiting.pop()!();
    const read = await reading;
    assert.equal(read.status, 200);
    await read.text();
    const account = gw.gateway.directory.accounts.get('acct_c')!;
    await until(async () => (await gw.gateway.limiter.snapshot(account)).inFlight === 0, 2000, 'the read\'s slot given back');
    const next = await postJson(`${gw.url}/v1/chat/completions`, 'sk-c', chatBody('echo-1'));
    assert.equal(next.status, 200);
    await next.text();
  });
}
