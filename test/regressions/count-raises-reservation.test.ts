import assert from 'node:assert/strict';
import { request } from 'node:http';
import type { ServerResponse } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { FakeUpstream, json, type Behaviour } from '../helpers/fake-upstream.js';
import { startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Found in review: a call whose input the provider counts before it is sent (a PDF, a stored
 * context) was admitted on its estimate (a document is one fixed figure of 3,000 tokens) and
 * kept only that reserved, so calls sent together, each holding a 100-page PDF, each passed a
 * daily cap the first of them would reach. The count now raises the call's reservation, and
 * the cap (or a prepaid balance) is checked again, as at admission, before the call is sent:
 * refused, it is answered as an admission would be, and never reaches the provider.
 */

const PRICE = { inputPerMillion: 3, outputPerMillion: 15 };
/** 500,000 tokens at $3 per million: $1.50 of input, above the $1 cap. */
const PAGES = 500_000;
const PDF_URL = { type: 'document', source: { type: 'url', url: 'https://example.com/100-pages.pdf' } };

for (const store of ['memory', 'redis'] as const) {
  describe(`regression: a count above the estimate raises the reservation (${store} limiter)`, { skip: store === 'redis' && !hasRedis ? 'redis-server is not installed' : false }, () => {
    const up = new FakeUpstream();
    const redis = new RedisServer();
    let gw: Running;
    const open: ServerResponse[] = [];
    /** Holds the call: the provider is reading the PDF. */
    const reading: Behaviour = (_req, res) => { open.push(res); };

    before(async () => {
      const base = await up.start();
      if (store === 'redis') await redis.start();
      gw = await startGateway(testConfig({
        ...(store === 'redis' ? { limiter: { store: 'redis', url: redis.url, prefix: `cr${Date.now()}:`, timeoutMs: 500 } } : {}),
        plans: { p: { rpm: 10_000, concurrency: 5, dailyCapUsd: 1 } },
        accounts: { acct_a: { plan: 'p' } },
        keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
        models: { claude: { provider: 'ant', upstreamModel: 'claude-upstream', price: PRICE } },
        providers: { ant: { protocol: 'anthropic', baseUrl: base, timeoutMs: 5000 } },
      }));
    });
    after(async () => {
      for (const res of open) res.destroy();
      await gw?.close();
      await up.close();
      if (store === 'redis') await redis.stop();
    });

    const body = { model: 'claude', max_tokens: 100, messages: [{ role: 'user', content: [PDF_URL, { type: 'text', text: 'Summarise.' }] }] };
    const headers = { 'anthropic-version': '2023-06-01' };

    const account = () => gw.gateway.directory.accounts.get('acct_a')!;
    const send = () => {
      const req = request(`${gw.url}/v1/messages`, { method: 'POST', headers: { ...headers, authorization: 'Bearer sk-a', 'content-type': 'application/json' } });
      const answer = new Promise<{ status: number; text: string }>((resolve) => {
        req.on('response', (res) => {
          let text = '';
          res.on('data', (c: Buffer) => { text += c.toString(); });
          res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
          res.on('error', () => resolve({ status: res.statusCode ?? 0, text }));
        });
        req.on('error', () => resolve({ status: 0, text: '' }));
      });
      req.end(JSON.stringify(body));
      return { req, answer };
    };
    /** Ends the first call (its client leaves) and waits until it is charged and everything it held is back. */
    const leave = async (req: { destroy(): void }) => {
      req.destroy();
      await until(async () => {
        const snap = await gw.gateway.limiter.snapshot(account());
        return snap.inFlight === 0 && snap.reservedMicro === 0;
      }, 5000, 'the call charged and its reservation given back');
      for (const res of open.splice(0)) res.destroy();
    };

    test('two calls admitted together, each holding a large PDF: the second is refused at its count, and never sent', async () => {
      const counts: ServerResponse[] = [];
      up.queue.push((_req, res) => { counts.push(res); }, (_req, res) => { counts.push(res); }, reading);
      const first = send();
      const second = send();
      // Both admitted on their small estimates, both counting.
      await until(() => counts.length === 2, 5000, 'both counts upstream');
      json(counts[0]!, 200, { input_tokens: PAGES });
      await until(() => up.seen.some((s) => s.path === '/v1/messages'), 5000, 'the first call upstream');
      json(counts[1]!, 200, { input_tokens: PAGES });
      const refused = await Promise.race([first.answer, second.answer]);
      assert.equal(refused.status, 402, refused.text);
      assert.match(refused.text, /daily_cap_exceeded/);
      assert.deepEqual(up.seen.map((s) => s.path), ['/v1/messages/count_tokens', '/v1/messages/count_tokens', '/v1/messages'], 'the refused call never reached the provider');
      const snap = await gw.gateway.limiter.snapshot(account());
      assert.equal(snap.inFlight, 1);
      assert.ok(snap.reservedMicro >= 1_500_000, `the one sent holds its count reserved: ${snap.reservedMicro}`);
      // Which holds the cap for any other call meanwhile: refused at admission, before any count.
      const third = send();
      assert.equal((await third.answer).status, 402);
      assert.equal(up.seen.length, 3);
      await leave(first.req);
      await leave(second.req);
      // Charged its count (it left after the provider had it); the refused one nothing.
      assert.ok((await gw.gateway.limiter.snapshot(account())).spentTodayMicro >= 1_500_000);
      // One decision per request in mg_admissions_total (the refused one was admitted): its refusal is counted apart.
      const metrics = await (await fetch(`${gw.url}/metrics`)).text();
      assert.match(metrics, /^mg_admissions_total\{result="admitted"\} 2$/m);
      assert.match(metrics, /^mg_admissions_total\{result="daily_cap_exceeded"\} 1$/m);
      assert.match(metrics, /^mg_raise_refusals_total\{reason="daily_cap_exceeded"\} 1$/m);
    });
  });
}

describe('regression: a routed call refused at a later deployment\'s count is charged as any failed call (review of the raise)', () => {
  // Deployment a had the whole request (it timed out): it bills it, so the client is charged, though b's count is refused.
  const a = new FakeUpstream();
  const b = new FakeUpstream();
  const c = new FakeUpstream();
  let gw: Running;
  const open: ServerResponse[] = [];
  before(async () => {
    const [ua, ub, uc] = [await a.start(), await b.start(), await c.start()];
    gw = await startGateway(testConfig({
      routing: { maxAttempts: 2, cooldownMs: 1000 },
      plans: { p: { rpm: 10_000, concurrency: 5, dailyCapUsd: 1 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
      models: {
        pair: { price: PRICE, deployments: [{ provider: 'a', upstreamModel: 'm' }, { provider: 'b', upstreamModel: 'm', fallback: true }] },
        solo: { provider: 'c', upstreamModel: 'm', price: PRICE },
      },
      providers: {
        a: { protocol: 'anthropic', baseUrl: ua, timeoutMs: 800 },
        b: { protocol: 'anthropic', baseUrl: ub, timeoutMs: 5000 },
        c: { protocol: 'anthropic', baseUrl: uc, timeoutMs: 5000 },
      },
    }));
  });
  after(async () => {
    for (const res of open) res.destroy();
    await gw?.close();
    await Promise.all([a.close(), b.close(), c.close()]);
  });

  const send = (model: string) => fetch(`${gw.url}/v1/messages`, {
    method: 'POST', headers: { authorization: 'Bearer sk-a', 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model, max_tokens: 100, messages: [{ role: 'user', content: [PDF_URL, { type: 'text', text: 'Summarise.' }] }] }),
  });

  test('delivered to a, which timed out; refused at b\'s count: charged what a had, not b\'s count', async () => {
    a.queue.push((_req, res) => json(res, 200, { input_tokens: 10 }), (_req, res) => { open.push(res); });
    b.queue.push((_req, res) => json(res, 200, { input_tokens: PAGES }));
    c.queue.push((_req, res) => json(res, 200, { input_tokens: PAGES }), (_req, res) => { open.push(res); });
    const x = send('pair');
    await until(() => a.seen.some((s) => s.path === '/v1/messages'), 5000, 'x delivered to a');
    // Another call takes the cap meanwhile: its count raised its reservation to $1.50.
    void send('solo').catch(() => {});
    await until(() => c.seen.some((s) => s.path === '/v1/messages'), 5000, 'the other call sent');
    const refused = await x;
    assert.equal(refused.status, 402, await refused.text());
    assert.deepEqual(b.seen.map((s) => s.path), ['/v1/messages/count_tokens'], 'never sent to b');
    const account = gw.gateway.directory.accounts.get('acct_a')!;
    const snap = await gw.gateway.limiter.snapshot(account);
    // The estimate of what a had (about 3,000 tokens of document and text at $3 per million), not b's 500,000.
    assert.ok(snap.spentTodayMicro > 0 && snap.spentTodayMicro < 100_000, `charged ${snap.spentTodayMicro}`);
  });
});
