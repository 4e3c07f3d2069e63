import assert from 'node:assert/strict';
import { request, type ServerResponse } from 'node:http';
import { after, before, beforeEach, describe, test } from 'node:test';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { FakeUpstream, json, responsesStream, type Behaviour } from '../helpers/fake-upstream.js';
import { chargeOf, entriesOf, leaveWhenSeen, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a Responses call that continues a stored response (`previous_response_id`)
 * or conversation is billed by OpenAI for the whole stored context, which the request does not
 * carry. A client that left before the final usage was charged the input its request carried
 * (a few tokens), so a stored context of 300,000 tokens, continued by calls cut after their
 * first event, cost the gateway its price each time and the client next to nothing. The
 * provider now counts such a call's input first (POST /v1/responses/input_tokens), and an
 * abnormal end is charged at least that count.
 */

const PRICE = { inputPerMillion: 2, outputPerMillion: 8 };
const STORED = 300_000;

/** The first events of a Responses stream, then nothing: the provider is still generating. */
const startedStream: Behaviour = (_req, res) => {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write(`event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_2', status: 'in_progress', usage: null } })}\n\n`);
  res.write(`event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', sequence_number: 1, item_id: 'msg_0', output_index: 0, content_index: 0, delta: 'Hello' })}\n\n`);
};

const counted = (n: number): Behaviour => (_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: n });

