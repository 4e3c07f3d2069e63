import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { RedisLimiter } from '../../src/limiter/redis.js';
import { chatBody, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Redis answers an admission after its deadline (frozen for longer than `timeoutMs`, then back):
 * the request got its 503, yet Redis ran the admission when it woke, taking a slot, a
 * reservation and the Idempotency-Key. They are given back as soon as that late reply comes,
 * not when their leases run out (60 s here): the account can call again at once.
 */
describe('fault: Redis answers an admission after its deadline', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  let limiter: RedisLimiter;
  let gw: Running;
  before(async () => {
    await server.start();
    limiter = new RedisLimiter({ url: server.url, prefix: 'late:', timeoutMs: 200, leaseMs: 60_000 });
    await limiter.whenReady(3000);
    gw = await startGateway(testConfig({
      plans: { one: { rpm: 1000, concurrency: 1 } },
      accounts: { acct_l: { plan: 'one' } },
      keys: { key_l: { account: 'acct_l', key: 'sk-l' } },
    }), { limiter });
  });
  after(async () => {
    server.resume();
    await gw.close();
    await limiter.close();
    await server.stop();
  });

  const account = { id: 'acct_l', rpm: 1000, concurrency: 1, dailyCapMicro: null, prepaid: false };
  const call = (headers: Record<string, string>) => postJson(`${gw.url}/v1/chat/completions`, 'sk-l', chatBody('paid-1', 'late', { max_tokens: 16 }), headers);

  test('the 503 admission that Redis ran late holds nothing: the slot, reservation and key come back at once', async () => {
    server.pause();
    let refused: Response;
    try {
      refused = await call({ 'idempotency-key': 'late-1' });
    } finally {
      server.resume();
    }
    assert.equal(refused.status, 503);
    assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'limiter_unavailable');

    // Redis ran the admission on waking; its late reply gives everything back.
    await until(async () => {
      const s = await limiter.snapshot(account);
      return s.inFlight === 0 && s.reservedMicro === 0;
    }, 3000, 'the late admission\'s slot and reservation given back');
    // It did run (not lost with the pause): it counts in the account's RPM window.
    const client = createClient({ url: server.url });
    await client.connect();
    try {
      assert.equal(await client.hGet('late:{acct_l}:wn', 'n'), '1', 'the refused admission ran in Redis after its deadline');
    } finally {
      await client.quit();
    }

    // The account's one slot and the same Idempotency-Key serve the next call, well within the lease.
    const again = await call({ 'idempotency-key': 'late-1' });
    assert.equal(again.status, 200, await again.clone().text());
    await again.text();
    await until(async () => (await limiter.snapshot(account)).inFlight === 0, 3000, 'the second call released');
  });
});
