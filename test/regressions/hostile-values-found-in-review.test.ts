import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';

/**
 * Found in the review of the clients, translation and routing work:
 * - a provider's stream event nested ~8,000 deep parsed, but JSON.stringify of its tool calls
 *   (metering) overflowed the stack inside a 'data' handler: the process died;
 * - one small embeddings request made the mock build a vector per input of up to 16,384
 *   numbers, unbounded in the number of inputs: seconds of blocked event loop, or out of memory;
 * - `reasoning_effort: "__proto__"` (or "constructor") found an inherited property of the
 *   budget table instead of nothing: a NaN budget went upstream instead of a 400.
 */
describe('regression: hostile values found in review', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 1_000_000 },
      models: {
        'echo-1': { provider: 'mock' },
        'gpt-x': { provider: 'oai', price: 'free' },
        'claude-x': { provider: 'ant', price: 'free' },
      },
      providers: { mock: { protocol: 'mock' }, oai: { protocol: 'openai', baseUrl: `${base}/v1` }, ant: { protocol: 'anthropic', baseUrl: base } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  test('a stream event too deeply nested to meter cuts that answer; the gateway goes on', async () => {
    const deep = `${'['.repeat(8000)}${']'.repeat(8000)}`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: {"choices":[{"index":0,"delta":{"tool_calls":${deep}}}]}\n\n`);
      setTimeout(() => res.end('data: [DONE]\n\n'), 50);
    });
    // Cut before anything reached the client (its head waits for the first bytes): an error answer.
    const cut = await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', chatBody('gpt-x', 'x', { stream: true }));
    assert.equal(cut.status, 502);
    assert.match(((await cut.json()) as { error: { message: string } }).error.message, /cut off/);
    up.queue.push((_req, r) => json(r, 200, openaiCompletion('still here')));
    const next = await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', chatBody('gpt-x'));
    assert.equal(next.status, 200);
    assert.equal(((await next.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content, 'still here');
  });

  test('embeddings: at most 2,048 inputs; the mock builds at most 100,000 numbers, and a refusal is free', async () => {
    const embed = (body: Record<string, unknown>) => postJson(`${gw.url}/v1/embeddings`, 'sk-alice', { model: 'echo-1', ...body });
    let res = await embed({ input: Array.from({ length: 2049 }, () => 'x') });
    assert.equal(res.status, 400);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /at most 2048 items/);
    const before = entriesOf(gw, 'acct_alice').length;
    const started = Date.now();
    res = await embed({ input: Array.from({ length: 2000 }, () => 'x'), dimensions: 16_384 });
    assert.equal(res.status, 400);
    assert.ok(Date.now() - started < 2000, 'refused before building anything');
    assert.equal(entriesOf(gw, 'acct_alice').length, before, 'not charged');
    // 10 inputs of 16,384: 163,840 numbers (a 9 MB answer and 127 ms of the event loop at 1,000,000).
    res = await embed({ input: Array.from({ length: 10 }, () => 'x'), dimensions: 16_384 });
    assert.equal(res.status, 400);
    await res.text();
    res = await embed({ input: ['a', 'b'], dimensions: 4 });
    assert.equal(res.status, 200);
    assert.equal(((await res.json()) as { data: Array<{ embedding: number[] }> }).data[1]!.embedding.length, 4);
  });

  test('embeddings on the mock: base64 as the official SDK asks for it, the same vector; token ids counted as tokens', async () => {
    const embed = async (body: Record<string, unknown>) => {
      const res = await postJson(`${gw.url}/v1/embeddings`, 'sk-alice', { model: 'echo-1', ...body });
      assert.equal(res.status, 200);
      return (await res.json()) as { data: Array<{ embedding: number[] | string }>; usage: { prompt_tokens: number } };
    };
    const plain = (await embed({ input: 'hello' })).data[0]!.embedding as number[];
    const encoded = (await embed({ input: 'hello', encoding_format: 'base64' })).data[0]!.embedding as string;
    const bytes = Buffer.from(encoded, 'base64');
    const decoded = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4));
    assert.equal(decoded.length, plain.length);
    decoded.forEach((x, i) => assert.ok(Math.abs(x - plain[i]!) < 1e-6));
    assert.equal((await embed({ input: [[1, 2, 3], [4, 5]] })).usage.prompt_tokens, 5);
  });

  test('a reasoning effort named like an inherited property is a 400, never a made-up budget', async () => {
    for (const effort of ['__proto__', 'constructor', 'toString']) {
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', chatBody('claude-x', 'x', { reasoning_effort: effort, max_tokens: 4000 }));
      assert.equal(res.status, 400, effort);
      assert.equal(((await res.json()) as { error: { param: string } }).error.param, 'reasoning_effort');
    }
    assert.equal(up.seen.filter((s) => s.path === '/v1/messages').length, 0, 'nothing went upstream');
  });

  test('count_tokens with a body nested too deeply is a 400, like a call', async () => {
    const deep = `${'['.repeat(5000)}${']'.repeat(5000)}`;
    const body = `{"model":"claude-x","messages":[{"role":"user","content":"x"}],"metadata":{"x":${deep}}}`;
    const res = await postJson(`${gw.url}/v1/messages/count_tokens`, 'sk-alice', body);
    assert.equal(res.status, 400);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /nests deeper/);
  });
});
