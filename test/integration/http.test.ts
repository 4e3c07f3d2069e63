import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { auth, chatBody, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/** Every error answer: the envelope, the request id in body and header, and the retry hint. */
async function expectError(res: Response, status: number, code: string, retry: string | null = status >= 500 || status === 429 ? 'true' : 'false') {
  assert.equal(res.status, status, `status for ${code}`);
  const body = (await res.json()) as { type: string; error: Record<string, unknown> };
  assert.equal(body.type, 'error');
  assert.equal(body.error.code, code);
  assert.equal(typeof body.error.message, 'string');
  assert.equal(typeof body.error.type, 'string');
  const id = res.headers.get('x-request-id');
  assert.ok(id !== null && id.length > 0);
  assert.equal(body.error.request_id, id);
  assert.equal(res.headers.get('x-should-retry'), retry);
  return body.error;
}

describe('HTTP contract over a real socket', () => {
  let gw: Running;
  before(async () => { gw = await startGateway(); });
  after(() => gw.close());

  test('probes answer without a key, GET and HEAD, with a request id', async () => {
    const health = await fetch(`${gw.url}/healthz`);
    assert.equal(health.status, 200);
    assert.deepEqual(await health.json(), { status: 'ok' });
    assert.ok(health.headers.get('x-request-id'));
    const ready = await fetch(`${gw.url}/readyz`);
    assert.equal(ready.status, 200);
    assert.deepEqual(await ready.json(), { status: 'ready' });
    const head = await fetch(`${gw.url}/readyz`, { method: 'HEAD' });
    assert.equal(head.status, 200);
    assert.equal(await head.text(), '');
  });

  test('x-request-id: a valid incoming id is echoed, an invalid one replaced, new ids unique', async () => {
    const echoed = await fetch(`${gw.url}/healthz`, { headers: { 'x-request-id': 'trace:abc-123.x_y' } });
    assert.equal(echoed.headers.get('x-request-id'), 'trace:abc-123.x_y');
    const replaced = await fetch(`${gw.url}/healthz`, { headers: { 'x-request-id': 'bad id with spaces' } });
    assert.notEqual(replaced.headers.get('x-request-id'), 'bad id with spaces');
    const long = await fetch(`${gw.url}/nope`, { headers: { 'x-request-id': 'a'.repeat(129) } });
    assert.equal(long.headers.get('x-request-id')!.length < 129, true);
    const ids = new Set<string>();
    for (let i = 0; i < 20; i++) ids.add((await fetch(`${gw.url}/healthz`)).headers.get('x-request-id')!);
    assert.equal(ids.size, 20);
  });

  test('unknown path 404 (before authentication), wrong method 405 with Allow', async () => {
    await expectError(await fetch(`${gw.url}/v2/models`), 404, 'not_found');
    const res = await fetch(`${gw.url}/v1/models`, { method: 'DELETE' });
    assert.equal(res.headers.get('allow'), 'GET');
    await expectError(res, 405, 'method_not_allowed');
    const chat = await fetch(`${gw.url}/v1/chat/completions`, { headers: auth('sk-alice') });
    assert.equal(chat.headers.get('allow'), 'POST');
    await expectError(chat, 405, 'method_not_allowed');
    const healthPost = await fetch(`${gw.url}/healthz`, { method: 'POST' });
    assert.equal(healthPost.headers.get('allow'), 'GET, HEAD');
    await expectError(healthPost, 405, 'method_not_allowed');
  });

  test('authentication: both forms, conflicts, other schemes, unknown and disabled keys', async () => {
    const models = `${gw.url}/v1/models`;
    assert.equal((await fetch(models, { headers: { 'x-api-key': 'sk-alice' } })).status, 200);
    assert.equal((await fetch(models, { headers: { authorization: 'Bearer sk-alice' } })).status, 200);
    assert.equal((await fetch(models, { headers: { authorization: 'bEaReR sk-alice' } })).status, 200);
    assert.equal((await fetch(models, { headers: { authorization: 'Bearer sk-alice', 'x-api-key': 'sk-alice' } })).status, 200);

    const missing = await fetch(models);
    assert.equal(missing.headers.get('www-authenticate'), 'Bearer');
    await expectError(missing, 401, 'missing_api_key');
    await expectError(await fetch(models, { headers: { authorization: 'Basic c2stYWxpY2U6' } }), 401, 'missing_api_key');
    await expectError(await fetch(models, { headers: { authorization: 'Bearer ' } }), 401, 'missing_api_key');
    const conflict = await fetch(models, { headers: { authorization: 'Bearer sk-alice', 'x-api-key': 'sk-bob' } });
    assert.equal(conflict.headers.get('www-authenticate'), 'Bearer');
    await expectError(conflict, 401, 'invalid_api_key');
    await expectError(await fetch(models, { headers: auth('sk-nobody') }), 401, 'invalid_api_key');
    await expectError(await fetch(models, { headers: auth('sk-off') }), 401, 'invalid_api_key');
  });

  test('GET /v1/models lists only the models of the key, sorted, without -thinking variants', async () => {
    const all = await fetch(`${gw.url}/v1/models`, { headers: auth('sk-alice') });
    assert.equal(all.headers.get('content-type'), 'application/json');
    const body = (await all.json()) as { object: string; data: Array<Record<string, unknown>> };
    assert.equal(body.object, 'list');
    assert.deepEqual(body.data.map((m) => m.id), ['echo-1', 'paid-1', 'slow-1']);
    for (const m of body.data) {
      assert.equal(m.object, 'model');
      assert.equal(typeof m.created, 'number');
      assert.equal(m.owned_by, m.id === 'slow-1' ? 'slow' : 'mock');
    }
    const narrow = (await (await fetch(`${gw.url}/v1/models`, { headers: auth('sk-alice-narrow') })).json()) as { data: Array<{ id: string }> };
    assert.deepEqual(narrow.data.map((m) => m.id), ['echo-1']);
  });

  test('GET /v1/models/{id}: the model, or 404 model_not_found when unknown or not allowed', async () => {
    const one = await fetch(`${gw.url}/v1/models/echo-1`, { headers: auth('sk-alice-narrow') });
    assert.equal(one.status, 200);
    assert.deepEqual(Object.keys((await one.json()) as object), ['id', 'object', 'created', 'owned_by', 'type', 'display_name', 'created_at', 'max_tokens']);
    await expectError(await fetch(`${gw.url}/v1/models/paid-1`, { headers: auth('sk-alice-narrow') }), 404, 'model_not_found');
    await expectError(await fetch(`${gw.url}/v1/models/ghost`, { headers: auth('sk-alice') }), 404, 'model_not_found');
    await expectError(await fetch(`${gw.url}/v1/models/echo-1-thinking`, { headers: auth('sk-alice') }), 404, 'model_not_found');
    await expectError(await fetch(`${gw.url}/v1/models/%E0%A4%A`, { headers: auth('sk-alice') }), 404, 'not_found');
  });

  test('bodies: invalid JSON 400, missing fields 400 with param, unknown or forbidden model 404', async () => {
    const url = `${gw.url}/v1/chat/completions`;
    await expectError(await postJson(url, 'sk-alice', '{"model":'), 400, 'invalid_json');
    const noModel = await expectError(await postJson(url, 'sk-alice', { messages: [] }), 400, 'invalid_request');
    assert.equal(noModel.param, 'model');
    const noMessages = await expectError(await postJson(url, 'sk-alice', { model: 'echo-1', messages: [] }), 400, 'invalid_request');
    assert.equal(noMessages.param, 'messages');
    await expectError(await postJson(url, 'sk-alice', chatBody('echo-1', 'x', { max_tokens: 0 })), 400, 'invalid_request');
    await expectError(await postJson(url, 'sk-alice', chatBody('echo-1', 'x', { stream: 'yes' })), 400, 'invalid_request');
    await expectError(await postJson(url, 'sk-alice', '[1,2]'), 400, 'invalid_request');
    await expectError(await postJson(url, 'sk-alice-narrow', chatBody('paid-1')), 404, 'model_not_found');
    await expectError(await postJson(url, 'sk-alice', chatBody('ghost')), 404, 'model_not_found');
    await expectError(await postJson(`${gw.url}/v1/embeddings`, 'sk-alice', { model: 'echo-1' }), 400, 'invalid_request');
  });

  test('authentication comes before the body: no key on a bad body is 401', async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', body: 'not json' });
    await expectError(res, 401, 'missing_api_key');
  });

  test('413 when the body is over maxBodyBytes, declared or streamed', async () => {
    const big = JSON.stringify(chatBody('echo-1', 'x'.repeat(5000)));
    await expectError(await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', big), 413, 'payload_too_large');
    // Chunked: no Content-Length, so the limit is enforced while reading.
    const status = await new Promise<number>((resolve, reject) => {
      const req = request(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { ...auth('sk-alice'), 'transfer-encoding': 'chunked' } }, (res) => {
        res.resume();
        resolve(res.statusCode!);
      });
      req.on('error', reject);
      req.write(big.slice(0, 3000));
      req.write(big.slice(3000));
      req.end();
    });
    assert.equal(status, 413);
  });

  test('Idempotency-Key: malformed 400; a duplicate in flight 409 not retried; free again afterwards', async () => {
    const url = `${gw.url}/v1/chat/completions`;
    await expectError(await postJson(url, 'sk-alice', chatBody('echo-1'), { 'idempotency-key': 'a'.repeat(256) }), 400, 'invalid_idempotency_key');
    await expectError(await postJson(url, 'sk-alice', chatBody('echo-1'), { 'idempotency-key': 'has space' }), 400, 'invalid_idempotency_key');
    const original = postJson(url, 'sk-alice', chatBody('slow-1'), { 'idempotency-key': 'order-42' });
    await until(() => gw.gateway.inFlight === 1, 5000, 'the original in flight');
    const dup = await postJson(url, 'sk-alice', chatBody('slow-1'), { 'idempotency-key': 'order-42' });
    await expectError(dup, 409, 'idempotency_conflict');
    // The same key under another account is independent.
    const other = await postJson(url, 'sk-bob', chatBody('echo-1'), { 'idempotency-key': 'order-42' });
    assert.equal(other.status, 200);
    assert.equal((await original).status, 200);
    const again = await postJson(url, 'sk-alice', chatBody('echo-1'), { 'idempotency-key': 'order-42' });
    assert.equal(again.status, 200);
  });

  test('/v1/messages answers carry request-id as well, errors included', async () => {
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-alice', { model: 'echo-1', max_tokens: 50, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('request-id'), res.headers.get('x-request-id'));
    const body = (await res.json()) as Record<string, unknown>;
    assert.equal(body.type, 'message');
    assert.deepEqual(body.content, [{ type: 'text', text: 'hi' }]);
    assert.deepEqual(body.usage, { input_tokens: 1, output_tokens: 1 });
    const err = await postJson(`${gw.url}/v1/messages`, 'sk-alice', '{');
    assert.equal(err.headers.get('request-id'), err.headers.get('x-request-id'));
    await expectError(err, 400, 'invalid_json');
  });

  test('malformed HTTP gets a 400 in the envelope with a request id', async () => {
    const { connect } = await import('node:net');
    const port = Number(new URL(gw.url).port);
    const text = await new Promise<string>((resolve) => {
      const socket = connect(port, '127.0.0.1', () => socket.write('GET /healthz HTTP/1.1\r\nbad header line\r\n\r\n'));
      let data = '';
      socket.on('data', (d) => { data += d; });
      socket.on('close', () => resolve(data));
    });
    assert.match(text, /^HTTP\/1\.1 400/);
    assert.match(text, /x-request-id: req_/);
    assert.match(text, /"code":"invalid_request"/);
  });

  test('the access log has one JSON line per request and never a key', async () => {
    await fetch(`${gw.url}/v1/models`, { headers: auth('sk-alice', { 'x-request-id': 'log-check-1' }) });
    await new Promise((r) => setImmediate(r));
    gw.gateway.logger.flush();
    const lines = gw.logs.join('').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    const line = lines.find((l) => l.request_id === 'log-check-1');
    assert.ok(line !== undefined);
    assert.deepEqual(
      { method: line.method, path: line.path, status: line.status, account_id: line.account_id },
      { method: 'GET', path: '/v1/models', status: 200, account_id: 'acct_alice' },
    );
    assert.equal(typeof line.ms, 'number');
    const all = gw.logs.join('');
    for (const secret of ['sk-alice', 'sk-bob', 'sk-off']) assert.ok(!all.includes(secret), `log leaks ${secret}`);
  });
});

