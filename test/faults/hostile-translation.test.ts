import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { anthropicMessage, FakeUpstream, json } from '../helpers/fake-upstream.js';
import { MAX_PARSED_ANSWER_BYTES } from '../../src/providers/http.js';
import { postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';

/**
 * A key holder's hostile requests to a model that is translated (OpenAI Chat and Responses to
 * an Anthropic provider). Found in review: a hosted tool's type was put as sent into a response
 * header, and a character a header cannot hold threw in the provider's callback, which ended
 * the process; values that are objects, arguments nested in a string, and a turn of many parts
 * answered 500. Each is the client's 400, or a call that works; never a 500, never a crash.
 */
describe('fault: hostile requests to a translated model', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    up.fallback = (_req, res) => json(res, 200, anthropicMessage('ok'));
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 8_000_000 },
      plans: { p: { rpm: 10_000, concurrency: 10 } },
      accounts: { acct_h: { plan: 'p' } },
      keys: { key_h: { account: 'acct_h', key: 'sk-h' } },
      models: { claude: { provider: 'ant', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
      providers: { ant: { protocol: 'anthropic', baseUrl: base } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  const call = (path: string, body: Record<string, unknown>) => postJson(`${gw.url}${path}`, 'sk-h', { model: 'claude', ...body });
  const refused = async (res: Response, param: string) => {
    assert.equal(res.status, 400);
    const { error } = (await res.json()) as { error: { code: string; param: string } };
    assert.equal(error.param, param);
  };

  test('a hosted tool whose type a header cannot hold (a CR LF, a euro sign, a lone surrogate) is dropped as "tools.other", and the gateway lives on', async () => {
    for (const type of ['a\r\nb', '€', '\ud800', 'x'.repeat(100)]) {
      const res = await call('/v1/responses', { input: 'hi', tools: [{ type }] });
      assert.equal(res.status, 200, type);
      assert.equal(res.headers.get('x-gateway-dropped'), 'tools.other');
      await res.text();
    }
    const named = await call('/v1/responses', { input: 'hi', tools: [{ type: 'file_search' }] });
    assert.equal(named.headers.get('x-gateway-dropped'), 'tools.file_search', 'a plain name is still named');
    await named.text();
    assert.equal((await fetch(`${gw.url}/healthz`)).status, 200);
  });

  test('40,000 distinct hosted tool types: eight are named, the rest are "tools.other" (found in review: each was named, checked against the others, quadratic, into a header of megabytes); 200,000 are refused unparsed', async () => {
    const tools = Array.from({ length: 40_000 }, (_, i) => ({ type: `t${i}` }));
    const many = await call('/v1/responses', { input: 'hi', tools: Array.from({ length: 200_000 }, (_, i) => ({ type: `t${i}` })) });
    assert.equal(many.status, 400, 'more objects than any real body (src/http/body-shape.ts)');
    await many.text();
    const res = await call('/v1/responses', { input: 'hi', tools: [...tools, { type: 't3' }] });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-gateway-dropped'), 'tools.t0, tools.t1, tools.t2, tools.t3, tools.t4, tools.t5, tools.t6, tools.t7, tools.other');
    await res.text();
  });

  test('a type that is an object (String() of it throws) is refused, not a 500', async () => {
    const odd = { toString: 1 };
    await refused(await call('/v1/responses', { input: [{ role: 'user', content: [{ type: odd }] }] }), 'input[0].content[0]');
    await refused(await call('/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: odd }] }] }), 'messages[0].content[0]');
  });

  test('tool-call arguments nested past the depth bound inside their string are refused, not a 500', async () => {
    const deep = `{"a":${'['.repeat(20_000)}${']'.repeat(20_000)}}`;
    await refused(await call('/v1/chat/completions', {
      messages: [
        { role: 'user', content: 'x' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: deep } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'done' },
      ],
    }), 'messages[1].tool_calls[0].function.arguments');
  });

  test('a turn of 20,000 parts after another of the same role is merged, not a 500; one of 130,000 (past what a spread takes) is refused unparsed', async () => {
    const turn = (n: number) => ({ messages: [{ role: 'user', content: 'x' }, { role: 'user', content: Array.from({ length: n }, () => ({ type: 'text', text: 'a' })) }] });
    const res = await call('/v1/chat/completions', turn(20_000));
    assert.equal(res.status, 200);
    await res.text();
    const many = await call('/v1/chat/completions', turn(130_000));
    assert.equal(many.status, 400);
    await many.text();
  });

  test('strict function tools are named as dropped; instructions or text.format of the wrong type are refused', async () => {
    const fn = { name: 'f', parameters: { type: 'object', properties: {} }, strict: true };
    let res = await call('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: fn }] });
    assert.equal(res.headers.get('x-gateway-dropped'), 'tools.strict');
    await res.text();
    res = await call('/v1/responses', { input: 'x', tools: [{ type: 'function', ...fn }] });
    assert.equal(res.headers.get('x-gateway-dropped'), 'tools.strict');
    await res.text();
    await refused(await call('/v1/responses', { input: 'x', instructions: ['be brief'] }), 'instructions');
    await refused(await call('/v1/responses', { input: 'x', text: { format: 'json' } }), 'text.format');
  });

  test('an answer over the parse bound cannot be translated: 502, never parsed (found in review: one parse of 9 MB of `{}`s takes about 200 MB of heap)', async () => {
    const content = `[${'{"type":"text","text":""},'.repeat(400_000)}{"type":"text","text":"end"}]`;
    assert.ok(content.length > MAX_PARSED_ANSWER_BYTES);
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`{"id":"msg_big","type":"message","role":"assistant","usage":{"input_tokens":3,"output_tokens":4},"content":${content}}`);
    });
    const res = await call('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }] });
    assert.equal(res.status, 502);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /too large to translate/);
  });
});
