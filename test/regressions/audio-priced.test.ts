import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { FakeUpstream, json, openaiCompletion, openaiStream } from '../helpers/fake-upstream.js';
import { entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: OpenAI bills audio tokens at many times the text prices (gpt-4o audio: $40
 * and $80 per million against $2.50 and $10), inside the same token counts; the gateway charged
 * them at the text prices. A model now has `audioInputPerMillion` and `audioOutputPerMillion`;
 * the audio part of a usage is charged at them, and a request for audio that a model has no
 * audio price for is refused before admission.
 */
describe('regression: audio tokens at their own prices, or refused', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 1_000_000 },
      plans: { p: { rpm: 1000, concurrency: 5 } },
      accounts: { acct_a: { plan: 'p' }, acct_pre: { plan: 'p', balanceUsd: 1 } },
      keys: { key_a: { account: 'acct_a', key: 'sk-a' }, key_pre: { account: 'acct_pre', key: 'sk-pre' } },
      models: {
        text: { provider: 'oai', price: { inputPerMillion: 2.5, outputPerMillion: 10 } },
        voice: { provider: 'oai', price: { inputPerMillion: 2.5, outputPerMillion: 10, audioInputPerMillion: 40, audioOutputPerMillion: 80 } },
      },
      providers: { oai: { protocol: 'openai', baseUrl: base } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  const audioPart = { type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } };
  const refusals: Array<[string, Record<string, unknown>, string]> = [
    ['an input_audio part', { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }, audioPart] }] }, 'messages[0].content[1]'],
    ['an earlier answer\'s audio', { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', audio: { id: 'audio_1' } }, { role: 'user', content: 'again' }] }, 'messages[1].audio'],
    ['an audio answer', { messages: [{ role: 'user', content: 'hi' }], modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }, 'modalities'],
  ];
  for (const [what, body, param] of refusals) {
    test(`${what}, to a model without audio prices: 400 naming ${param}, never sent`, async () => {
      const hits = up.hits;
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'text', ...body });
      assert.equal(res.status, 400);
      const err = (await res.json()) as { error: { param: string; message: string } };
      assert.equal(err.error.param, param);
      assert.match(err.error.message, /audio/);
      assert.equal(up.hits, hits);
    });
  }

  // 1,000 input of which 600 audio, 100 output of which 50 audio.
  const usage = {
    prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100,
    prompt_tokens_details: { cached_tokens: 0, audio_tokens: 600 }, completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 50 },
  };
  const cost = 400 * 2.5 + 600 * 40 + 50 * 10 + 50 * 80;

  test('a whole answer: the audio tokens at the audio prices', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('ok', usage as never)));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'voice', ...refusals[0]![1], modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } });
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_a').at(-1)!;
    assert.deepEqual([charge.amountMicro, charge.estimated], [-cost, false]);
  });

  test('a stream: the same from its usage chunk', async () => {
    up.queue.push(openaiStream(['o', 'k'], usage));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'voice', stream: true, ...refusals[0]![1] });
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(entriesOf(gw, 'acct_a').at(-1)!.amountMicro, -cost);
  });

  test('a stream for audio cut before its usage: charged as audio, its transcript standing for the audio relayed (found in review: at the text prices, and no output)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
      res.write(chunk({ role: 'assistant', audio: { id: 'audio_1', data: 'AAAA', transcript: 'Hello the' } }) + chunk({ audio: { data: 'AAAA', transcript: 're, friend' } }));
      setTimeout(() => res.socket?.destroy(), 30);
    });
    const body = { model: 'voice', stream: true, messages: [{ role: 'user', content: 'x'.repeat(400) }], modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'pcm16' } };
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', body);
    await assert.rejects(res.text());
    const charge = entriesOf(gw, 'acct_a').at(-1)!;
    const input = estimateInputTokens(body)!;
    const output = Math.ceil((19 * 12) / 4); // 19 characters of transcript
    assert.deepEqual([charge.estimated, charge.inputTokens, charge.outputTokens], [true, input, output]);
    assert.equal(charge.amountMicro, -Math.ceil(input * 2.5 + output * 80), 'input at the text price (no audio in), output at the audio one');
  });

  test('a long text conversation with one audio part, cut before its usage: only that part\'s figure at the audio price (found in review: all the input was)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: 'ok' }, finish_reason: null }] })}\n\n`);
      setTimeout(() => res.socket?.destroy(), 30);
    });
    const body = { model: 'voice', stream: true, messages: [{ role: 'user', content: [{ type: 'text', text: 'x'.repeat(40_000) }, audioPart] }] };
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', body);
    await assert.rejects(res.text());
    const charge = entriesOf(gw, 'acct_a').at(-1)!;
    const input = estimateInputTokens(body)!;
    assert.ok(input > 10_000);
    assert.equal(charge.amountMicro, -Math.ceil((input - 3000) * 2.5 + 3000 * 40 + 1 * 10), 'the audio part\'s 3,000 at $40, the rest at $2.50, one output token at $10');
  });

  test('a whole answer without usage: its transcript stands for its audio, at the audio price (found in review: about nothing)', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'c', object: 'chat.completion', created: 1, model: 'up',
      choices: [{ index: 0, message: { role: 'assistant', content: null, audio: { id: 'audio_1', data: 'AAAA', expires_at: 1, transcript: 'Hello there, friend' } }, finish_reason: 'stop' }],
    }));
    const body = { model: 'voice', messages: [{ role: 'user', content: 'hi' }], modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } };
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', body);
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_a').at(-1)!;
    const output = Math.ceil((19 * 12) / 4);
    assert.deepEqual([charge.estimated, charge.outputTokens], [true, output]);
    assert.equal(charge.amountMicro, -Math.ceil(estimateInputTokens(body)! * 2.5 + output * 80));
  });

  test('an audio answer reserves its output at the audio price: 20,000 tokens ($1.60) leave a prepaid $1 nothing while it runs, as text ($0.20) they do', async () => {
    const body = { model: 'voice', messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 20_000 };
    const held = async (extra: Record<string, unknown>) => {
      let answer: (() => void) | null = null;
      up.queue.push((_req, res) => { answer = () => json(res, 200, openaiCompletion('ok', { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 })); });
      const call = postJson(`${gw.url}/v1/chat/completions`, 'sk-pre', { ...body, ...extra });
      await until(() => answer !== null, 5000, 'the held call upstream');
      up.queue.push((_req, res) => json(res, 200, openaiCompletion('ok', { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 })));
      const next = await postJson(`${gw.url}/v1/chat/completions`, 'sk-pre', { ...body, max_completion_tokens: 10 });
      await next.text();
      if (next.status !== 200) up.queue.pop();
      answer!();
      assert.equal((await call).status, 200);
      return next.status;
    };
    assert.equal(await held({}), 200, 'as text');
    assert.equal(await held({ modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }), 402, 'as audio');
  });
});