describe('regression: a continued stored context is counted before the call', () => {
  const up = new FakeUpstream();
  let gw: Running;
  const open: ServerResponse[] = [];

  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 10_000, concurrency: 5, dailyCapUsd: 100 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
      models: {
        'gpt-x': { provider: 'oai', upstreamModel: 'gpt-upstream', price: PRICE },
        'gpt-routed': { price: PRICE, deployments: [{ provider: 'oai', upstreamModel: 'gpt-upstream' }, { provider: 'oai2', upstreamModel: 'gpt-upstream' }] },
      },
      providers: {
        oai: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 1000, streamIdleTimeoutMs: 5000, apiKeyEnv: ['K1', 'K2'] },
        oai2: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 1000 },
      },
    }), { env: { K1: 'sk-up-1', K2: 'sk-up-2' } });
  });
  after(async () => {
    for (const res of open) res.destroy();
    await gw?.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
    up.seen.length = 0;
  });

  const last = (): LedgerEntry | undefined => entriesOf(gw, 'acct_a').at(-1);

  /** Sends a streamed call and leaves once its first text arrived. */
  const leaveAfterFirstText = (body: Record<string, unknown>) => leaveWhenSeen(`${gw.url}/v1/responses`, 'sk-a', body, 'Hello');

  const beyond: Array<[string, Record<string, unknown>]> = [
    ['a stored response it continues (previous_response_id)', { previous_response_id: 'resp_1', input: 'go on' }],
    ['a stored conversation it continues', { conversation: 'conv_1', input: 'go on' }],
    ['a stored item it refers to (item_reference)', { input: [{ type: 'item_reference', id: 'msg_big' }, { role: 'user', content: 'go on' }] }],
    ['a stored item by its id alone', { input: [{ id: 'msg_big' }, { role: 'user', content: 'go on' }] }],
    ['a file the provider fetches (input_file by URL)', { input: [{ role: 'user', content: [{ type: 'input_file', file_url: 'https://example.com/big.pdf' }, { type: 'input_text', text: 'go on' }] }] }],
    ['a file in a tool call\'s output', { input: [{ type: 'function_call_output', call_id: 'c', output: [{ type: 'input_file', file_url: 'https://example.com/big.pdf' }] }] }],
  ];
  for (const [what, fields] of beyond) {
    test(`a client that leaves a call with input beyond its request, ${what}, is charged the provider's count of it`, async () => {
      up.queue.push(counted(STORED), (req, res, body) => {
        open.push(res);
        startedStream(req, res, body);
      });
      await chargeOf(gw, 'acct_a', () => leaveAfterFirstText({ model: 'gpt-x', ...fields, stream: true, max_output_tokens: 500, store: true }));
      const charge = last()!;
      assert.equal(charge.estimated, true);
      assert.equal(charge.inputTokens, STORED, 'the input the provider counted, not the few words sent');
      assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses']);
      // The count gets the fields that make up the input, with the upstream model; nothing it would refuse.
      assert.deepEqual(up.seen[0]!.body, { model: 'gpt-upstream', ...fields });
      // With the call's own credential (another key may be another project, which cannot see the stored input).
      assert.equal(up.seen[0]!.headers.authorization, up.seen[1]!.headers.authorization);
    });
  }

  test('a count no model could read is believed only up to 10,000,000 tokens, and logged', async () => {
    up.queue.push(counted(999_999_999), (req, res, body) => {
      open.push(res);
      startedStream(req, res, body);
    });
    await chargeOf(gw, 'acct_a', () => leaveAfterFirstText({ model: 'gpt-x', previous_response_id: 'resp_1', input: 'go on', stream: true }));
    assert.equal(last()!.inputTokens, 10_000_000);
    assert.ok(gw.logs.join('').includes('provider counted more input than any model reads'));
  });

  test('a call that completes is charged its final usage, whatever the count said', async () => {
    up.queue.push(counted(STORED), responsesStream([{ text: 'Hello there' }], { input_tokens: 1234, output_tokens: 5 }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_1', input: 'go on', stream: true });
    assert.equal(res.status, 200);
    assert.match(await res.text(), /response\.completed/);
    const charge = last()!;
    assert.equal(charge.estimated, false);
    assert.equal(charge.inputTokens, 1234);
  });

  test('a call that carries its whole input is not counted first', async () => {
    for (const input of ['hello', [{ role: 'user', content: [{ type: 'input_text', text: 'hello' }] }], [{ type: 'message', role: 'user', content: 'hi' }, { type: 'function_call_output', call_id: 'c', output: 'ok' }]]) {
      up.queue.push(responsesStream([{ text: 'Hi' }], { input_tokens: 3, output_tokens: 1 }));
      const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', input, stream: true, previous_response_id: null });
      assert.equal(res.status, 200);
      await res.text();
    }
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses', '/v1/responses', '/v1/responses']);
  });

  test('a server without the count endpoint (404) takes the call as before', async () => {
    up.queue.push((_req, res) => json(res, 404, { detail: 'Not Found' }), responsesStream([{ text: 'Hi' }], { input_tokens: 40, output_tokens: 1 }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_1', input: 'hello' });
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses']);
    assert.equal(last()!.inputTokens, 40);
  });

  test('a 404 in the provider\'s own error envelope is the call\'s answer, not a missing count (found in review): the call is not sent', async () => {
    up.queue.push((_req, res) => json(res, 404, { error: { message: 'Previous response with id \'resp_gone\' not found.', type: 'invalid_request_error', code: 'previous_response_not_found' } }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_gone', input: 'hello' });
    assert.notEqual(res.status, 200);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /resp_gone/);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens']);
  });

  test('a count the provider refuses as the request\'s fault is the call\'s answer: the call is not sent, and is free', async () => {
    up.queue.push((_req, res) => json(res, 400, { error: { message: 'Previous response with id \'resp_zz\' not found.', type: 'invalid_request_error', param: 'previous_response_id' } }));
    const before = entriesOf(gw, 'acct_a').length;
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_zz', input: 'hello' });
    assert.equal(res.status, 400);
    const answer = await res.json() as { error: { message: string } };
    assert.match(answer.error.message, /resp_zz/);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens']);
    await until(() => gw.gateway.inFlight === 0, 5000, 'the slot back');
    assert.equal(entriesOf(gw, 'acct_a').length, before, 'nothing charged');
  });

  test('a count that does not come in time fails the call as a provider timeout would: free, and not sent', async () => {
    up.queue.push((_req, res) => { open.push(res); });
    const before = entriesOf(gw, 'acct_a').length;
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_1', input: 'hello', stream: true });
    assert.equal(res.status, 504);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /did not count the call's input within 1000 ms/);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens']);
    assert.equal(entriesOf(gw, 'acct_a').length, before, 'nothing charged');
  });

  test('a slow count (a slow file URL is the request\'s doing) does not move a routed call on, nor cool the deployment down', async () => {
    up.queue.push((_req, res) => { open.push(res); });
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-routed', input: [{ role: 'user', content: [{ type: 'input_file', file_url: 'https://slow.example/x.pdf' }] }] });
    assert.equal(res.status, 504);
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens'], 'one count, no other deployment tried');
    assert.equal(gw.gateway.metrics.render().includes('mg_cooldowns_total{'), false);
  });

  test('a count that times out for a stored context is the deployment\'s timeout: a routed call moves on (found in review)', async () => {
    up.queue.push((_req, res) => { open.push(res); }, counted(STORED), responsesStream([{ text: 'Hi' }], { input_tokens: 9, output_tokens: 1 }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-routed', previous_response_id: 'resp_1', input: 'hello' });
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses/input_tokens', '/v1/responses']);
  });

  test('a count the provider rate-limits fails the call as its 429 would (found in review: it went on uncounted)', async () => {
    up.queue.push((_req, res) => json(res, 429, { error: { message: 'Rate limit reached' } }, { 'retry-after': '7' }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', conversation: 'conv_1', input: 'hello' });
    assert.equal(res.status, 429);
    assert.equal(res.headers.get('retry-after'), '7');
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens']);
  });

  test('a client that leaves during the count: the call is never sent, and is free', async () => {
    let counting: ServerResponse | null = null;
    up.queue.push((_req, res) => { counting = res; open.push(res); });
    const before = entriesOf(gw, 'acct_a').length;
    const req = request(`${gw.url}/v1/responses`, { method: 'POST', headers: { authorization: 'Bearer sk-a', 'content-type': 'application/json' } });
    req.on('error', () => {});
    req.end(JSON.stringify({ model: 'gpt-x', previous_response_id: 'resp_1', input: 'hello' }));
    await until(() => counting !== null, 5000, 'the count');
    req.destroy();
    await until(() => gw.gateway.inFlight === 0, 5000, 'the slot back');
    await until(() => (counting as ServerResponse | null)?.destroyed === true || up.closedEarly > 0, 5000, 'the count stopped');
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens']);
    assert.equal(entriesOf(gw, 'acct_a').length, before, 'nothing charged');
  });

  // Found in a review of the whole of these changes.
  test('a count answered 503 is retried as the call would be (section 6), not the call\'s failure at once', async () => {
    up.queue.push((_req, res) => json(res, 503, { error: { message: 'overloaded' } }), counted(STORED), (req, res, body) => {
      open.push(res);
      startedStream(req, res, body);
    });
    await chargeOf(gw, 'acct_a', () => leaveAfterFirstText({ model: 'gpt-x', previous_response_id: 'resp_1', input: 'go on', stream: true, max_output_tokens: 500 }));
    assert.equal(last()!.inputTokens, STORED);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses/input_tokens', '/v1/responses']);
  });

  test('a 404 that names nothing the request got wrong (Azure\'s "Resource not found") is a missing count: the call goes on', async () => {
    up.queue.push((_req, res) => json(res, 404, { error: { code: '404', message: 'Resource not found' } }), responsesStream([{ text: 'Hi' }], { input_tokens: 40, output_tokens: 1 }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_1', input: 'hello' });
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses']);
  });

  test('a count answered without a believable figure lets the call go on, and shows in the metrics', async () => {
    const garbage = async () => Number(/mg_upstream_errors_total\{provider="oai",kind="count_garbage"\} (\d+)/.exec(await (await fetch(`${gw.url}/metrics`)).text())?.[1] ?? 0);
    const seen = await garbage();
    up.queue.push((_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: '123456' }), responsesStream([{ text: 'Hi' }], { input_tokens: 40, output_tokens: 1 }));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-a', { model: 'gpt-x', previous_response_id: 'resp_1', input: 'hello' });
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(await garbage(), seen + 1);
  });

  test('a count on a single deployment\'s /v1/responses/input_tokens is retried after a 503 too', async () => {
    up.queue.push((_req, res) => json(res, 503, { error: { message: 'overloaded' } }), counted(77));
    const res = await postJson(`${gw.url}/v1/responses/input_tokens`, 'sk-a', { model: 'gpt-x', input: 'hello' });
    assert.equal(res.status, 200);
    assert.equal(((await res.json()) as { input_tokens: number }).input_tokens, 77);
    assert.equal(up.seen.length, 2);
  });

  test('a count taken on a deployment that then failed does not set the charge of the call another one served', async () => {
    up.queue.push(counted(9_000_000), (_req, res) => json(res, 500, { error: { message: 'boom' } }), counted(40), (req, res, body) => {
      open.push(res);
      startedStream(req, res, body);
    });
    await chargeOf(gw, 'acct_a', () => leaveAfterFirstText({ model: 'gpt-routed', previous_response_id: 'resp_1', input: 'go on', stream: true, max_output_tokens: 500 }));
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses', '/v1/responses/input_tokens', '/v1/responses']);
    assert.ok(last()!.inputTokens < 1000, `charged ${last()!.inputTokens} input tokens`);
  });

  test('a deployment that had the whole request keeps its count when the call moves on: it may bill it (review of the test above)', async () => {
    up.queue.push(counted(STORED), (_req, res) => { open.push(res); }, counted(40), (req, res, body) => {
      open.push(res);
      startedStream(req, res, body);
    });
    await chargeOf(gw, 'acct_a', () => leaveAfterFirstText({ model: 'gpt-routed', previous_response_id: 'resp_1', input: 'go on', stream: true, max_output_tokens: 500 }));
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses', '/v1/responses/input_tokens', '/v1/responses']);
    assert.equal(last()!.inputTokens, STORED, 'the first deployment timed out holding the whole request');
  });
});
