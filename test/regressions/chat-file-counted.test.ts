import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { after, before, beforeEach, describe, test } from 'node:test';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { FakeUpstream, json, openaiCompletion, openaiStream, type Behaviour } from '../helpers/fake-upstream.js';
import { chargeOf, entriesOf, leaveWhenSeen, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a Chat Completions call holding a file (a PDF inline or by id) is billed by
 * OpenAI for every page, while the gateway's estimate counts a file as one fixed figure (3,000
 * tokens). A client that sent a 100-page PDF and left before the final usage was charged that
 * figure; so was Claude Code's PDF on an OpenAI-protocol model (a Messages document becomes a
 * chat file part). Such a call is now counted first, as a Responses call with a file is: its
 * input converted to the Responses form that OpenAI's input count takes.
 */

const PRICE = { inputPerMillion: 2, outputPerMillion: 8 };
const PAGES = 250_000;
const PDF = 'data:application/pdf;base64,JVBERi0xLjQK';

/** A chat stream's first words, then nothing: the provider is still generating. */
const startedStream = (open: ServerResponse[]): Behaviour => (_req, res) => {
  open.push(res);
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'Hello' }, finish_reason: null }] })}\n\n`);
};

const counted = (n: number): Behaviour => (_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: n });

describe('regression: a chat call holding a file is counted before the call', () => {
  const up = new FakeUpstream();
  let gw: Running;
  const open: ServerResponse[] = [];

  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 1_000_000 },
      plans: { p: { rpm: 10_000, concurrency: 5, dailyCapUsd: 100 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
      models: { 'gpt-x': { provider: 'oai', upstreamModel: 'gpt-upstream', price: PRICE } },
      providers: { oai: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 1000, streamIdleTimeoutMs: 5000 } },
    }));
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
  const charged = (send: () => Promise<unknown>): Promise<LedgerEntry> => chargeOf(gw, 'acct_a', send);

  test('a chat client that leaves a call holding a PDF is charged the provider\'s count of it', async () => {
    up.queue.push(counted(PAGES), startedStream(open));
    const messages = [
      { role: 'system', content: 'Summarise.' },
      { role: 'user', content: [{ type: 'file', file: { filename: 'big.pdf', file_data: PDF } }, { type: 'text', text: 'go' }] },
    ];
    const charge = await charged(() => leaveWhenSeen(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-x', messages, stream: true, max_tokens: 100 }, 'Hello'));
    assert.equal(charge.estimated, true);
    assert.equal(charge.inputTokens, PAGES, 'the pages the provider counted, not one fixed figure');
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/chat/completions']);
    // Counted in the form the count endpoint takes, with the upstream model.
    assert.deepEqual(up.seen[0]!.body, {
      model: 'gpt-upstream',
      input: [
        { role: 'system', content: 'Summarise.' },
        { role: 'user', content: [{ type: 'input_file', filename: 'big.pdf', file_data: PDF }, { type: 'input_text', text: 'go' }] },
      ],
    });
  });

  test('an Anthropic client\'s PDF on an OpenAI-protocol model (Claude Code\'s) is counted too', async () => {
    up.queue.push(counted(PAGES), startedStream(open));
    const body = {
      model: 'gpt-x', max_tokens: 100, stream: true,
      messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVBERi0xLjQK' } }, { type: 'text', text: 'go' }] }],
    };
    const charge = await charged(() => leaveWhenSeen(`${gw.url}/v1/messages`, 'sk-a', body, 'Hello'));
    assert.equal(charge.inputTokens, PAGES);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/chat/completions']);
    assert.deepEqual((up.seen[0]!.body.input as unknown[])[0], { role: 'user', content: [{ type: 'input_file', filename: 'document.pdf', file_data: PDF }, { type: 'input_text', text: 'go' }] });
  });

  test('a chat call without a file is not counted first', async () => {
    up.queue.push(openaiStream(['Hi'], { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', {
      model: 'gpt-x', stream: true, messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }, { type: 'image_url', image_url: { url: 'https://x/i.png' } }] }],
    });
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/chat/completions']);
  });

  test('a count that refuses the converted input, its files alone too (a chat-only model), lets the call go on, estimated as before', async () => {
    const refused: Behaviour = (_req, res) => json(res, 400, { error: { message: 'This model is not supported in the Responses API.', type: 'invalid_request_error' } });
    up.queue.push(
      refused, refused,
      (_req, res) => json(res, 200, openaiCompletion('Hi', { prompt_tokens: 3100, completion_tokens: 1, total_tokens: 3101 })),
    );
    const charge = await charged(async () => {
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-x', messages: [{ role: 'user', content: [{ type: 'file', file: { file_id: 'file-1' } }] }] });
      assert.equal(res.status, 200);
      await res.text();
    });
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses/input_tokens', '/v1/chat/completions']);
    assert.equal(charge.inputTokens, 3100);
  });

  test('a count that refuses the whole converted input counts the files alone (found in review: a grammar tool the count refused let a PDF go uncounted)', async () => {
    up.queue.push(
      (_req, res) => json(res, 400, { error: { message: 'Unknown parameter: tools[0].odd.', type: 'invalid_request_error' } }),
      counted(PAGES), startedStream(open),
    );
    const body = {
      model: 'gpt-x', stream: true, max_tokens: 100,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'go' }, { type: 'file', file: { file_data: PDF, filename: 'big.pdf' } }] }],
      tools: [{ type: 'custom', custom: { name: 'sh', odd: true } }],
    };
    const charge = await charged(() => leaveWhenSeen(`${gw.url}/v1/chat/completions`, 'sk-a', body, 'Hello'));
    assert.ok(charge.inputTokens > PAGES && charge.inputTokens < PAGES + 100, `the pages and the few words: ${charge.inputTokens}`);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/responses/input_tokens', '/v1/chat/completions']);
    assert.deepEqual(up.seen[1]!.body, { model: 'gpt-upstream', input: [{ role: 'user', content: [{ type: 'input_file', file_data: PDF, filename: 'big.pdf' }] }] });
  });

  test('files counted alone stand in the estimate for their fixed figures, the text kept (found in review: the count alone dropped 100,000 tokens of text)', async () => {
    const refused: Behaviour = (_req, res) => json(res, 400, { error: { message: 'Unsupported.', type: 'invalid_request_error' } });
    up.queue.push(refused, counted(PAGES), startedStream(open));
    const text = 'x'.repeat(400_000); // 100,000 tokens by the estimate
    const body = { model: 'gpt-x', stream: true, max_tokens: 100, messages: [{ role: 'user', content: [{ type: 'text', text }, { type: 'file', file: { file_data: PDF } }] }] };
    const charge = await charged(() => leaveWhenSeen(`${gw.url}/v1/chat/completions`, 'sk-a', body, 'Hello'));
    assert.ok(charge.inputTokens >= PAGES + 100_000 && charge.inputTokens < PAGES + 100_100, String(charge.inputTokens));
  });

  test('a count path a server in front refuses (401, 403: it guards that path alone) lets the call go on (found in review)', async () => {
    for (const code of [401, 403]) {
      up.seen.length = 0;
      up.queue.push(
        (_req, res) => json(res, code, { message: 'Missing Authentication Token' }),
        (_req, res) => json(res, 200, openaiCompletion('Hi', { prompt_tokens: 3100, completion_tokens: 1, total_tokens: 3101 })),
      );
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-x', messages: [{ role: 'user', content: [{ type: 'file', file: { file_id: 'file-1' } }] }] });
      assert.equal(res.status, 200, String(code));
      await res.text();
      assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens', '/v1/chat/completions']);
    }
  });

  test('a count the provider rate-limits fails the call as its 429 would, free and not sent', async () => {
    up.queue.push((_req, res) => json(res, 429, { error: { message: 'Rate limit reached' } }, { 'retry-after': '3' }));
    const before = entriesOf(gw, 'acct_a').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-x', messages: [{ role: 'user', content: [{ type: 'file', file: { file_id: 'file-1' } }] }] });
    assert.equal(res.status, 429);
    await res.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/responses/input_tokens']);
    await until(() => gw.gateway.inFlight === 0, 5000, 'the slot back');
    assert.equal(entriesOf(gw, 'acct_a').length, before, 'nothing charged');
  });
});
