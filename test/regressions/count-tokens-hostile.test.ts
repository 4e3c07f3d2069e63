import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { useOriginPool } from '../../src/providers/http.js';
import { ConnectionPool } from '../../src/providers/pool.js';
import { MAX_COUNTS_PER_ACCOUNT } from '../../src/http/counts-in-flight.js';
import { anthropicMessage, FakeUpstream, json } from '../helpers/fake-upstream.js';
import { accessLog, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review of count_tokens and the Idempotency-Key under a client with a valid key: a
 * count holds no slot, so one key's burst of counts could take every connection of the
 * provider origin's pool and keep other accounts' calls waiting; a client that left mid-count
 * got no access-log line; and of two different Idempotency-Key headers the last was taken.
 */
describe('regression: count_tokens and request headers under a hostile client', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    // The origin's pool for model calls holds one connection here (1,024 in production).
    const origin = new URL(base);
    const pool = () => new ConnectionPool({ protocol: 'http:', hostname: origin.hostname, port: Number(origin.port) }, { maxSockets: 1 });
    useOriginPool(origin.origin, pool());
    // And so does the counts' pool (256 in production).
    useOriginPool(origin.origin, pool(), true);
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 5 } },
      accounts: { acct_c: { plan: 'p' }, acct_o: { plan: 'p' } },
      keys: { key_c: { account: 'acct_c', key: 'sk-c' }, key_o: { account: 'acct_o', key: 'sk-o' } },
      models: {
        claude: { provider: 'ant', price: { inputPerMillion: 1, outputPerMillion: 2 } },
        'claude-quick': { provider: 'ant-quick', upstreamModel: 'claude', price: { inputPerMillion: 1, outputPerMillion: 2 } },
      },
      // Two providers at one origin share its pools; the second one's timeout is short.
      providers: { ant: { protocol: 'anthropic', baseUrl: base, timeoutMs: 5000 }, 'ant-quick': { protocol: 'anthropic', baseUrl: base, timeoutMs: 300 } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  const count = { model: 'claude', messages: [{ role: 'user', content: 'hi' }] };

  test('a count the provider holds takes no connection of the pool model calls use: another account\'s call goes through', async () => {
    let release: (() => void) | null = null;
    up.queue.push((_req, res) => { release = () => json(res, 200, { input_tokens: 3 }); });
    const counting = postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-c', count);
    await until(() => release !== null, 5000, 'the count upstream');
    up.queue.push((_req, res) => json(res, 200, anthropicMessage('ok')));
    const call = await postJson(`${gw.url}/v1/messages`, 'sk-o', { ...count, max_tokens: 10 });
    // Sharing the one connection, the call waited for it and got 504.
    assert.equal(call.status, 200, await call.clone().text());
    await call.text();
    // A second count waits for the counts' one connection, and says so when its time is up.
    const waited = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-o', { ...count, model: 'claude-quick' });
    assert.equal(waited.status, 504);
    assert.match(((await waited.json()) as { error: { message: string } }).error.message, /No connection to the provider came free/);
    release!();
    const counted = await counting;
    assert.deepEqual([counted.status, await counted.json()], [200, { input_tokens: 3 }]);
  });

  test('a client that leaves mid-count stops it upstream and is logged once, 499', async () => {
    let upstreamClosed = false;
    up.queue.push((_req, res) => { res.on('close', () => { upstreamClosed = true; }); });
    const aborter = new AbortController();
    const counting = fetch(`${gw.url}/v1/messages/count_tokens`, {
      method: 'POST', signal: aborter.signal, headers: { 'content-type': 'application/json', authorization: 'Bearer sk-c', 'x-request-id': 'count-left' },
      body: JSON.stringify(count),
    });
    await until(() => up.seen.at(-1)?.headers['x-request-id'] === 'count-left', 5000, 'the count upstream');
    aborter.abort();
    await assert.rejects(counting);
    await until(() => upstreamClosed, 5000, 'the upstream count stopped');
    await until(() => accessLog(gw).some((l) => l.request_id === 'count-left'), 5000, 'its access-log line');
    const lines = accessLog(gw).filter((l) => l.request_id === 'count-left');
    assert.deepEqual(lines.map((l) => l.status), [499]);
  });

  test('counts waiting on the provider hold their bodies in a count budget of their own: past 16 bodies\' worth, 429; model calls unaffected; all given back after', async () => {
    // 4,000-byte bodies: 16 fit in 16 x maxBodyBytes (4,096 here), the 17th does not.
    const big = { model: 'claude', messages: [{ role: 'user', content: 'x'.repeat(3900) }] };
    const releases: Array<() => void> = [];
    up.fallback = (_req, res) => { releases.push(() => json(res, 200, { input_tokens: 3 })); };
    const waiting = Array.from({ length: 16 }, () => postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-c', big));
    await until(() => gw.gateway.countBodies.held >= 16 * 3900, 5000, 'the counts held');
    const refused = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-c', big);
    assert.equal(refused.status, 429);
    assert.equal(refused.headers.get('retry-after'), '1');
    await refused.text();
    // The account's model calls still get their bodies read (found in review: held counts refused them).
    up.queue.push((_req, res) => json(res, 200, anthropicMessage('ok')));
    const call = await postJson(`${gw.url}/v1/messages`, 'sk-c', { ...big, max_tokens: 10 });
    assert.equal(call.status, 200);
    await call.text();
    // Answered one by one (the counts' pool holds one connection here).
    const answering = setInterval(() => releases.splice(0).forEach((release) => release()), 5);
    try {
      for (const counted of await Promise.all(waiting)) assert.equal(counted.status, 200);
    } finally {
      clearInterval(answering);
      up.fallback = (_req, res) => json(res, 500, { error: { message: 'no behaviour queued' } });
    }
    await until(() => gw.gateway.countBodies.held === 0 && gw.gateway.bodies.held === 0, 5000, 'the bodies given back');
  });

  test('two different Idempotency-Key headers are 400: neither is taken', async () => {
    const status = (values: string[]) => new Promise<[number, string]>((resolve, reject) => {
      const headers = ['host', new URL(gw.url).host, 'content-type', 'application/json', 'authorization', 'Bearer sk-c'];
      for (const v of values) headers.push('Idempotency-Key', v);
      const req = request(`${gw.url}/v1/messages/count_tokens`, { method: 'POST', headers }, (res) => {
        let text = '';
        res.on('data', (c: Buffer) => { text += c; });
        res.on('end', () => resolve([res.statusCode!, text]));
      });
      req.on('error', reject);
      up.queue.push((_req, res) => json(res, 200, { input_tokens: 3 }));
      req.end(JSON.stringify(count));
    });
    const [differ, text] = await status(['aaa', 'zzz']);
    assert.equal(differ, 400);
    assert.equal((JSON.parse(text) as { error: { code: string } }).error.code, 'invalid_idempotency_key', text);
    up.queue.length = 0;
    assert.equal((await status(['aaa', 'aaa']))[0], 200, 'the same value twice is one key');
  });
});

