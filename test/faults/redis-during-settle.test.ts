import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { RedisLimiter } from '../../src/limiter/redis.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Redis goes away while calls are settling (killed, or frozen): the calls in flight still end,
 * every answer delivered whole is in the ledger exactly once (the settlement that could not
 * reach Redis is recorded anyway), nothing crashes, new calls are refused fail-closed (503),
 * and service resumes by itself when Redis is back.
 */
describe('fault: Redis killed during settlement', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  let limiter: RedisLimiter;
  let gw: Running;
  before(async () => {
    await server.start();
    limiter = new RedisLimiter({ url: server.url, prefix: 'settle:', timeoutMs: 300, leaseMs: 3000 });
    await limiter.whenReady(3000);
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 100_000, concurrency: 50 } },
      // Postpaid: a Redis restarted without persistence forgets balances (README; rebuilt from a shared ledger in a later issue).
      accounts: { acct_s: { plan: 'p' } },
      keys: { key_s: { account: 'acct_s', key: 'sk-s' } },
      // Streams of 40 tokens at 100 tokens/s: 0.4 s each, long enough to kill Redis under them.
      models: { paid: { provider: 'paced', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
      providers: { paced: { protocol: 'mock', tokensPerSecond: 100 } },
    }), { limiter });
  });
  after(async () => {
    await gw.close();
    await limiter.close();
    await server.stop();
  });

  const status = async (path: string) => {
    const res = await fetch(`${gw.url}${path}`, { headers: { authorization: 'Bearer sk-s' } });
    await res.text();
    return res.status;
  };

  for (const how of ['killed', 'frozen'] as const) {
    test(`Redis ${how} under 10 streams: each ends, each whole answer is charged once, then service resumes`, async () => {
      const before = entriesOf(gw, 'acct_s').length;
      const calls = Array.from({ length: 10 }, async () => {
        const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-s', chatBody('paid', 'a'.repeat(160), { stream: true }));
        const text = await res.text().catch(() => '');
        return { id: res.headers.get('x-request-id'), whole: res.status === 200 && text.includes('[DONE]') };
      });
      await until(() => gw.gateway.inFlight === 10, 5000, 'ten streams running');
      if (how === 'killed') await server.stop();
      else server.pause();
      const outcomes = await Promise.all(calls);
      await until(() => gw.gateway.inFlight === 0, 10_000, 'every call over');
      assert.equal(await status('/healthz'), 200, 'alive');
      assert.equal(await status('/v1/models'), 503, 'fail-closed while Redis is away');

      const charged = new Map<string, number>();
      for (const e of entriesOf(gw, 'acct_s').slice(before)) charged.set(e.requestId!, (charged.get(e.requestId!) ?? 0) + 1);
      for (const o of outcomes.filter((x) => x.whole)) assert.equal(charged.get(o.id!), 1, `${o.id} delivered whole, charged once`);
      for (const [id, n] of charged) assert.equal(n, 1, `${id} charged ${n} times`);
      assert.ok(outcomes.some((o) => o.whole), 'the streams already admitted finish');

      if (how === 'killed') await server.start();
      else server.resume();
      await until(async () => (await status('/v1/models')) === 200, 10_000, 'service resumes by itself');
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-s', chatBody('paid'));
      assert.equal(res.status, 200);
      await res.text();
    });
  }
});
