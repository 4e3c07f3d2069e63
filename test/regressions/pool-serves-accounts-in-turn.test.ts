import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { after, before, test } from 'node:test';
import { useOriginPool } from '../../src/providers/http.js';
import { ConnectionPool } from '../../src/providers/pool.js';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review (carried over as "a plan without concurrency can take an origin's call
 * pool"): the calls waiting for one of an origin's connections (1,024 at most) waited in one
 * queue, so one account's burst (a plan without a concurrency limit: thousands of calls) stood
 * in front of every other account's call, which waited for the whole burst, or its 504. A
 * connection that comes free now goes to the waiting accounts in turn.
 */
const up = new FakeUpstream();
let gw: Running;
before(async () => {
  const base = await up.start();
  // The origin's pool holds one connection (1,024 in production).
  const origin = new URL(base);
  useOriginPool(origin.origin, new ConnectionPool({ protocol: 'http:', hostname: origin.hostname, port: Number(origin.port) }, { maxSockets: 1 }));
  gw = await startGateway(testConfig({
    plans: { unlimited: { rpm: 'unlimited', concurrency: 'unlimited' } },
    accounts: { acct_hog: { plan: 'unlimited' }, acct_other: { plan: 'unlimited' } },
    keys: { key_hog: { account: 'acct_hog', key: 'sk-hog' }, key_other: { account: 'acct_other', key: 'sk-other' } },
    models: { gpt: { provider: 'oa', price: { inputPerMillion: 1, outputPerMillion: 2 } } },
    providers: { oa: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 10_000 } },
  }));
});
after(async () => {
  await gw.close();
  await up.close();
});

const ask = (key: string, who: string) =>
  postJson(`${gw.url}/v1/chat/completions`, key, { model: 'gpt', messages: [{ role: 'user', content: who }] });
const sender = (i: number) => (up.seen[i]!.body.messages as Array<{ content: string }>)[0]!.content;

test('regression: a connection that comes free goes to the waiting accounts in turn, not to one account\'s burst first', async () => {
  const held: ServerResponse[] = [];
  up.fallback = (_req, res) => { held.push(res); };
  const answer = (res: ServerResponse) => json(res, 200, openaiCompletion('ok'));
  const calls = [ask('sk-hog', 'hog 0')];
  await until(() => held.length === 1, 5000, 'the one connection taken');
  for (let i = 1; i <= 4; i++) calls.push(ask('sk-hog', `hog ${i}`));
  await until(() => gw.gateway.inFlight === 5, 5000, 'the burst waiting for the connection');
  calls.push(ask('sk-other', 'other'));
  await until(() => gw.gateway.inFlight === 6, 5000, 'the other account waiting too');
  // The connection comes free: the burst's oldest has its turn, then the other account's call
  // (one queue had it wait for the whole burst), then the rest of the burst, in its order.
  const expected = ['hog 1', 'other', 'hog 2', 'hog 3', 'hog 4'];
  for (let i = 1; i <= 5; i++) {
    answer(held.shift()!);
    await until(() => held.length === 1, 5000, `call ${i} on the connection`);
  }
  assert.deepEqual(up.seen.slice(1).map((_, i) => sender(i + 1)), expected);
  answer(held.shift()!);
  for (const call of calls) assert.equal((await call).status, 200);
});
