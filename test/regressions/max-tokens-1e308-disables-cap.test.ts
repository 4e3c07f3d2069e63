import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { RedisLimiter } from '../../src/limiter/redis.js';
import { BATCH } from '../../src/limiter/redis-scripts.js';
import type { AccountLimits, KeyLimits, Ticket } from '../../src/limiter/types.js';
import { chatBody, postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Found: `max_tokens: 1e308` passed validation (it is an integer), its estimate was Infinity,
 * and the account's reservations became NaN after settling: every later cap and balance
 * check was false, so a $1 cap let 25 calls of $0.10 through. With Redis, an estimate past
 * 2^53 made HINCRBY fail after ZADD and SET had run: a 503 that still held the slot, the
 * Idempotency-Key and the RPM count.
 */

// $100 per million input tokens: a message of 4,000 characters costs about $0.10.
const PRICE = { inputPerMillion: 100, outputPerMillion: 0 };
const TEXT = 'x'.repeat(4000);

async function status(gw: Running, key: string, body: unknown): Promise<{ status: number; code: string | null; param: string | null }> {
  const res = await postJson(`${gw.url}/v1/chat/completions`, key, body);
  const json = (await res.json()) as { error?: { code: string; param?: string } };
  return { status: res.status, code: json.error?.code ?? null, param: json.error?.param ?? null };
}

describe('regression: an output limit of 1e308 switched off the daily cap and the balance', () => {
  let gw: Running;
  before(async () => {
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 65_536 },
      plans: { capped: { rpm: 1000, concurrency: 10, dailyCapUsd: 1 }, open: { rpm: 1000, concurrency: 10 } },
      accounts: { acct_capped: { plan: 'capped' }, acct_prepaid: { plan: 'open', balanceUsd: 1 } },
      keys: { k_capped: { account: 'acct_capped', key: 'sk-capped' }, k_prepaid: { account: 'acct_prepaid', key: 'sk-prepaid' } },
      models: { 'paid-in': { provider: 'mock', price: PRICE } },
      providers: { mock: { protocol: 'mock' } },
    }));
  });
  after(() => gw.close());

  for (const [label, key, code] of [['daily cap', 'sk-capped', 'daily_cap_exceeded'], ['prepaid balance', 'sk-prepaid', 'insufficient_balance']] as const) {
    test(`${label}: the 1e308 call is 400 naming max_tokens, and the ${label} still refuses when reached`, async () => {
      for (const [field, value] of [['max_tokens', 1e308], ['max_completion_tokens', 1e308], ['max_tokens', 1e15], ['max_tokens', 2 ** 53 + 1], ['max_tokens', 128_001]] as const) {
        const r = await status(gw, key, chatBody('paid-in', 'hi', { [field]: value, stream: value === 1e15 }));
        assert.deepEqual(r, { status: 400, code: 'invalid_request', param: field }, `${field}: ${value}`);
      }
      let admitted = 0;
      let refused: string | null = null;
      for (let i = 0; i < 25 && refused === null; i++) {
        const r = await status(gw, key, chatBody('paid-in', TEXT, { max_tokens: 16 }));
        if (r.status === 200) admitted++;
        else refused = r.code;
      }
      // Each call costs $0.1 (4,000 characters of input at $100 per million tokens): ten fit below $1.
      assert.equal(refused, code);
      assert.equal(admitted, 10);
      const balance = (await (await fetch(`${gw.url}/v1/balance`, { headers: { authorization: `Bearer ${key}` } })).json()) as Record<string, number | null>;
      assert.equal(balance.daily_spend, 1);
      if (key === 'sk-prepaid') assert.equal(balance.balance, 0);
    });
  }

});

describe('output limits are checked against the model', () => {
  test('the bound is the model\'s outputTokenLimit; n is an integer from 1 to 128', async () => {
    const gw = await startGateway(testConfig({
      models: { ...(testConfig().models as object), 'paid-small': { provider: 'mock', price: PRICE, outputTokenLimit: 1000 } },
    }));
    try {
      assert.equal((await status(gw, 'sk-alice', chatBody('paid-small', 'hi', { max_tokens: 1000, n: 2 }))).status, 200);
      const r = await status(gw, 'sk-alice', chatBody('paid-small', 'hi', { max_tokens: 1001 }));
      assert.deepEqual(r, { status: 400, code: 'invalid_request', param: 'max_tokens' });
      for (const n of [0, 1.5, 129, '2']) {
        const bad = await status(gw, 'sk-alice', chatBody('paid-small', 'hi', { n }));
        assert.deepEqual(bad, { status: 400, code: 'invalid_request', param: 'n' }, `n: ${JSON.stringify(n)}`);
      }
    } finally {
      await gw.close();
    }
  });
});

