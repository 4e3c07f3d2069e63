import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits } from '../../src/limiter/types.js';
import { startGateway, testConfig, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Found in review, with the Redis limiter:
 * - an admin credit set the account's `credited` flag, which stands for the one-time initial
 *   credit: an account credited by an admin before its initial credit went through (Redis away
 *   at start) never got its `balanceUsd`;
 * - an initial credit whose answer was lost to a timeout after Redis had applied it was, on
 *   retry, "not given" (and never recorded in the ledger);
 * - the same credit (one Idempotency-Key) sent to two instances raised the shared balance twice.
 */
describe('regression: Redis credits', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  const limiters: RedisLimiter[] = [];
  const limiter = async (prefix: string) => {
    const lim = new RedisLimiter({ url: server.url, prefix, timeoutMs: 1000 });
    limiters.push(lim);
    await lim.whenReady(3000);
    return lim;
  };
  before(async () => { await server.start(); });
  after(async () => {
    for (const lim of limiters) await lim.close();
    await server.stop();
  });
  const account = (id: string): AccountLimits => ({ id, rpm: null, concurrency: null, dailyCapMicro: null, prepaid: true });

  test('an admin credit does not stand for the initial credit; a retried attempt is recognised, another is not', async () => {
    const lim = await limiter('cr1:');
    assert.equal(await lim.credit('a', 300, 'k:top-up'), 300);
    assert.equal(await lim.creditOnce('a', 5000, 'attempt-1'), 5300, 'the initial credit is still given');
    assert.equal(await lim.creditOnce('a', 5000, 'attempt-1'), 5300, 'the same attempt retried: given (once), so it is recorded');
    assert.equal(await lim.creditOnce('a', 5000, 'attempt-2'), null, 'any other attempt: not given again');
    assert.equal((await lim.snapshot(account('a'))).balanceMicro, 5300);
  });

  test('one Idempotency-Key sent to two instances raises the shared balance once', async () => {
    const admin = 'admin-redis-credits';
    const config = testConfig({
      plans: { p: { rpm: 1000, concurrency: 10 } },
      accounts: { acct_r: { plan: 'p', balanceUsd: 1 } },
      keys: { key_r: { account: 'acct_r', key: 'sk-r' } },
    });
    const a: Running = await startGateway(config, { adminKey: admin, limiter: await limiter('cr2:') });
    const b: Running = await startGateway(config, { adminKey: admin, limiter: await limiter('cr2:') });
    try {
      const credit = async (gw: Running) => {
        const res = await fetch(`${gw.url}/admin/v1/accounts/acct_r/credits`, {
          method: 'POST', headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json', 'idempotency-key': 'invoice-9' },
          body: JSON.stringify({ amountUsd: 2 }),
        });
        assert.equal(res.status, 201);
        await res.text();
      };
      await credit(a);
      await credit(b);
      const balance = async (gw: Running) => ((await (await fetch(`${gw.url}/v1/balance`, { headers: { authorization: 'Bearer sk-r' } })).json()) as { balance: number }).balance;
      assert.equal(await balance(a), 3, 'the initial $1 and one $2 credit');
      assert.equal(await balance(b), 3);
    } finally {
      await a.close();
      await b.close();
    }
  });
});
