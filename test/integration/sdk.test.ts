import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { accessLog, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

describe('the official SDKs as clients', () => {
  let gw: Running;
  let openai: OpenAI;
  let anthropic: Anthropic;
  before(async () => {
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 1 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-sdk' } },
    }));
    openai = new OpenAI({ apiKey: 'sk-sdk', baseURL: `${gw.url}/v1`, maxRetries: 2 });
    anthropic = new Anthropic({ apiKey: 'sk-sdk', baseURL: gw.url, maxRetries: 2 });
  });
  after(() => gw.close());

  test('openai: list models, chat, the request id visible to the SDK', async () => {
    const ids: string[] = [];
    for await (const model of openai.models.list()) ids.push(model.id);
    assert.deepEqual(ids, ['echo-1', 'paid-1', 'slow-1']);
    const completion = await openai.chat.completions.create({ model: 'echo-1', messages: [{ role: 'user', content: 'ping' }] });
    assert.equal(completion.choices[0]!.message.content, 'ping');
    assert.equal(completion.usage!.prompt_tokens, 1);
    assert.match(completion._request_id ?? '', /^req_/);
    const model = await openai.models.retrieve('echo-1');
    assert.equal(model.id, 'echo-1');
  });

  test('openai: streaming chat with usage', async () => {
    const stream = await openai.chat.completions.create({
      model: 'echo-1', messages: [{ role: 'user', content: 'stream me please' }], stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | null | undefined = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, 'stream me please');
    assert.equal(usage?.completion_tokens, 4);
  });

  test('anthropic: messages, plain and streamed, with the request id', async () => {
    const message = await anthropic.messages.create({ model: 'echo-1', max_tokens: 100, messages: [{ role: 'user', content: 'hola' }] });
    assert.deepEqual(message.content, [{ type: 'text', text: 'hola' }]);
    assert.match(message._request_id ?? '', /^req_/);
    const stream = anthropic.messages.stream({ model: 'echo-1', max_tokens: 100, messages: [{ role: 'user', content: 'streamed words' }] });
    const final = await stream.finalMessage();
    assert.deepEqual(final.content, [{ type: 'text', text: 'streamed words' }]);
    assert.equal(final.usage.output_tokens, 4);
  });

  test('a 409 idempotency conflict is not retried by the SDK', async () => {
    const slow = openai.chat.completions.create({ model: 'slow-1', messages: [{ role: 'user', content: 'a' }] },
      { headers: { 'Idempotency-Key': 'sdk-dup' } });
    await until(() => gw.gateway.inFlight === 1, 5000, 'the original in flight');
    const before = accessLog(gw).length;
    await assert.rejects(
      openai.chat.completions.create({ model: 'slow-1', messages: [{ role: 'user', content: 'a' }] }, { headers: { 'Idempotency-Key': 'sdk-dup' } }),
      (err: InstanceType<typeof OpenAI.APIError>) => err.status === 409 && (err.error as { code?: string }).code === 'idempotency_conflict',
    );
    await slow;
    const lines = accessLog(gw).slice(before).filter((l) => l.status === 409);
    assert.equal(lines.length, 1, 'the SDK sent the duplicate once');
  });

  test('a 429 is retried by the SDK after Retry-After and then succeeds', async () => {
    // Concurrency is 1: a slow call holds the slot for 300 ms; the SDK's call gets 429 with Retry-After 1.
    const holder = fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'x-api-key': 'sk-sdk', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'slow-1', messages: [{ role: 'user', content: 'hold' }] }),
    });
    await until(() => gw.gateway.inFlight === 1, 5000, 'the slot held');
    const before = accessLog(gw).length;
    const started = Date.now();
    const completion = await anthropic.messages.create({ model: 'echo-1', max_tokens: 10, messages: [{ role: 'user', content: 'eventually' }] });
    assert.equal((completion.content[0] as { text: string }).text, 'eventually');
    assert.ok(Date.now() - started >= 900, 'the SDK waited for Retry-After');
    const statuses = accessLog(gw).slice(before).filter((l) => l.path === '/v1/messages').map((l) => l.status);
    assert.deepEqual(statuses, [429, 200]);
    await (await holder).text();
  });
});
