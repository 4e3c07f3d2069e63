import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, beforeEach, describe, test } from 'node:test';
import {
  anthropicMessage, anthropicStream, FakeUpstream, json, openaiCompletion, openaiStream,
} from '../helpers/fake-upstream.js';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

const PRICE = { inputPerMillion: 1, outputPerMillion: 2, cacheReadPerMillion: 0.5, cacheWritePerMillion: 4 };

function sseData(text: string): string[] {
  return text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
}

describe('OpenAI and Anthropic upstreams (fake provider on loopback)', () => {
  const up = new FakeUpstream();
  let gw: Running;
  let base: string;
  before(async () => {
    base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 10_000, concurrency: 1 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-client' } },
      models: {
        'gpt-x': { provider: 'oai', upstreamModel: 'up-gpt', price: PRICE },
        'claude-x': { provider: 'ant', upstreamModel: 'up-claude', price: PRICE },
        'emb-x': { provider: 'oai', price: 'free' },
      },
      providers: {
        oai: { protocol: 'openai', baseUrl: `${base}/v1`, apiKeyEnv: 'UP_OPENAI_KEY', timeoutMs: 1500, streamIdleTimeoutMs: 300 },
        ant: { protocol: 'anthropic', baseUrl: base, apiKeyEnv: 'UP_ANTHROPIC_KEY', timeoutMs: 1500 },
      },
    }), { env: { UP_OPENAI_KEY: 'sk-provider-openai', UP_ANTHROPIC_KEY: 'sk-provider-anthropic' } });
  });
  after(async () => {
    await gw.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
  });

  const lastCharge = () => entriesOf(gw, 'acct_a').at(-1)!;

  test('chat: the provider key replaces the client key, model becomes upstreamModel, usage is metered', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('hi!', {
      prompt_tokens: 1000, completion_tokens: 500, total_tokens: 1500, prompt_tokens_details: { cached_tokens: 400 } } as never),
    { 'x-request-id': 'up-1', 'set-cookie': 'secret=1', 'x-ratelimit-remaining-requests': '5', 'openai-processing-ms': '7' }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x', 'hello'), { 'x-request-id': 'trace-1' });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-upstream-request-id'), 'up-1');
    assert.equal(res.headers.get('openai-processing-ms'), '7');
    assert.equal(res.headers.get('set-cookie'), null);
    const body = (await res.json()) as { choices: Array<{ message: { content: string } }> };
    assert.equal(body.choices[0]!.message.content, 'hi!');
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/chat/completions');
    assert.equal(seen.headers.host, new URL(base).host);
    assert.equal(seen.headers['accept-encoding'], 'identity');
    assert.equal(seen.headers.authorization, 'Bearer sk-provider-openai');
    assert.equal(seen.headers['x-request-id'], 'trace-1');
    assert.equal(seen.body.model, 'up-gpt');
    assert.ok(!JSON.stringify(seen.headers).includes('sk-client'));
    // 600 input x $1 + 400 cached x $0.5 + 500 output x $2 per million = 600 + 200 + 1000 micro-dollars.
    assert.equal(lastCharge().amountMicro, -1800);
    assert.equal(lastCharge().estimated, false);
  });

  test('the body goes upstream as the client wrote it, only the model swapped; a model named twice or in escapes is re-serialised', async () => {
    // Key order, spacing, escapes and numbers as the client wrote them: only the model's value changes.
    const written = '{ "messages" : [{"role":"user","content":"caf\\u00e9 \\"q\\" {x}"}],\n "model":"gpt-x", "temperature": 1.50 }';
    for (let i = 0; i < 4; i++) up.queue.push((_req, res) => json(res, 200, openaiCompletion('ok')));
    assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', written)).status, 200);
    assert.equal(up.seen.at(-1)!.text, written.replace('"gpt-x"', '"up-gpt"'));
    // JSON.parse keeps the last of two keys, a provider's parser may keep the first: the client
    // must not get to choose which model the provider runs. Re-serialised, the body has one.
    for (const twice of ['{"model":"up-gpt","messages":[{"role":"user","content":"x"}],"model":"gpt-x"}',
      '{"mod\\u0065l":"up-gpt","messages":[{"role":"user","content":"x"}],"model":"gpt-x"}']) {
      assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', twice)).status, 200);
      const seen = up.seen.at(-1)!;
      assert.equal(seen.text.match(/model/g)?.length, 1, seen.text);
      assert.equal(seen.body.model, 'up-gpt');
    }
  });

  test('chat stream: usage is requested upstream, stripped for a client that did not ask, kept for one that did', async () => {
    const usage = { prompt_tokens: 100, completion_tokens: 50, total_tokens: 150 };
    up.queue.push(openaiStream(['Hel', 'lo'], usage));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x', 'x', { stream: true }));
    assert.equal(res.headers.get('content-type'), 'text/event-stream');
    const events = sseData(await res.text());
    assert.equal(events.at(-1), '[DONE]');
    assert.ok(!events.some((e) => e.includes('"completion_tokens"')), 'the usage chunk is removed');
    assert.deepEqual((up.seen.at(-1)!.body.stream_options as Record<string, unknown>), { include_usage: true });
    assert.equal(lastCharge().amountMicro, -200);

    up.queue.push(openaiStream(['Hel', 'lo'], usage));
    const asked = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client',
      chatBody('gpt-x', 'x', { stream: true, stream_options: { include_usage: true } }));
    assert.ok(sseData(await asked.text()).some((e) => e.includes('"completion_tokens":50')));
  });

  test('chat stream in whole-event writes: passed on byte for byte, except an event the client did not ask for', async () => {
    // Each write is whole events (the relay may then send the provider's own bytes): text in
    // several scripts, escapes as the provider wrote them, the usage chunk in the same write as text.
    const chunk = (content: string) => `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"${content}"},"finish_reason":null}]}\n\n`;
    const usageChunk = 'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150}}\n\n';
    const writes = [chunk('caf\\u00e9 ') + chunk('ünïcödé, 𝄞, 日本語'), chunk('"q"\\n') + usageChunk];
    const send = (_req: unknown, res: import('node:http').ServerResponse) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(writes[0]);
      setTimeout(() => {
        res.write(writes[1]);
        setTimeout(() => res.end('data: [DONE]\n\n'), 20);
      }, 20);
    };
    up.queue.push(send);
    const asked = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client',
      chatBody('gpt-x', 'x', { stream: true, stream_options: { include_usage: true } }));
    assert.equal(Buffer.from(await asked.arrayBuffer()).toString('utf8'), `${writes.join('')}data: [DONE]\n\n`);
    assert.equal(lastCharge().amountMicro, -200);

    up.queue.push(send);
    const plain = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x', 'x', { stream: true }));
    assert.equal(await plain.text(), `${writes[0]}${chunk('"q"\\n')}data: [DONE]\n\n`, 'the usage chunk is removed');
  });

  test('messages: x-api-key and anthropic-version upstream, cache tokens priced, -thinking turns thinking on', async () => {
    up.queue.push((_req, res) => json(res, 200, anthropicMessage('yo', {
      input_tokens: 100, output_tokens: 10, cache_read_input_tokens: 1000, cache_creation_input_tokens: 10 }), { 'request-id': 'req_up_9' }));
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-client',
      { model: 'claude-x', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }, { 'anthropic-beta': 'b1' });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-upstream-request-id'), 'req_up_9', "Anthropic's request-id is passed on too");
    assert.equal(((await res.json()) as { content: Array<{ text: string }> }).content[0]!.text, 'yo');
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/messages');
    assert.equal(seen.headers['x-api-key'], 'sk-provider-anthropic');
    assert.equal(seen.headers['anthropic-version'], '2023-06-01');
    assert.equal(seen.headers['anthropic-beta'], 'b1');
    assert.equal(seen.headers.authorization, undefined);
    // 100 x 1 + 10 x 2 + 1000 x 0.5 + 10 x 4 = 660
    assert.equal(lastCharge().amountMicro, -660);

    up.queue.push(anthropicStream(['a', 'b'], { input: 10, output: 2000 }));
    const thinking = await postJson(`${gw.url}/v1/messages`, 'sk-client',
      { model: 'claude-x-thinking', max_tokens: 4000, stream: true, messages: [{ role: 'user', content: 'hi' }] });
    const text = await thinking.text();
    assert.match(text, /event: message_stop/);
    const body = up.seen.at(-1)!.body;
    assert.equal(body.model, 'up-claude');
    assert.deepEqual(body.thinking, { type: 'enabled', budget_tokens: 2000 });
    assert.equal(lastCharge().amountMicro, -(10 + 4000));
    assert.equal(lastCharge().model, 'claude-x-thinking');
  });

  test('an endpoint the model\'s protocol lacks, with no translation to it, is 400 before admission', async () => {
    const hits = up.hits;
    const res = await postJson(`${gw.url}/v1/embeddings`, 'sk-client', { model: 'claude-x', input: 'x' });
    assert.equal(res.status, 400);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /anthropic protocol, which has no \/v1\/embeddings; use \/v1\/messages/);
    assert.equal(up.hits, hits);
  });

  test('embeddings pass through with usage', async () => {
    up.queue.push((_req, res) => json(res, 200, { object: 'list', data: [{ object: 'embedding', index: 0, embedding: [0.1] }],
      model: 'emb', usage: { prompt_tokens: 3, total_tokens: 3 } }));
    const res = await postJson(`${gw.url}/v1/embeddings`, 'sk-client', { model: 'emb-x', input: 'abc' });
    assert.equal(res.status, 200);
    assert.equal(up.seen.at(-1)!.path, '/v1/embeddings');
  });

  test('503, 529 and connection errors are retried before the first byte', async () => {
    const hits = up.hits;
    up.queue.push((_req, res) => json(res, 503, { error: { message: 'busy' } }));
    up.queue.push((_req, res) => res.socket!.destroy());
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('third time')));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(res.status, 200);
    assert.equal(up.hits - hits, 3);

    for (let i = 0; i < 3; i++) up.queue.push((_req, r) => json(r, 529, { error: { message: 'overloaded' } }, { 'retry-after': '0' }));
    const over = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(over.status, 503);
    assert.equal(((await over.json()) as { error: { code: string } }).error.code, 'upstream_overloaded');
    assert.ok(Number(over.headers.get('retry-after')) >= 1);
  });

  test('a provider 429 with a long Retry-After reaches the client as 429 upstream_rate_limited with that wait', async () => {
    up.queue.push((_req, res) => json(res, 429, { error: { message: 'slow down' } }, { 'retry-after': '30' }));
    const hits = up.hits;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(res.status, 429);
    assert.equal(res.headers.get('retry-after'), '30');
    assert.equal(res.headers.get('x-should-retry'), 'true');
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_rate_limited');
    assert.equal(up.hits - hits, 1);
  });

  test('a provider 4xx keeps its status and message; rejected provider credentials are 502', async () => {
    up.queue.push((_req, res) => json(res, 400, { error: { message: 'max_tokens is too large', type: 'invalid_request_error' } }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(res.status, 400);
    assert.equal(res.headers.get('x-should-retry'), 'false');
    const error = ((await res.json()) as { error: Record<string, string> }).error;
    assert.equal(error.code, 'upstream_400');
    assert.equal(error.message, 'max_tokens is too large');

    up.queue.push((_req, r) => json(r, 401, { error: { message: 'bad key' } }));
    const denied = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(denied.status, 502);
    assert.equal(((await denied.json()) as { error: { code: string } }).error.code, 'upstream_error');
  });

  test('no answer in timeoutMs is 504 upstream_timeout; garbage is 502', async () => {
    up.queue.push(() => { /* never answers */ });
    const started = Date.now();
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(res.status, 504);
    assert.ok(Date.now() - started < 3000);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_timeout');

    up.queue.push((_req, r) => { r.writeHead(200, { 'content-type': 'application/json' }); r.end('not json'); });
    const garbage = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(garbage.status, 502);
    await garbage.text();
  });

  test('a non-streamed answer whose body stalls after its headers is 504 after timeoutMs (was 502: found in review, the provider did not answer in time), charged an estimate, and its slot returns', async () => {
    up.queue.push((_req, r) => {
      r.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' });
      r.write('{"id":"chatcmpl-stalled",'); // and nothing more
    });
    const entries = entriesOf(gw, 'acct_a').length;
    const started = Date.now();
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'));
    assert.equal(res.status, 504);
    assert.ok(Date.now() - started >= 1400, 'not before timeoutMs (1500 ms)');
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_timeout');
    // The provider had the request and answered (so it bills): an abnormal end, charged an estimate.
    assert.equal(entriesOf(gw, 'acct_a').length, entries + 1);
    assert.equal(lastCharge().estimated, true);
    assert.equal(lastCharge().inputTokens, estimateInputTokens(chatBody('gpt-x')));
    up.queue.push((_req, r) => json(r, 200, openaiCompletion('ok')));
    assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'))).status, 200, 'concurrency 1: the slot came back');
  });

  test('a stream cut by the provider is cut for the client, charged an estimate, and its slot returns', async () => {
    up.queue.push(openaiStream(['aaaa', 'bbbb', 'cccc'], {}, { cutAfter: 3, delayMs: 20 }));
    const body = chatBody('gpt-x', 'x'.repeat(40), { stream: true });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', body);
    await assert.rejects(res.text());
    const charge = lastCharge();
    assert.equal(charge.estimated, true);
    assert.equal(charge.inputTokens, estimateInputTokens(body)); // every key and value of the messages / 4
    assert.equal(charge.outputTokens, 3); // 12 characters streamed before the cut
    // concurrency 1: the next call is admitted, so the slot came back
    up.queue.push((_req, r) => json(r, 200, openaiCompletion('ok')));
    assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'))).status, 200);
  });

  test('a stream that goes quiet for streamIdleTimeoutMs is cut', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'abcd' } }] })}\n\n`);
    });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x', 'x', { stream: true }));
    await assert.rejects(res.text());
    assert.equal(lastCharge().estimated, true);
  });

  test('a client that goes away aborts the upstream request at once', async () => {
    const closedBefore = up.closedEarly;
    up.queue.push(openaiStream(Array.from({ length: 50 }, () => 'zz'), {}, { delayMs: 50 }));
    await new Promise<void>((resolve) => {
      const req = request(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'x-api-key': 'sk-client', 'content-type': 'application/json' } }, (res) => {
        res.once('data', () => { req.destroy(); resolve(); });
      });
      req.on('error', () => {});
      req.end(JSON.stringify(chatBody('gpt-x', 'x', { stream: true })));
    });
    for (let i = 0; i < 50 && up.closedEarly === closedBefore; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(up.closedEarly, closedBefore + 1);
  });

  test('a duplicate Idempotency-Key never reaches the provider', async () => {
    up.queue.push((_req, res) => setTimeout(() => json(res, 200, openaiCompletion('slow')), 200));
    const hits = up.hits;
    const first = postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'), { 'idempotency-key': 'once' });
    await until(() => up.hits === hits + 1, 5000, 'the first call at the provider');
    const dup = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x'), { 'idempotency-key': 'once' });
    assert.equal(dup.status, 409);
    assert.equal((await first).status, 200);
    assert.equal(up.hits - hits, 1);
  });
});

describe('compatible providers: where the key goes, static headers, several keys', () => {
  test('an Azure-style provider gets api-key and its static headers; calls take the keys in turn; a 429 moves the retry to another key at once', async () => {
    const up = new FakeUpstream();
    const base = await up.start();
    const gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 10 } },
      accounts: { acct_z: { plan: 'p' } },
      keys: { key_z: { account: 'acct_z', key: 'sk-client-z' } },
      models: { 'gpt-az': { provider: 'azure', upstreamModel: 'gpt-4o-deploy', price: PRICE }, 'claude-c': { provider: 'compat', price: PRICE } },
      providers: {
        azure: { protocol: 'openai', baseUrl: `${base}/openai/v1`, apiKeyEnv: ['AZ_1', 'AZ_2'], authHeader: 'api-key', headers: { 'x-ms-client': 'gateway', 'OpenAI-Organization': 'org-9' } },
        compat: { protocol: 'anthropic', baseUrl: base, apiKeyEnv: 'COMPAT_KEY', authHeader: 'bearer' },
      },
    }), { env: { AZ_1: 'az-key-1', AZ_2: 'az-key-2', COMPAT_KEY: 'compat-key' } });
    try {
      up.fallback = (_req, res) => json(res, 200, openaiCompletion('ok'));
      for (let i = 0; i < 4; i++) assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-client-z', chatBody('gpt-az'))).status, 200);
      assert.deepEqual(up.seen.map((s) => s.headers['api-key']), ['az-key-1', 'az-key-2', 'az-key-1', 'az-key-2']);
      for (const seen of up.seen) {
        assert.equal(seen.path, '/openai/v1/chat/completions');
        assert.equal(seen.headers.authorization, undefined);
        assert.deepEqual([seen.headers['x-ms-client'], seen.headers['openai-organization']], ['gateway', 'org-9']);
      }
      // A 429 with a long Retry-After on one key: the next attempt goes to the other key, without waiting.
      up.queue.push((_req, res) => json(res, 429, { error: { message: 'key quota' } }, { 'retry-after': '30' }));
      const seen = up.seen.length;
      const started = Date.now();
      assert.equal((await postJson(`${gw.url}/v1/chat/completions`, 'sk-client-z', chatBody('gpt-az'))).status, 200);
      assert.ok(Date.now() - started < 5000);
      assert.deepEqual(up.seen.slice(seen).map((s) => s.headers['api-key']), ['az-key-1', 'az-key-2']);
      // An Anthropic-compatible server that wants a Bearer token.
      up.fallback = (_req, res) => json(res, 200, anthropicMessage('hi'));
      assert.equal((await postJson(`${gw.url}/v1/messages`, 'sk-client-z', { model: 'claude-c', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] })).status, 200);
      assert.deepEqual([up.seen.at(-1)!.headers.authorization, up.seen.at(-1)!.headers['x-api-key']], ['Bearer compat-key', undefined]);
    } finally {
      await gw.close();
      await up.close();
    }
  });
});

describe('backpressure', () => {
  test('a client that does not read makes the gateway pause the provider, not buffer', async () => {
    const up = new FakeUpstream();
    const base = await up.start();
    const gw = await startGateway(testConfig({
      accounts: { acct_a: { plan: 'pro' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-client' } },
      models: { 'gpt-x': { provider: 'oai', price: 'free' } },
      providers: { oai: { protocol: 'openai', baseUrl: base } },
    }));
    let written = 0;
    let stop = false;
    const event = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'x'.repeat(1000) } }] })}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const pump = () => {
        while (!stop && written < 200e6) {
          written += event.length;
          if (!res.write(event)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    });
    const req = request(`${gw.url}/chat/completions`.replace('/chat', '/v1/chat'), {
      method: 'POST', headers: { 'x-api-key': 'sk-client', 'content-type': 'application/json' },
    });
    await new Promise<void>((resolve) => {
      req.on('response', (res) => {
        res.pause(); // read nothing
        setTimeout(resolve, 700);
      });
      req.end(JSON.stringify(chatBody('gpt-x', 'x', { stream: true })));
    });
    stop = true;
    assert.ok(written < 30e6, `the provider wrote ${written} bytes to a client that read none`);
    req.destroy();
    await gw.close();
    await up.close();
  });
});
