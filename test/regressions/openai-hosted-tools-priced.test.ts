import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { FakeUpstream, json } from '../helpers/fake-upstream.js';
import { entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: OpenAI bills each call of the Responses API's hosted web search tool ($10 a
 * thousand), and file search, code interpreter and image generation at prices of their own;
 * the gateway charged tokens only. A response's `web_search_call` items are now charged at the
 * model's `webSearchPerThousand` (reserved up to `max_tool_calls`), and the tools it cannot
 * price are refused before admission.
 */
describe('regression: OpenAI hosted tools are charged or refused', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 5 } },
      accounts: { acct_o: { plan: 'p' }, acct_pre: { plan: 'p', balanceUsd: 5 } },
      keys: { key_o: { account: 'acct_o', key: 'sk-o' }, key_pre: { account: 'acct_pre', key: 'sk-pre' } },
      models: { gpt: { provider: 'oai', price: { inputPerMillion: 2, outputPerMillion: 8 } } },
      providers: { oai: { protocol: 'openai', baseUrl: base } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  const searchItem = (i: number) => ({ id: `ws_${i}`, type: 'web_search_call', status: 'completed', action: { type: 'search', query: 'q' } });
  const message = { id: 'msg_1', type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'ok', annotations: [] }] };
  const usage = { input_tokens: 100, input_tokens_details: { cached_tokens: 0 }, output_tokens: 10, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 110 };
  const response = (output: unknown[]) => ({ id: 'resp_1', object: 'response', status: 'completed', model: 'gpt', output, usage });
  const body = (stream: boolean, extra: Record<string, unknown> = {}) => ({ model: 'gpt', stream, input: 'hi', tools: [{ type: 'web_search' }], ...extra });
  // 100 input at $2, 10 output at $8 per million: 280 micro-dollars; a search $0.01.
  const tokens = 200 + 80;

  test('a whole answer with two searches is charged them', async () => {
    up.queue.push((_req, res) => json(res, 200, response([searchItem(0), searchItem(1), message])));
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-o', body(false));
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.deepEqual([charge.amountMicro, charge.estimated], [-(tokens + 20_000), false]);
  });

  const sse = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

  test('a stream: the searches of response.completed', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(sse('response.created', { response: { ...response([]), status: 'in_progress', usage: null } }) +
        sse('response.output_item.added', { output_index: 0, item: { ...searchItem(0), status: 'in_progress' } }) +
        sse('response.output_item.done', { output_index: 0, item: searchItem(0) }) +
        sse('response.output_text.delta', { output_index: 1, content_index: 0, delta: 'ok' }) +
        sse('response.completed', { response: response([searchItem(0), message]) }));
    });
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-o', body(true));
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.deepEqual([charge.amountMicro, charge.estimated], [-(tokens + 10_000), false]);
  });

  test('a stream cut after two searches started: charged them, on top of the input estimate', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(sse('response.created', { response: { ...response([]), status: 'in_progress', usage: null } }) +
        sse('response.output_item.added', { output_index: 0, item: { ...searchItem(0), status: 'in_progress' } }) +
        sse('response.output_item.added', { output_index: 1, item: { ...searchItem(1), status: 'in_progress' } }));
      setTimeout(() => res.socket?.destroy(), 30);
    });
    const long = body(true, { input: 'x'.repeat(4000) });
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-o', long);
    await assert.rejects(res.text());
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    const estimate = estimateInputTokens(long)!;
    assert.deepEqual([charge.estimated, charge.inputTokens, charge.outputTokens], [true, estimate, 0]);
    assert.equal(charge.amountMicro, -(Math.ceil(estimate * 2) + 20_000));
  });

  test('searches started count even when their events come without a name, and when the final response leaves them out (found in review)', async () => {
    const unnamed = (data: Record<string, unknown>) => `data: ${JSON.stringify(data)}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(unnamed({ type: 'response.output_item.added', output_index: 0, item: { ...searchItem(0), status: 'in_progress' } }) +
        unnamed({ type: 'response.output_item.added', output_index: 1, item: { ...searchItem(1), status: 'in_progress' } }) +
        sse('response.completed', { response: response([message]) }));
    });
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-o', body(true));
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(entriesOf(gw, 'acct_o').at(-1)!.amountMicro, -(tokens + 20_000));
  });

  for (const type of ['file_search', 'code_interpreter', 'image_generation']) {
    test(`the ${type} tool is refused before admission`, async () => {
      const hits = up.hits;
      const res = await postJson(`${gw.url}/v1/responses`, 'sk-o', body(false, { tools: [{ type: 'function', name: 'f', parameters: {} }, { type }] }));
      assert.equal(res.status, 400);
      const err = (await res.json()) as { error: { param: string; message: string } };
      assert.equal(err.error.param, 'tools[1]');
      assert.match(err.error.message, new RegExp(type));
      assert.equal(up.hits, hits, 'never sent');
    });
  }

  test('a web search bounded by max_tool_calls reserves its searches: 500 of them ($5) leave a prepaid $5 account nothing while it runs', async () => {
    let answer: (() => void) | null = null;
    up.queue.push((_req, res) => {
      answer = () => json(res, 200, response([message]));
    });
    const searching = postJson(`${gw.url}/v1/responses`, 'sk-pre', body(false, { max_tool_calls: 500 }));
    await until(() => answer !== null, 5000, 'the searching call upstream');
    const refused = await postJson(`${gw.url}/v1/responses`, 'sk-pre', body(false, { tools: [] }));
    assert.equal(refused.status, 402);
    await refused.text();
    answer!();
    assert.equal((await searching).status, 200);
    up.queue.push((_req, res) => json(res, 200, response([message])));
    const next = await postJson(`${gw.url}/v1/responses`, 'sk-pre', body(false, { tools: [] }));
    assert.equal(next.status, 200, 'admitted again once the reservation is settled');
    await next.text();
  });
});