/**
 * Found in review: counts hold no slot and their bodies are bounded by bytes, so one key's
 * thousands of small counts held by a slow provider filled the origin's 256 count connections,
 * and every other account's counts waited behind them until they timed out.
 */
describe('regression: one account\'s counts in flight are bounded', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      // rpm 34: the 32 held, the one refused (which must consume nothing), and two after.
      plans: { p: { rpm: 34, concurrency: 5 } },
      accounts: { acct_c: { plan: 'p' }, acct_o: { plan: 'p' } },
      keys: { key_c: { account: 'acct_c', key: 'sk-c' }, key_c2: { account: 'acct_c', key: 'sk-c2' }, key_o: { account: 'acct_o', key: 'sk-o' } },
      models: { claude: { provider: 'ant', price: { inputPerMillion: 1, outputPerMillion: 2 } } },
      providers: { ant: { protocol: 'anthropic', baseUrl: base, timeoutMs: 5000 } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  test(`past ${MAX_COUNTS_PER_ACCOUNT} counts under way, the account's next (any key) is 429 before admission; other accounts count; all given back`, async () => {
    const count = { model: 'claude', messages: [{ role: 'user', content: 'hi' }] };
    const held: Array<() => void> = [];
    up.fallback = (_req, res) => { held.push(() => json(res, 200, { input_tokens: 3 })); };
    try {
      const waiting = Array.from({ length: MAX_COUNTS_PER_ACCOUNT }, (_, i) => postJson(`${gw.url}/v1/messages/count_tokens`, i % 2 === 0 ? 'sk-c' : 'sk-c2', count));
      await until(() => held.length === MAX_COUNTS_PER_ACCOUNT, 5000, 'the counts upstream');
      assert.equal(gw.gateway.counts.held, MAX_COUNTS_PER_ACCOUNT);
      const refused = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-c2', count);
      assert.equal(refused.status, 429);
      assert.equal(refused.headers.get('retry-after'), '1');
      assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'concurrency_limit_exceeded');
      assert.equal(held.length, MAX_COUNTS_PER_ACCOUNT, 'the refused count never went upstream');
      // Another account's count is not held up by them.
      up.queue.push((_req, res) => json(res, 200, { input_tokens: 5 }));
      const other = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-o', count);
      assert.deepEqual([other.status, await other.json()], [200, { input_tokens: 5 }]);
      held.splice(0).forEach((answer) => answer());
      for (const counted of await Promise.all(waiting)) assert.equal(counted.status, 200);
      await until(() => gw.gateway.counts.held === 0, 5000, 'the counts given back');
      // The refusal took nothing from the RPM window: two more fit in the plan's 34.
      for (let i = 0; i < 2; i++) {
        up.queue.push((_req, res) => json(res, 200, { input_tokens: 3 }));
        const again = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-c', count);
        assert.equal(again.status, 200, await again.clone().text());
        await again.text();
      }
      const over = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-c', count);
      assert.equal(over.status, 429);
      assert.equal(((await over.json()) as { error: { code: string } }).error.code, 'rate_limit_exceeded');
    } finally {
      up.fallback = (_req, res) => json(res, 500, { error: { message: 'no behaviour queued' } });
    }
  });

  test('a count whose client leaves gives its place back', async () => {
    up.fallback = (_req, res) => { res.on('close', () => {}); };
    try {
      const aborter = new AbortController();
      const counting = fetch(`${gw.url}/v1/messages/count_tokens`, {
        method: 'POST', signal: aborter.signal, headers: { 'content-type': 'application/json', authorization: 'Bearer sk-o' },
        body: JSON.stringify({ model: 'claude', messages: [{ role: 'user', content: 'hi' }] }),
      });
      await until(() => gw.gateway.counts.held === 1, 5000, 'the count under way');
      aborter.abort();
      await assert.rejects(counting);
      await until(() => gw.gateway.counts.held === 0, 5000, 'its place given back');
    } finally {
      up.fallback = (_req, res) => json(res, 500, { error: { message: 'no behaviour queued' } });
    }
  });
});