if (hasRedis) {
  describe('regression: with Redis, an estimate past 2^53 held the slot, the Idempotency-Key and the RPM count', () => {
    const server = new RedisServer();
    let lim: RedisLimiter;
    before(async () => {
      await server.start();
      lim = new RedisLimiter({ url: server.url, prefix: 'reg:', timeoutMs: 1000 });
      await lim.whenReady(3000);
    });
    after(async () => {
      await lim.close();
      await server.stop();
    });

    const account: AccountLimits = { id: 'acct', rpm: 1, concurrency: 1, dailyCapMicro: 1_000_000, prepaid: false };
    const key: KeyLimits = { id: 'k', rpm: null, concurrency: null };

    test('a hostile estimate is refused at the door, and nothing is taken', async () => {
      for (const estimate of [2 ** 53 + 1, 1e308, Infinity, NaN, -1, 1.5]) {
        await assert.rejects(async () => lim.admit(account, key, 'idem-1', estimate), RangeError, String(estimate));
      }
      const t = await lim.admit(account, key, 'idem-1', 10);
      assert.equal(t.ok, true, 'the slot, the key and the one RPM admission were all still free');
      await lim.settle(t as Ticket, 10);
      lim.release(t as Ticket);
    });

    test('the limiter script itself checks every argument of an admission before its first write', async () => {
      const client = createClient({ url: server.url });
      await client.connect();
      try {
        await client.flushAll();
        const keys = ['x{a}:wt', 'x{a}:wn', 'x{a}:s', 'x{a}:m', 'x{a}:r', 'x{a}:x', 'x{a}:i:z'];
        // BATCH: needsrc lease, then one admission with an Idempotency-Key ('ai', its key last):
        // id, "rpm,concurrency,key rpm,key concurrency,cap", estimate, flags prepaid and instant.
        const good = ['0', '30000', 'ai', 't1', '10,10,-1,-1,1000', '5', '00'];
        const limits = (at: number, value: string) => { const l = good[4]!.split(','); l[at] = value; return l.join(','); };
        const opArgs = [[5, '1e+308', 'est'], [5, '9007199254740993', 'est'], [5, '1.5', 'est'], [5, 'NaN', 'est'], [5, '-2', 'est'], [5, '', 'est'],
          [4, limits(0, '1e9999'), 'limits'], [4, limits(4, '-2'), 'limits'], [4, limits(4, '1.5'), 'limits'], [4, '10,10,-1,-1', 'limits'],
          [4, '10,10,-1,-1,1000,5', 'limits'], [6, '0x', 'flag'], [6, '2', 'flag'], [3, '', 'id']] as const;
        for (const [at, value, name] of opArgs) {
          const args = [...good];
          args[at] = value;
          const [reply] = (await client.eval(BATCH, { keys, arguments: args })) as [[string, string]];
          assert.equal(reply[0], 'error', `argument ${at} = ${value}`);
          assert.equal(reply[1], `ERR model-gateway: invalid argument ${name}`);
          assert.deepEqual(await client.keys('x*'), [], `nothing written for argument ${at} = ${value}`);
        }
        for (const [at, value] of [[1, '0'], [0, '2'], [2, 'b']] as const) { // the call's own (lease, needsrc) and the framing
          const args = [...good];
          args[at] = value;
          const answer = client.eval(BATCH, { keys, arguments: args });
          if (at === 2) assert.deepEqual(await answer, [['error', 'ERR model-gateway: invalid argument op']]);
          else await assert.rejects(answer, /invalid argument/, `argument ${at} = ${value}`);
          assert.deepEqual(await client.keys('x*'), [], `nothing written for argument ${at} = ${value}`);
        }
        assert.deepEqual(await client.eval(BATCH, { keys, arguments: good }), ['ok']);
      } finally {
        await client.quit();
      }
    });
  });
} else {
  test('regression: Redis estimates past 2^53', (t) => t.skip('redis-server is not installed'));
}
