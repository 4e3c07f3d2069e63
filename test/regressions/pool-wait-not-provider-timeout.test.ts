import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { useOriginPool } from '../../src/providers/http.js';
import { ConnectionPool } from '../../src/providers/pool.js';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { chatBody, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a call's timeout also runs while it waits for one of the gateway's own
 * connections to a provider's origin (1,024 at most, shared by every provider there), and it
 * was reported as the provider's timeout: the deployment was cooled down, fleet-wide with
 * Redis, and the call moved on, though the provider never saw it. A wait in that queue is now
 * the gateway's: 504 naming it, no cooldown, no failover.
 */
const a = new FakeUpstream();
const b = new FakeUpstream();
let gw: Running;
before(async () => {
  const [ua, ub] = [await a.start(), await b.start()];
  // Origin A's pool holds one connection (1,024 in production).
  const origin = new URL(ua);
  useOriginPool(origin.origin, new ConnectionPool({ protocol: 'http:', hostname: origin.hostname, port: Number(origin.port) }, { maxSockets: 1 }));
  const price = { inputPerMillion: 1, outputPerMillion: 2 };
  gw = await startGateway(testConfig({
    routing: { maxAttempts: 2, cooldownMs: 60_000 },
    plans: { p: { rpm: 100_000, concurrency: 100 } },
    accounts: { acct_a: { plan: 'p' } },
    keys: { key_a: { account: 'acct_a', key: 'sk-client' } },
    models: {
      hog: { price, provider: 'a2' },
      pair: { price, deployments: [{ provider: 'a' }, { provider: 'b', fallback: true }] },
    },
    providers: {
      a: { protocol: 'openai', baseUrl: `${ua}/v1`, timeoutMs: 300 },
      a2: { protocol: 'openai', baseUrl: `${ua}/v1`, timeoutMs: 5000 },
      b: { protocol: 'openai', baseUrl: `${ub}/v1`, timeoutMs: 300 },
    },
  }));
});
after(async () => {
  await gw.close();
  await Promise.all([a.close(), b.close()]);
});

test('regression: a call that waited past its timeout for a connection of the gateway\'s own is not the provider\'s timeout: no failover, no cooldown', async () => {
  let release: (() => void) | null = null;
  a.queue.push((_req, res) => { release = () => json(res, 200, openaiCompletion('hog')); });
  const hog = postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('hog'));
  await until(() => release !== null, 5000, 'the one connection taken');
  const waited = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('pair'));
  assert.equal(waited.status, 504);
  assert.match(((await waited.json()) as { error: { message: string } }).error.message, /No connection to the provider came free/);
  assert.equal(b.hits, 0, 'not moved to the fallback');
  release!();
  assert.equal((await hog).status, 200);
  a.fallback = (_req, res) => json(res, 200, openaiCompletion('from a'));
  const next = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('pair'));
  assert.equal(next.status, 200);
  assert.equal(next.headers.get('x-gateway-deployment'), 'a', 'a is not cooling down');
  await next.text();
});

test('regression: a call that got its connection after waiting most of its timeout for it is not the provider\'s timeout either (review: a provider given 100 ms of its 300 was cooled down, and the call sent again elsewhere)', async () => {
  let release: (() => void) | null = null;
  a.queue.push((_req, res) => { release = () => json(res, 200, openaiCompletion('hog')); });
  const hog = postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('hog'));
  await until(() => release !== null, 5000, 'the one connection taken');
  a.queue.push(() => { /* the call it waited for: holds it past its deadline */ });
  const hits = b.hits;
  const waiting = postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('pair'));
  // The connection comes free after 200 of the call's 300 ms.
  await new Promise((resolve) => setTimeout(resolve, 200));
  release!();
  assert.equal((await hog).status, 200);
  const waited = await waiting;
  assert.equal(waited.status, 504);
  assert.match(((await waited.json()) as { error: { message: string } }).error.message, /No connection to the provider came free/);
  assert.equal(b.hits, hits, 'not moved to the fallback');
  a.fallback = (_req, res) => json(res, 200, openaiCompletion('from a'));
  const next = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('pair'));
  assert.equal(next.headers.get('x-gateway-deployment'), 'a', 'a is not cooling down');
  await next.text();
});
