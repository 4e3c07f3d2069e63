import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';

function sseData(text: string): string[] {
  return text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
}

describe('mock provider, streaming and metering', () => {
  let gw: Running;
  before(async () => {
    gw = await startGateway(testConfig({
      plans: { one: { rpm: 1000, concurrency: 1 } },
      accounts: { acct_bob: { plan: 'one', balanceUsd: 1 } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
      providers: { mock: { protocol: 'mock' }, slow: { protocol: 'mock', tokensPerSecond: 20 } },
      models: {
        'echo-1': { provider: 'mock' },
        'paid-1': { provider: 'mock', price: { inputPerMillion: 1, outputPerMillion: 2 } },
        'paid-slow': { provider: 'slow', price: { inputPerMillion: 1, outputPerMillion: 2 } },
      },
    }));
  });
  after(() => gw.close());

  test('chat non-streaming: echo, usage, 1 token per 4 characters, max_tokens truncates', async () => {
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', {
      model: 'echo-1', messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: [{ type: 'text', text: 'hello world' }] }],
    });
    const body = (await res.json()) as { choices: Array<{ message: { content: string }; finish_reason: string }>; usage: Record<string, number> };
    assert.equal(body.choices[0]!.message.content, 'hello world');
    assert.equal(body.choices[0]!.finish_reason, 'stop');
    assert.deepEqual(body.usage, { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 });
    const cut = (await (await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('echo-1', 'abcdefghij', { max_tokens: 1 }))).json()) as typeof body;
    assert.equal(cut.choices[0]!.message.content, 'abcd');
    assert.equal(cut.choices[0]!.finish_reason, 'length');
  });

  test('chat streaming: chunks per token, usage chunk only when asked for, [DONE] last', async () => {
    const plain = await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('echo-1', 'abcdefgh', { stream: true }));
    assert.equal(plain.headers.get('content-type'), 'text/event-stream');
    const events = sseData(await plain.text());
    assert.equal(events.at(-1), '[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as { choices: Array<{ delta: { content?: string }; finish_reason: string | null }>; usage?: unknown });
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? '').join(''), 'abcdefgh');
    assert.equal(chunks.filter((c) => c.choices[0]?.delta.content).length, 2);
    assert.equal(chunks.at(-1)!.choices[0]!.finish_reason, 'stop');
    assert.ok(chunks.every((c) => !('usage' in c)));

    const withUsage = await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob',
      chatBody('echo-1', 'abcdefgh', { stream: true, stream_options: { include_usage: true } }));
    const last = JSON.parse(sseData(await withUsage.text()).at(-2)!) as { choices: unknown[]; usage: Record<string, number> };
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4 });
  });

  test('messages streaming: the Anthropic event sequence with usage', async () => {
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-bob', { model: 'echo-1', max_tokens: 100, stream: true, messages: [{ role: 'user', content: 'abcdefg' }] });
    const text = await res.text();
    const types = [...text.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
    assert.deepEqual(types, ['message_start', 'content_block_start', 'ping', 'content_block_delta', 'content_block_delta',
      'content_block_stop', 'message_delta', 'message_stop']);
    assert.match(text, /"usage":\{"output_tokens":2\}/);
    assert.match(text, /"input_tokens":2/);
  });

  test('embeddings: one deterministic vector per input', async () => {
    const res = await postJson(`${gw.url}/v1/embeddings`, 'sk-bob', { model: 'echo-1', input: ['a', 'b', 'a'] });
    const body = (await res.json()) as { data: Array<{ index: number; embedding: number[] }>; usage: Record<string, number> };
    assert.equal(body.data.length, 3);
    assert.deepEqual(body.data[0]!.embedding, body.data[2]!.embedding);
    assert.notDeepEqual(body.data[0]!.embedding, body.data[1]!.embedding);
    assert.equal(body.data[0]!.embedding.length, 8);
    assert.deepEqual(body.usage, { prompt_tokens: 1, total_tokens: 1 });
  });

  test('a billable call is charged from usage before its final bytes', async () => {
    const before = entriesOf(gw, 'acct_bob').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', 'x'.repeat(400), { stream: true }));
    await res.text();
    const entries = entriesOf(gw, 'acct_bob');
    assert.equal(entries.length, before + 1);
    const charge = entries.at(-1)!;
    assert.equal(charge.type, 'charge');
    assert.equal(charge.amountMicro, -(100 * 1 + 100 * 2) / 1);
    assert.equal(charge.inputTokens, 100);
    assert.equal(charge.outputTokens, 100);
    assert.equal(charge.estimated, false);
    assert.equal(charge.keyId, 'key_bob');
  });

  test('a client that goes away mid-stream releases its slot and is charged an estimate', async () => {
    const url = new URL(`${gw.url}/v1/chat/completions`);
    const before = entriesOf(gw, 'acct_bob').length;
    // 200 characters at 20 tokens/s: about 2.5 s of stream; leave after the first chunks.
    await new Promise<void>((resolve, reject) => {
      const req = request(url, { method: 'POST', headers: { authorization: 'Bearer sk-bob', 'content-type': 'application/json' } }, (res) => {
        let seen = 0;
        res.on('data', (chunk: Buffer) => {
          seen += (chunk.toString().match(/"content":"/g) ?? []).length;
          if (seen >= 3) {
            req.destroy();
            resolve();
          }
        });
      });
      req.on('error', () => {});
      req.on('close', () => resolve());
      req.end(JSON.stringify(chatBody('paid-slow', 'y'.repeat(200), { stream: true })));
      setTimeout(() => reject(new Error('stream did not start')), 5000).unref();
    });
    // Concurrency is 1: the next request is admitted only once the slot is back.
    let status = 0;
    for (let i = 0; i < 50 && status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 20));
      const res = await fetch(`${gw.url}/v1/models`, { headers: { authorization: 'Bearer sk-bob' } });
      status = res.status;
      await res.text();
    }
    assert.equal(status, 200);
    assert.equal(gw.gateway.inFlight, 0);
    const charge = entriesOf(gw, 'acct_bob').at(-1)!;
    assert.equal(entriesOf(gw, 'acct_bob').length, before + 1);
    assert.equal(charge.estimated, true);
    assert.equal(charge.inputTokens, estimateInputTokens(chatBody('paid-slow', 'y'.repeat(200), { stream: true })));
    assert.ok(charge.outputTokens >= 2 && charge.outputTokens < 50, `estimated output ${charge.outputTokens}`);
  });
});