describe('limits end to end', () => {
  test('RPM: 429 rate_limit_exceeded with an honest Retry-After, per account across its keys', async () => {
    const gw = await startGateway(testConfig({
      keys: {
        key_bob: { account: 'acct_bob', key: 'sk-bob' },
        key_bob2: { account: 'acct_bob', key: 'sk-bob2' },
      },
    }));
    try {
      for (let i = 0; i < 5; i++) {
        assert.equal((await fetch(`${gw.url}/v1/models`, { headers: auth(i % 2 ? 'sk-bob' : 'sk-bob2') })).status, 200);
      }
      const res = await fetch(`${gw.url}/v1/balance`, { headers: auth('sk-bob') });
      const retryAfter = Number(res.headers.get('retry-after'));
      assert.ok(retryAfter >= 59 && retryAfter <= 60, `Retry-After ${retryAfter}`);
      await expectError(res, 429, 'rate_limit_exceeded');
    } finally {
      await gw.close();
    }
  });

  test('concurrency: 429 concurrency_limit_exceeded with Retry-After 1; slots come back', async () => {
    const gw = await startGateway(testConfig({
      plans: { free: { rpm: 100, concurrency: 2 } },
      accounts: { acct_bob: { plan: 'free' } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
    }));
    try {
      const slow = [postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('slow-1')),
        postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('slow-1'))];
      await until(() => gw.gateway.inFlight === 2, 5000, 'both slow calls in flight');
      const res = await fetch(`${gw.url}/v1/models`, { headers: auth('sk-bob') });
      assert.equal(res.headers.get('retry-after'), '1');
      await expectError(res, 429, 'concurrency_limit_exceeded');
      for (const r of await Promise.all(slow)) {
        assert.equal(r.status, 200);
        await r.text();
      }
      assert.equal((await fetch(`${gw.url}/v1/models`, { headers: auth('sk-bob') })).status, 200);
    } finally {
      await gw.close();
    }
  });

  test('daily cap: 402 daily_cap_exceeded with resets_at once the spend reaches the cap; free models still work', async () => {
    const gw = await startGateway(testConfig({
      plans: { tiny: { rpm: 1000, concurrency: 10, dailyCapUsd: 0.0001 } },
      accounts: { acct_bob: { plan: 'tiny' } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
    }));
    try {
      // paid-1: $1/M input, $2/M output. 40 chars -> 10 tokens in, 10 out = 30 micro-dollars per call.
      const text = 'x'.repeat(40);
      let admitted = 0;
      let last: Response | null = null;
      for (let i = 0; i < 10; i++) {
        last = await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', text));
        if (last.status !== 200) break;
        await last.json();
        admitted++;
      }
      assert.equal(admitted, 4, '30+30+30 < 100 admits a 4th; 120 >= 100 refuses the 5th');
      const error = await expectError(last!, 402, 'daily_cap_exceeded');
      assert.equal(last!.headers.get('retry-after'), null);
      const tomorrow = new Date();
      tomorrow.setUTCHours(24, 0, 0, 0);
      assert.equal(error.resets_at, tomorrow.toISOString());
      assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('echo-1'))).status, 200);
      const balance = (await (await fetch(`${gw.url}/v1/balance`, { headers: auth('sk-bob') })).json()) as Record<string, unknown>;
      assert.deepEqual(balance, {
        object: 'balance', account_id: 'acct_bob', currency: 'USD', balance: null, daily_cap: 0.0001,
        daily_spend: 0.00012, daily_remaining: 0, resets_at: tomorrow.toISOString(),
      });
    } finally {
      await gw.close();
    }
  });

  test('prepaid balance: 402 insufficient_balance once spent; /v1/balance reports it', async () => {
    const gw = await startGateway(testConfig({
      accounts: { acct_bob: { plan: 'pro', balanceUsd: 0.00005 } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
    }));
    try {
      const text = 'x'.repeat(40);
      assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', text))).status, 200);
      assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', text))).status, 200);
      await expectError(await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', text)), 402, 'insufficient_balance');
      const balance = (await (await fetch(`${gw.url}/v1/balance`, { headers: auth('sk-bob') })).json()) as Record<string, unknown>;
      assert.equal(balance.balance, -0.00001, 'overshoot is bounded by one request');
      assert.equal(balance.daily_cap, null);
      assert.equal(balance.daily_remaining, null);
      const entries = entriesOf(gw, 'acct_bob');
      assert.deepEqual(entries.map((e) => [e.type, e.amountMicro, e.balanceAfterMicro]), [
        ['credit', 50, 50], ['charge', -30, 20], ['charge', -30, -10],
      ]);
    } finally {
      await gw.close();
    }
  });
});
