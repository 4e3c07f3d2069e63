import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { RedisLimiter } from '../../src/limiter/redis.js';
import { chatBody, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisRelay, RedisServer } from '../helpers/redis-server.js';

/**
 * Redis runs an admission whose answer the gateway never uses: the answer comes after the
 * deadline (Redis frozen longer than `timeoutMs`, then back), or it is lost with the
 * connection. The request got its 503, yet the admission took a slot, a reservation and the
 * Idempotency-Key. They are given back as soon as the late answer comes, or the connection is
 * back, not when their leases run out (60 s here): the account can call again at once.
 *
 * The limiter reaches Redis through a TCP relay of the test's own, which can drop Redis's next
 * answer and cut the connection instead.
 */
describe('fault: Redis runs an admission whose answer is late or lost', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  let relay: RedisRelay;
  let limiter: RedisLimiter;
  let gw: Running;
  before(async () => {
    await server.start();
    relay = await new RedisRelay(server.port).start();
    limiter = new RedisLimiter({ url: relay.url, prefix: 'late:', timeoutMs: 200, leaseMs: 60_000 });
    await limiter.whenReady(3000);
    gw = await startGateway(testConfig({
      plans: { one: { rpm: 1000, concurrency: 1 } },
      accounts: { acct_l: { plan: 'one' }, acct_m: { plan: 'one' }, acct_n: { plan: 'one' } },
      keys: { key_l: { account: 'acct_l', key: 'sk-l' }, key_m: { account: 'acct_m', key: 'sk-m' }, key_n: { account: 'acct_n', key: 'sk-n' } },
    }), { limiter });
  });
  after(async () => {
    server.resume();
    await gw.close();
    await limiter.close();
    relay.close();
    await server.stop();
  });

  const limits = (id: string) => ({ id, rpm: 1000, concurrency: 1, dailyCapMicro: null, prepaid: false });
  const call = (key: string, idempotencyKey: string) =>
    postJson(`${gw.url}/v1/chat/completions`, key, chatBody('paid-1', 'late', { max_tokens: 16 }), { 'idempotency-key': idempotencyKey });

  /** After the refused call: the admission ran in Redis, gave everything back, and the account's one slot and the same key serve the next call. */
  async function heldNothing(refused: Response, accountId: string, key: string, idempotencyKey: string): Promise<void> {
    assert.equal(refused.status, 503);
    assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'limiter_unavailable');
    await until(async () => {
      try {
        const s = await limiter.snapshot(limits(accountId));
        return s.inFlight === 0 && s.reservedMicro === 0;
      } catch {
        return false; // the connection not back yet
      }
    }, 3000, 'the refused admission\'s slot and reservation given back');
    // It did run (it was not lost on the way): it counts in the account's RPM window.
    const client = createClient({ url: server.url });
    await client.connect();
    try {
      assert.equal(await client.hGet(`late:{${accountId}}:wn`, 'n'), '1', 'the refused admission ran in Redis');
    } finally {
      await client.quit();
    }
    const again = await call(key, idempotencyKey);
    assert.equal(again.status, 200, await again.clone().text());
    await again.text();
    await until(async () => (await limiter.snapshot(limits(accountId))).inFlight === 0, 3000, 'the second call released');
  }

  test('an answer after the deadline: the admission gives back at once what it took', async () => {
    server.pause();
    let refused: Response;
    try {
      refused = await call('sk-l', 'late-1');
    } finally {
      server.resume();
    }
    await heldNothing(refused, 'acct_l', 'sk-l', 'late-1');
  });

  test('an answer lost with the connection: the admission gives back what it may have taken once the connection is back', async () => {
    relay.cut = 'answer';
    const refused = await call('sk-m', 'lost-1');
    await heldNothing(refused, 'acct_m', 'sk-m', 'lost-1');
  });

  test('a call that ends while Redis is away: its release is sent when Redis is back, not left to its lease', async () => {
    // A call on the slow mock model (300 ms) is admitted; Redis goes away under it; it ends.
    const slow = postJson(`${gw.url}/v1/chat/completions`, 'sk-n', chatBody('slow-1', 'away'));
    await until(async () => (await limiter.snapshot(limits('acct_n'))).inFlight === 1, 3000, 'the slow call admitted');
    relay.away = true;
    let answer: Response;
    try {
      answer = await slow;
      await answer.text();
    } finally {
      relay.away = false;
    }
    assert.equal(answer.status, 200);
    await until(async () => {
      try {
        return (await limiter.snapshot(limits('acct_n'))).inFlight === 0;
      } catch {
        return false; // the connection not back yet
      }
    }, 3000, 'the slot released once Redis is back');
  });
});
