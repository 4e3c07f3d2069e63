import assert from 'node:assert/strict';
import type { Socket } from 'node:net';
import { describe, test } from 'node:test';
import { json, openaiCompletion } from '../helpers/fake-upstream.js';
import { behindFakeProvider } from '../helpers/behind-fake.js';
import { entriesOf, postJson } from '../helpers/gateway.js';

/**
 * Found in review of providers misbehaving at the connection level: a kept-alive connection the
 * provider closed while it sat idle in the pool (uvicorn closes them after 5 s) failed the call
 * as the provider's fault: the healthy deployment was cooled down and the call moved to the
 * fallback; and `Content-Type: Text/Event-Stream` (media types are case-insensitive) was read
 * as a whole answer, the stream buffered.
 */
describe('regression: a provider\'s connections and headers', () => {
  const { up, gw } = behindFakeProvider((base) => ({
    routing: { maxAttempts: 2, cooldownMs: 60_000 },
    plans: { p: { rpm: 1000, concurrency: 5 } },
    accounts: { acct_f: { plan: 'p' } },
    keys: { key_f: { account: 'acct_f', key: 'sk-f' } },
    models: {
      pair: { price: { inputPerMillion: 1, outputPerMillion: 2 }, deployments: [{ provider: 'primary' }, { provider: 'spare', fallback: true }] },
      counted: { provider: 'ant', price: { inputPerMillion: 1, outputPerMillion: 2 } },
      solo: { provider: 'solo', price: { inputPerMillion: 1, outputPerMillion: 2 } },
    },
    providers: {
      primary: { protocol: 'openai', baseUrl: `${base}/v1` },
      // Another origin's name for the same server: its own pool, so the primary's sockets are its own.
      spare: { protocol: 'openai', baseUrl: `${base.replace('127.0.0.1', 'localhost')}/v1` },
      ant: { protocol: 'anthropic', baseUrl: base },
      // One more name for the same server, so its pool is this test's own.
      solo: { protocol: 'openai', baseUrl: `${base.replace('127.0.0.1', '[::ffff:127.0.0.1]')}/v1` },
    },
  }));

  /** Answers once on a connection; the next request on it finds the connection reset. */
  const onceThenReset = (answer: Parameters<typeof up.queue.push>[0]) => {
    const served = new WeakSet<Socket>();
    return (req: Parameters<typeof answer>[0], res: Parameters<typeof answer>[1], body: Parameters<typeof answer>[2]) => {
      if (served.has(req.socket)) return req.socket.resetAndDestroy();
      served.add(req.socket);
      answer(req, res, body);
    };
  };

  test('a call on a pooled connection the provider reset is sent again on a new one: no failover, no cooldown', async () => {
    up.fallback = onceThenReset((_req, res) => json(res, 200, openaiCompletion('ok')));
    for (let i = 0; i < 4; i++) {
      const res = await postJson(`${gw().url}/v1/chat/completions`, 'sk-f', { model: 'pair', messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('x-gateway-deployment'), 'primary', `call ${i}: served by the primary`);
      await res.text();
    }
    assert.equal(entriesOf(gw(), 'acct_f').filter((e) => e.deployment === 'spare').length, 0);
  });

  test('a token count on a pooled connection the provider reset is sent again: answered, not 502', async () => {
    up.fallback = onceThenReset((_req, res) => json(res, 200, { input_tokens: 7 }));
    for (let i = 0; i < 3; i++) {
      const res = await postJson(`${gw().url}/v1/messages/count_tokens`, 'sk-f', { model: 'counted', messages: [{ role: 'user', content: 'hi' }] });
      assert.deepEqual([res.status, await res.json()], [200, { input_tokens: 7 }], `count ${i}`);
    }
  });

  test('a request the provider resets every time is sent again once per attempt, on a new connection, not on every idle one', async () => {
    up.fallback = (_req, res) => json(res, 200, openaiCompletion('ok'));
    const call = () => postJson(`${gw().url}/v1/chat/completions`, 'sk-f', { model: 'solo', messages: [{ role: 'user', content: 'hi' }] });
    // Five connections left idle in the pool.
    await Promise.all(Array.from({ length: 5 }, async () => (await call()).text()));
    up.fallback = (req) => req.socket.resetAndDestroy();
    const hits = up.hits;
    const res = await call();
    assert.equal(res.status, 502);
    await res.text();
    // Two attempts (routing.maxAttempts), each sent again once on a new connection.
    assert.equal(up.hits - hits, 4);
  });

  test('a stream sent as Text/Event-Stream is relayed as a stream and charged its usage', async () => {
    up.fallback = (_req, res) => json(res, 500, { error: { message: 'no behaviour queued' } });
    const chunk = (data: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', ...data })}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'Content-Type': 'Text/Event-Stream; Charset=UTF-8' });
      res.end(chunk({ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }) +
        chunk({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 1 } }) + 'data: [DONE]\n\n');
    });
    const res = await postJson(`${gw().url}/v1/chat/completions`, 'sk-f', { model: 'pair', stream: true, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
    const text = await res.text();
    assert.ok(text.endsWith('data: [DONE]\n\n'), text);
    assert.ok(!text.includes('"usage"'), 'the usage chunk the client did not ask for is taken out');
    const charge = entriesOf(gw(), 'acct_f').at(-1)!;
    assert.deepEqual([charge.estimated, charge.inputTokens, charge.outputTokens], [false, 5, 1]);
  });
});
