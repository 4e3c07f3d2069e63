import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { SseSplitter } from '../../src/providers/sse.js';
import { behindFakeProvider } from '../helpers/behind-fake.js';
import { entriesOf, postJson } from '../helpers/gateway.js';

/**
 * Found in review of the relay under a hostile provider: a whole answer's `usage` object of 60
 * MB was parsed whole (the bound on parsed answers does not apply to it: 22 s of a blocked event
 * loop); a Chat stream's early usage chunk (0 output) was charged as final for all the output
 * after it; and one event sent a byte or two an HTTP chunk held 17 times its bound in heap.
 */
describe('regression: a hostile provider on the relay', () => {
  const { up, gw: running } = behindFakeProvider((base) => ({
    plans: { p: { rpm: 1000, concurrency: 5 } },
    accounts: { acct_h: { plan: 'p' } },
    keys: { key_h: { account: 'acct_h', key: 'sk-h' } },
    models: { gpt: { provider: 'oai', price: { inputPerMillion: 2, outputPerMillion: 8 } } },
    providers: { oai: { protocol: 'openai', baseUrl: base } },
  }));

  const body = (stream: boolean) => ({ model: 'gpt', stream, max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });

  test('a 24 MB usage object is not parsed: the answer is relayed at once and charged as an estimate', async () => {
    const bomb = Buffer.from(`{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"x":[${'{},'.repeat(8_000_000)}{}]}}`);
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(bomb.length) });
      res.end(bomb);
    });
    const began = Date.now();
    const res = await postJson(`${running().url}/v1/chat/completions`, 'sk-h', body(false));
    assert.equal(res.status, 200);
    assert.equal((await res.arrayBuffer()).byteLength, bomb.length);
    const ms = Date.now() - began;
    // Parsed whole, it took 5.5 s here.
    assert.ok(ms < 3000, `took ${ms} ms`);
    assert.equal(entriesOf(running(), 'acct_h').at(-1)!.estimated, true);
  });

  test('a Chat stream\'s early usage chunk, followed by output, is not final: charged the larger of it and the output relayed', async () => {
    const chunk = (data: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', ...data })}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let text = chunk({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 0 } });
      for (let i = 0; i < 40; i++) text += chunk({ choices: [{ index: 0, delta: { content: 'y'.repeat(1000) }, finish_reason: null }] });
      res.end(`${text}data: [DONE]\n\n`);
    });
    const res = await postJson(`${running().url}/v1/chat/completions`, 'sk-h', body(true));
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(running(), 'acct_h').at(-1)!;
    assert.deepEqual([charge.estimated, charge.outputTokens], [true, 10_000], 'the output relayed: 40,000 characters');
  });

  test('a usage chunk followed by a chunk without output (a finish) stays final: charged exactly (found in review)', async () => {
    const chunk = (data: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', ...data })}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(chunk({ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: null }] }) + chunk({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 1 } }) +
        chunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }) + 'data: [DONE]\n\n');
    });
    const res = await postJson(`${running().url}/v1/chat/completions`, 'sk-h', body(true));
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(running(), 'acct_h').at(-1)!;
    assert.deepEqual([charge.estimated, charge.inputTokens, charge.outputTokens], [false, 5, 1]);
  });

  test('an event arriving two characters at a time is held in few pieces', () => {
    const splitter = new SseSplitter(8 * 1024 * 1024);
    const piece = Buffer.from('xx');
    assert.deepEqual(splitter.push(Buffer.from('data: ')), []);
    for (let i = 0; i < 100_000; i++) splitter.push(piece);
    const held = (splitter as unknown as { held: string[] }).held;
    assert.ok(held.length < 100_000 / 32, `${held.length} pieces`);
    const [event] = splitter.push(Buffer.from('\n\n'));
    assert.equal(event, `data: ${'x'.repeat(200_000)}\n\n`);
  });
});
