import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { useOriginPool } from '../../src/providers/http.js';
import { ConnectionPool } from '../../src/providers/pool.js';
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
