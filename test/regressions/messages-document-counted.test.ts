import assert from 'node:assert/strict';
import { request } from 'node:http';
import type { ServerResponse } from 'node:http';
import { after, before, beforeEach, describe, test } from 'node:test';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { anthropicMessage, FakeUpstream, json, type Behaviour } from '../helpers/fake-upstream.js';
import { chargeOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a Messages call holding a document (a PDF inline, by URL or by file id) is
 * billed by Anthropic for every page, while the gateway's estimate counts a document as one
 * fixed figure (3,000 tokens). A client that sent a 100-page PDF and left before the answer
 * (Anthropic reads the whole PDF before its first event) was charged that figure. Such a call is
 * now counted first by Anthropic's count_tokens, as an OpenAI call holding a file is by its
 * input count (chat-file-counted.test.ts).
 */

const PRICE = { inputPerMillion: 3, outputPerMillion: 15 };
const PAGES = 250_000;
const PDF_URL = { type: 'document', source: { type: 'url', url: 'https://example.com/100-pages.pdf' } };

const counted = (n: number): Behaviour => (_req, res) => json(res, 200, { input_tokens: n });

describe('regression: a Messages call holding a document is counted before the call', () => {
  const up = new FakeUpstream();
  let gw: Running;
  const open: ServerResponse[] = [];
  /** Holds the call: the provider is reading the PDF. */
  const reading: Behaviour = (_req, res) => { open.push(res); };

  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 10_000, concurrency: 5, dailyCapUsd: 100 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
      models: {
        claude: { provider: 'ant', upstreamModel: 'claude-upstream', price: PRICE },
      },
      providers: { ant: { protocol: 'anthropic', baseUrl: base, timeoutMs: 5000 } },
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

  /** Sends `body` to `path` and leaves once the call (not its count) reached the provider; resolves to the charge. */
  const leftEarly = (path: string, body: unknown, headers: Record<string, string> = {}): Promise<LedgerEntry> => chargeOf(gw, 'acct_a', async () => {
    const req = request(`${gw.url}${path}`, { method: 'POST', headers: { authorization: 'Bearer sk-a', 'content-type': 'application/json', ...headers } });
    req.on('error', () => {});
    req.end(JSON.stringify(body));
    await until(() => up.seen.some((s) => s.path === '/v1/messages'), 5000, 'the call upstream');
    req.destroy();
  });

  for (const stream of [false, true]) {
    test(`an Anthropic client that leaves a call holding a PDF (${stream ? 'streamed' : 'whole'}) is charged the provider's count of it`, async () => {
      up.queue.push(counted(PAGES), reading);
      const body = {
        model: 'claude', max_tokens: 100, stream, system: 'Summarise.',
        messages: [{ role: 'user', content: [PDF_URL, { type: 'text', text: 'go' }] }],
      };
      const charge = await leftEarly('/v1/messages', body, { 'anthropic-version': '2023-06-01', 'anthropic-beta': 'files-api-2025-04-14' });
      assert.equal(charge.estimated, true);
      assert.equal(charge.inputTokens, PAGES, 'the pages the provider counted, not one fixed figure');
      assert.deepEqual(up.seen.map((s) => s.path), ['/v1/messages/count_tokens', '/v1/messages']);
      // The count's fields of the call, with the upstream model and the call's own Anthropic headers.
      assert.deepEqual(up.seen[0]!.body, { model: 'claude-upstream', system: 'Summarise.', messages: body.messages });
      assert.equal(up.seen[0]!.headers['anthropic-version'], '2023-06-01');
      assert.equal(up.seen[0]!.headers['anthropic-beta'], 'files-api-2025-04-14');
    });
  }

  test('a document in a tool\'s result is counted too', async () => {
    up.queue.push(counted(PAGES), reading);
    const messages = [
      { role: 'user', content: 'read it' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'fetch', input: {} }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: [PDF_URL] }] },
    ];
    const charge = await leftEarly('/v1/messages', { model: 'claude', max_tokens: 100, messages, tools: [{ name: 'fetch', input_schema: { type: 'object' } }] });
    assert.equal(charge.inputTokens, PAGES);
  });

  test('a chat client\'s PDF on an Anthropic model is counted in its translation', async () => {
    up.queue.push(counted(PAGES), reading);
    const messages = [{ role: 'user', content: [{ type: 'file', file: { filename: 'big.pdf', file_data: 'data:application/pdf;base64,JVBERi0xLjQK' } }, { type: 'text', text: 'go' }] }];
    const charge = await leftEarly('/v1/chat/completions', { model: 'claude', max_tokens: 100, messages });
    assert.equal(charge.inputTokens, PAGES);
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/messages/count_tokens', '/v1/messages']);
    assert.equal(((up.seen[0]!.body.messages as Array<{ content: Array<{ type: string }> }>)[0]!.content[0]!.type), 'document');
  });

  test('a call without a document is not counted first; a server without the count lets one go on, estimated', async () => {
    up.queue.push((_req, res) => json(res, 200, anthropicMessage('Hi', { input_tokens: 7, output_tokens: 1 })));
    const plain = await postJson(`${gw.url}/v1/messages`, 'sk-a', { model: 'claude', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(plain.status, 200);
    await plain.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/messages']);
    up.seen.length = 0;
    up.queue.push((_req, res) => json(res, 404, { message: 'Not Found' }), (_req, res) => json(res, 200, anthropicMessage('Hi', { input_tokens: 4000, output_tokens: 1 })));
    const doc = await postJson(`${gw.url}/v1/messages`, 'sk-a', { model: 'claude', max_tokens: 10, messages: [{ role: 'user', content: [PDF_URL] }] });
    assert.equal(doc.status, 200, await doc.clone().text());
    await doc.text();
    assert.deepEqual(up.seen.map((s) => s.path), ['/v1/messages/count_tokens', '/v1/messages']);
  });
});
