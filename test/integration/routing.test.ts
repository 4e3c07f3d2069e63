import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { after, before, beforeEach, describe, test } from 'node:test';
import { anthropicMessage, FakeUpstream, json, openaiCompletion, openaiStream, type Behaviour } from '../helpers/fake-upstream.js';
import type { GatewayConfig } from '../../src/config/types.js';
import { validateConfig } from '../../src/config/validate.js';
import { FakeClock, rng } from '../helpers/fake-clock.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';

const PRICE = { inputPerMillion: 1, outputPerMillion: 2 };
const ok: Behaviour = (_req, res) => json(res, 200, openaiCompletion('from the provider'));
const status = (code: number, headers: Record<string, string> = {}): Behaviour => (_req, res) => json(res, code, { error: { message: `status ${code}` } }, headers);

/** A port nothing listens on: connecting to it is refused. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('routing: deployments, failover, cooldowns (fake providers on loopback)', () => {
  const a = new FakeUpstream();
  const b = new FakeUpstream();
  const c = new FakeUpstream();
  const clock = new FakeClock();
  let gw: Running;
  let config: Record<string, unknown>;
  let refused: number;
  let reloaded: (providers: Record<string, unknown>) => GatewayConfig;
  before(async () => {
    const [ua, ub, uc] = [await a.start(), await b.start(), await c.start()];
    refused = await closedPort();
    const provider = (baseUrl: string, extra: Record<string, unknown> = {}) => ({ protocol: 'openai', baseUrl: `${baseUrl}/v1`, timeoutMs: 1000, ...extra });
    config = testConfig({
      routing: { maxAttempts: 3, cooldownMs: 5000 },
      plans: { p: { rpm: 100_000, concurrency: 100 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-client' } },
      models: {
        routed: {
          price: PRICE,
          deployments: [
            { provider: 'a', weight: 3 },
            { provider: 'b', weight: 1, upstreamModel: 'b-model' },
            { provider: 'c', fallback: true, upstreamModel: 'c-model' },
          ],
        },
        pair: { price: PRICE, deployments: [{ provider: 'a' }, { provider: 'b', fallback: true }] },
        gone: { price: PRICE, deployments: [{ provider: 'nowhere' }, { provider: 'b', fallback: true }] },
        mixed: { price: PRICE, deployments: [{ provider: 'ant' }, { provider: 'b', fallback: true }] },
        split: { price: PRICE, deployments: [{ provider: 'ant' }, { provider: 'b' }] },
        counted: { price: PRICE, deployments: [{ provider: 'b', upstreamModel: 'b-model' }, { provider: 'ant', upstreamModel: 'ant-model', fallback: true }] },
        fourfold: { price: PRICE, deployments: [{ provider: 'a' }, { provider: 'b' }, { provider: 'c' }, { provider: 'ant' }] },
      },
      providers: {
        a: provider(ua), b: provider(ub), c: provider(uc),
        nowhere: { protocol: 'openai', baseUrl: `http://127.0.0.1:${refused}/v1` },
        ant: { protocol: 'anthropic', baseUrl: ua, timeoutMs: 1000 },
      },
    });
    gw = await startGateway(config, { clock, random: rng(42) });
    reloaded = (providers) => {
      const r = validateConfig({ ...config, providers }, { baseDir: process.cwd(), env: {} });
      assert.ok(r.ok);
      return r.config;
    };
  });
  after(async () => {
    await gw.close();
    await Promise.all([a.close(), b.close(), c.close()]);
  });
  beforeEach(() => {
    for (const up of [a, b, c]) {
      up.queue.length = 0;
      up.seen.length = 0;
      up.fallback = ok;
    }
    clock.advance(3_600_000); // every earlier test's cooldowns are over
  });

  const call = (model: string, extra: Record<string, unknown> = {}) => postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody(model, 'hello', extra));
  const entriesFor = (res: Response) => entriesOf(gw, 'acct_a').filter((e) => e.requestId === res.headers.get('x-request-id'));

  test('weights: 400 calls split 3:1 between the primaries (within ±10 %); the fallback gets none', async () => {
    const served = new Map<string, number>();
    for (let i = 0; i < 400; i++) {
      const res = await call('routed');
      assert.equal(res.status, 200);
      await res.arrayBuffer();
      const by = res.headers.get('x-gateway-deployment')!;
      served.set(by, (served.get(by) ?? 0) + 1);
    }
    assert.ok(Math.abs(served.get('a')! - 300) <= 30, `a served ${served.get('a')}`);
    assert.ok(Math.abs(served.get('b')! - 100) <= 10, `b served ${served.get('b')}`);
    assert.equal(served.get('c'), undefined);
    assert.equal(a.hits, served.get('a'));
    assert.equal(b.seen[0]!.body.model, 'b-model', 'each deployment gets its own upstreamModel');
  });

  for (const [name, behaviour] of [
    ['408', status(408)], ['429', status(429)], ['500', status(500)], ['502', status(502)], ['503', status(503)], ['529', status(529)],
  ] as const) {
    test(`a ${name} before the first byte moves the call to the next deployment, once, and is charged once`, async () => {
      a.fallback = behaviour;
      const res = await call('pair');
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('x-gateway-deployment'), 'b');
      await res.json();
      assert.equal(a.hits, 1, 'no retry on the failed deployment: the next attempt is the next deployment');
      assert.equal(b.hits, 1);
      const entries = entriesFor(res);
      assert.equal(entries.length, 1, 'charged once');
      assert.equal(entries[0]!.deployment, 'b');
      assert.equal(entries[0]!.estimated, false);
      assert.equal(entries[0]!.amountMicro, -(10 * 1 + 20 * 2), 'the usage b reported, at the model\'s price');
    });
  }

  test('a connection error and a timeout to headers fail over too', async () => {
    let res = await call('gone');
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.arrayBuffer();
    a.fallback = () => {}; // never answers: provider a's timeoutMs (1000) runs out
    const started = Date.now();
    res = await call('pair');
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.arrayBuffer();
    assert.ok(Date.now() - started >= 900, 'after a\'s own timeout');
  });

  test('a 400 is the client\'s: returned as it is, not failed over, no cooldown', async () => {
    a.fallback = status(400);
    let res = await call('pair');
    assert.equal(res.status, 400);
    assert.equal(((await res.json()) as { error: { message: string } }).error.message, 'status 400');
    assert.equal(b.hits, 0);
    a.fallback = ok;
    res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'a', 'no cooldown started');
    await res.arrayBuffer();
  });

  test('nothing is retried after the first byte: a stream cut mid-way is cut for the client', async () => {
    a.fallback = openaiStream(['one ', 'two ', 'three'], { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 }, { cutAfter: 1, delayMs: 30 });
    const res = await call('pair', { stream: true });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-gateway-deployment'), 'a');
    await assert.rejects(res.text());
    assert.equal(b.hits, 0);
  });

  test('an answer whose body stalls past timeoutMs is not failed over: the provider has the call (found in review: a 504 for it moved the call, unbilled, to another deployment)', async () => {
    a.fallback = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":"stalled",'); // and nothing more
    };
    const res = await call('pair');
    assert.equal(res.status, 504);
    await res.arrayBuffer();
    assert.equal(b.seen.length, 0, 'not sent to b');
    const charged = entriesFor(res);
    assert.equal(charged.length, 1);
    assert.deepEqual([charged[0]!.deployment, charged[0]!.estimated], ['a', true]);
  });

  test('a cooldown is honoured, then expires; a longer Retry-After extends it; a reload keeps it', async () => {
    a.queue.push(status(503));
    let res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.arrayBuffer();
    for (let i = 0; i < 3; i++) {
      res = await call('pair');
      assert.equal(res.headers.get('x-gateway-deployment'), 'b', 'a is cooling down: the fallback serves');
      await res.arrayBuffer();
    }
    assert.equal(a.hits, 1);
    assert.deepEqual(await gw.gateway.reload(gw.gateway.config), []);
    clock.advance(4999);
    res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'b', 'still cooling after a reload');
    await res.arrayBuffer();
    clock.advance(1);
    res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'a', 'cooldownMs is over');
    await res.arrayBuffer();

    a.queue.push(status(429, { 'retry-after': '30' }));
    res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.arrayBuffer();
    clock.advance(29_999);
    res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'b', 'Retry-After: 30 outlasts cooldownMs');
    await res.arrayBuffer();
    clock.advance(1);
    res = await call('pair');
    assert.equal(res.headers.get('x-gateway-deployment'), 'a');
    await res.arrayBuffer();
  });

  test('a reload leaves a call in flight on the deployments it started with', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => { release = r; });
    let arrived!: () => void;
    const reached = new Promise<void>((r) => { arrived = r; });
    a.queue.push((_req, res) => {
      arrived();
      void held.then(() => json(res, 503, { error: { message: 'overloaded' } }));
    });
    const pending = call('pair');
    await reached;
    // The new config sends provider b's calls to c: the call in flight still fails over to the b it started with.
    const providers = (config.providers as Record<string, { baseUrl: string }>);
    assert.deepEqual(await gw.gateway.reload(reloaded({ ...providers, b: { ...providers.b, baseUrl: providers.c.baseUrl } })), []);
    release();
    const res = await pending;
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.arrayBuffer();
    assert.deepEqual([b.hits, c.hits], [1, 0]);
    clock.advance(10_000);
    a.fallback = status(503);
    const after = await call('pair');
    await after.arrayBuffer();
    assert.deepEqual([b.hits, c.hits], [1, 1], 'a new call uses the new config');
    assert.deepEqual(await gw.gateway.reload(reloaded(providers)), []);
  });

  test('every deployment failing (one attempt each; maxAttempts itself is bounded in test/unit/routing.test.ts) ends with the last failure as section 6 maps it', async () => {
    for (const up of [a, b, c]) up.fallback = status(503);
    const res = await call('routed');
    assert.equal(res.status, 503);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_overloaded');
    assert.equal(a.hits + b.hits + c.hits, 3);
    assert.equal(c.hits, 1, 'the fallback last');
    assert.deepEqual(entriesFor(res).map((e) => e.amountMicro), [], 'refused everywhere: not charged');
  });

  test('deployments may speak different protocols: a chat call on an Anthropic deployment fails over to an OpenAI one', async () => {
    a.queue.push(status(529));
    const res = await call('mixed');
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.json();
    assert.equal(a.seen[0]!.path, '/v1/messages', 'the Anthropic deployment got the call translated');
    assert.equal(b.seen[0]!.path, '/v1/chat/completions', 'the OpenAI one as it was');
    a.queue.push((_req, res2) => json(res2, 200, anthropicMessage('translated back')));
    clock.advance(10_000);
    const again = await call('mixed');
    assert.equal(again.headers.get('x-gateway-deployment'), 'ant');
    const body = (await again.json()) as { choices: Array<{ message: { content: string } }> };
    assert.equal(body.choices[0]!.message.content, 'translated back');
  });

  test('a count goes to the deployment calls go to, with its own model, in its protocol; one whose translation refuses is passed over', async () => {
    const count = async (path: string, body: Record<string, unknown>) => {
      const res = await postJson(`${gw.url}${path}`, 'sk-client', { model: 'counted', ...body });
      assert.equal(res.status, 200);
      return ((await res.json()) as { input_tokens: number }).input_tokens;
    };
    const messages = (content: unknown = 'hi') => count('/v1/messages/count_tokens', { messages: [{ role: 'user', content }] });
    const responses = (body: Record<string, unknown> = { input: 'hi' }) => count('/v1/responses/input_tokens', body);
    // The OpenAI deployment, which calls go to, though the fallback speaks the client's protocol (found in review: the fallback's model was counted).
    b.queue.push((_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: 11 }));
    assert.equal(await messages(), 11);
    assert.deepEqual([b.seen.at(-1)!.path, b.seen.at(-1)!.body.model], ['/v1/responses/input_tokens', 'b-model']);
    // A block chat cannot express: the Anthropic deployment counts it.
    a.queue.push((_req, res) => json(res, 200, { input_tokens: 12 }));
    assert.equal(await messages([{ type: 'search_result', source: 's', title: 't', content: [{ type: 'text', text: 'x' }] }]), 12);
    assert.deepEqual([a.seen.at(-1)!.path, a.seen.at(-1)!.body.model], ['/v1/messages/count_tokens', 'ant-model']);
    // The OpenAI deployment cools down: an OpenAI client's count is translated for the Anthropic one.
    b.queue.push(status(503));
    a.queue.push((_req, res) => json(res, 200, anthropicMessage('from ant')));
    const res = await call('counted');
    assert.equal(res.headers.get('x-gateway-deployment'), 'ant');
    await res.arrayBuffer();
    a.queue.push((_req, res2) => json(res2, 200, { input_tokens: 13 }));
    assert.equal(await responses(), 13);
    assert.deepEqual([a.seen.at(-1)!.path, a.seen.at(-1)!.body.model], ['/v1/messages/count_tokens', 'ant-model']);
    // What the Anthropic deployment's translation refuses goes to the one that can count it, cooling or not.
    b.queue.push((_req, res2) => json(res2, 200, { object: 'response.input_tokens', input_tokens: 14 }));
    assert.equal(await responses({ previous_response_id: 'resp_1', input: 'go on' }), 14);
    assert.deepEqual([b.seen.at(-1)!.path, b.seen.at(-1)!.body.previous_response_id], ['/v1/responses/input_tokens', 'resp_1']);
  });

  test('a deployment whose server has no count (vLLM, Ollama: 404) passes the count on to the next that can take it; none left is 400', async () => {
    const count = () => postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-client', { model: 'counted', messages: [{ role: 'user', content: 'hi' }] });
    b.queue.push((_req, res) => json(res, 404, { detail: 'Not Found' }));
    a.queue.push((_req, res) => json(res, 200, { input_tokens: 21 }));
    let res = await count();
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { input_tokens: 21 });
    assert.deepEqual([b.seen.at(-1)!.path, a.seen.at(-1)!.path, a.seen.at(-1)!.body.model], ['/v1/responses/input_tokens', '/v1/messages/count_tokens', 'ant-model']);
    b.queue.push((_req, res2) => json(res2, 404, { detail: 'Not Found' }));
    a.queue.push((_req, res2) => json(res2, 405, { error: { message: 'no' } }));
    res = await count();
    assert.equal(res.status, 400);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /cannot count tokens/);
    // A 404 in the provider's own error envelope is about the request, not a missing count: it is the answer, never sent on
    // (found in review: an unknown previous_response_id went to another deployment, maybe another project).
    const asked = a.seen.length;
    b.queue.push((_req, res2) => json(res2, 404, { error: { message: 'Previous response with id \'resp_x\' not found.', type: 'invalid_request_error', code: 'previous_response_not_found' } }));
    res = await postJson(`${gw.url}/v1/responses/input_tokens`, 'sk-client', { model: 'counted', previous_response_id: 'resp_x', input: 'go on' });
    assert.notEqual(res.status, 200);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /resp_x/);
    assert.equal(a.seen.length, asked, 'not sent on');
  });

  test('a deployment without a count takes none of the attempts: with maxAttempts 3, two failures after it still reach a fourth', async () => {
    a.queue.push((_req, res) => json(res, 404, { detail: 'Not Found' }), (_req, res) => json(res, 200, { input_tokens: 5 }));
    b.queue.push(status(503));
    c.queue.push(status(503));
    const res = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-client', { model: 'fourfold', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(res.status, 200, await res.clone().text());
    assert.deepEqual(await res.json(), { input_tokens: 5 });
    assert.deepEqual(a.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/messages/count_tokens']);
  });

  test('a count whose deployment fails as a call fails over (5xx, 529, no connection) moves on to the next; a refusal is the answer; nothing cools down', async () => {
    const count = (model = 'counted') => postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-client', { model, messages: [{ role: 'user', content: 'hi' }] });
    b.queue.push(status(503));
    a.queue.push((_req, res) => json(res, 200, { input_tokens: 21 }));
    let res = await count();
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { input_tokens: 21 });
    assert.deepEqual([b.seen.at(-1)!.path, a.seen.at(-1)!.path], ['/v1/responses/input_tokens', '/v1/messages/count_tokens']);
    // A 408 too (review of that change: it was taken for the request's own answer).
    b.queue.push(status(408));
    a.queue.push((_req, res2) => json(res2, 200, { input_tokens: 22 }));
    res = await count();
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { input_tokens: 22 });
    // Every one failing: the last failure is the answer. The last deployment that can count gets
    // section 6's retries with the attempts left (review of that change: a routed count had one).
    b.queue.push(status(500));
    a.queue.push(status(529), status(529));
    res = await count();
    assert.equal(res.status, 503);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_overloaded');
    // A deployment that cannot be reached: the next counts.
    b.queue.push((_req, res2) => json(res2, 200, { object: 'response.input_tokens', input_tokens: 9 }));
    res = await postJson(`${gw.url}/v1/responses/input_tokens`, 'sk-client', { model: 'gone', input: 'hi' });
    assert.equal(res.status, 200);
    assert.equal(((await res.json()) as { input_tokens: number }).input_tokens, 9);
    // The request's own 4xx is its answer, never sent on.
    const asked = a.seen.length;
    b.queue.push(status(400));
    res = await count();
    assert.equal(res.status, 400);
    assert.equal(a.seen.length, asked, 'not sent on');
    // The counts cooled nothing down: calls still go to b.
    b.queue.push(ok);
    const answered = await call('counted');
    assert.equal(answered.status, 200);
    assert.equal(answered.headers.get('x-gateway-deployment'), 'b');
    await answered.arrayBuffer();
  });

  test('a routed model with one deployment that can take the call keeps that provider\'s own retries', async () => {
    // Embeddings have no Anthropic form: only b can take them, and it gets §6's retries.
    b.queue.push(status(503));
    const res = await postJson(`${gw.url}/v1/embeddings`, 'sk-client', { model: 'split', input: 'hello' });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-gateway-deployment'), 'b');
    await res.arrayBuffer();
    assert.equal(b.hits, 2, 'the 503 was retried on b');
    assert.equal(a.hits, 0);
  });

  test('/metrics counts attempts, failovers and cooldowns per provider', async () => {
    const counts = async () => {
      const text = await (await fetch(`${gw.url}/metrics`)).text();
      const n = (name: string, provider: string) => Number(new RegExp(`^${name}\\{provider="${provider}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? 0);
      return [n('mg_upstream_attempts_total', 'a'), n('mg_upstream_attempts_total', 'b'), n('mg_failovers_total', 'a'), n('mg_cooldowns_total', 'a')];
    };
    const before = await counts();
    a.queue.push(status(503));
    await (await call('pair')).arrayBuffer();
    const after = await counts();
    assert.deepEqual(after.map((v, i) => v - before[i]!), [1, 1, 1, 1], 'one attempt on each, one failover off a, one cooldown of a');
  });
});
