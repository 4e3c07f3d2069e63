import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { FakeUpstream, json } from '../helpers/fake-upstream.js';
import { entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: OpenAI bills each call of the Responses API's hosted web search tool ($10 a
 * thousand), and file search, code interpreter and image generation at prices of their own;
 * the gateway charged tokens only. A response's `web_search_call` items are now charged at the
 * model's `webSearchPerThousand` (reserved up to `max_tool_calls`), and the tools it cannot
 * price are refused before admission. Then the same of Chat Completions' search models (a search
 * a call, unsaid in their usage) and of Anthropic's code execution tool (by the container-hour).
 */
describe('regression: OpenAI hosted tools are charged or refused', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 5 } },
      accounts: { acct_o: { plan: 'p' }, acct_pre: { plan: 'p', balanceUsd: 5 }, acct_cent: { plan: 'p', balanceUsd: 0.005 }, acct_few: { plan: 'p', balanceUsd: 0.03 } },
      keys: { key_o: { account: 'acct_o', key: 'sk-o' }, key_pre: { account: 'acct_pre', key: 'sk-pre' }, key_cent: { account: 'acct_cent', key: 'sk-cent' }, key_few: { account: 'acct_few', key: 'sk-few' } },
      models: {
        gpt: { provider: 'oai', price: { inputPerMillion: 2, outputPerMillion: 8 } },
        claude: { provider: 'ant', price: { inputPerMillion: 3, outputPerMillion: 15 } },
        search: { provider: 'oai', upstreamModel: 'gpt-4o-search-preview', price: { inputPerMillion: 2, outputPerMillion: 8, webSearchPerThousand: 25, webSearchesPerCall: 1 } },
        local: { provider: 'mocked', price: { inputPerMillion: 2, outputPerMillion: 8 } },
        routed: {
          deployments: [{ provider: 'oai', upstreamModel: 'gpt-4o-search-preview' }, { provider: 'ant', upstreamModel: 'claude', fallback: true }],
          price: { inputPerMillion: 2, outputPerMillion: 8, webSearchPerThousand: 25, webSearchesPerCall: 1 },
        },
      },
      providers: { oai: { protocol: 'openai', baseUrl: base }, ant: { protocol: 'anthropic', baseUrl: base }, mocked: { protocol: 'mock' } },
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

  /**
   * While `searching` (a call the provider holds until told) runs, `other` on the same key is
   * refused 402: the first reserved what it may cost. Then the held call is answered.
   */
  async function reservedWhileRunning(path: string, key: string, searching: unknown, other: unknown, answer: (res: ServerResponse) => void): Promise<void> {
    let release: (() => void) | null = null;
    up.queue.push((_req, res) => {
      release = () => answer(res);
    });
    const running = postJson(`${gw.url}${path}`, key, searching);
    await until(() => release !== null, 5000, 'the searching call upstream');
    const refused = await postJson(`${gw.url}${path}`, key, other);
    assert.equal(refused.status, 402);
    await refused.text();
    release!();
    const done = await running;
    assert.equal(done.status, 200);
    await done.text();
  }

  test('a web search bounded by max_tool_calls reserves its searches: 500 of them ($5) leave a prepaid $5 account nothing while it runs', async () => {
    await reservedWhileRunning('/v1/responses', 'sk-pre', body(false, { max_tool_calls: 500 }), body(false, { tools: [] }), (res) => json(res, 200, response([message])));
    up.queue.push((_req, res) => json(res, 200, response([message])));
    const next = await postJson(`${gw.url}/v1/responses`, 'sk-pre', body(false, { tools: [] }));
    assert.equal(next.status, 200, 'admitted again once the reservation is settled');
    await next.text();
  });

  test('a web search nothing bounds (no max_tool_calls) reserves 5 searches: while one runs, a prepaid account with 3 cents has nothing left (it reserved none before)', async () => {
    await reservedWhileRunning('/v1/responses', 'sk-few', body(false, { max_output_tokens: 10 }), body(false, { tools: [], max_output_tokens: 10 }),
      (res) => json(res, 200, response([message])));
  });

  // Chat Completions' search models bill a search a call (their usage does not say): a
  // `web_search_options` call is charged one, reserved with it (not metered before).
  const chatBody = (stream: boolean, extra: Record<string, unknown> = {}) => ({
    model: 'gpt', stream, messages: [{ role: 'user', content: 'hi' }], web_search_options: {}, ...extra,
  });
  const chatUsage = { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 };

  test('a chat call with web_search_options is charged its search, whole', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'c1', object: 'chat.completion', model: 'gpt', usage: chatUsage,
      choices: [{ index: 0, message: { role: 'assistant', content: 'ok', annotations: [] }, finish_reason: 'stop' }],
    }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', chatBody(false));
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.deepEqual([charge.amountMicro, charge.estimated], [-(tokens + 10_000), false]);
  });

  test('and streamed', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (data: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c2', object: 'chat.completion.chunk', model: 'gpt', ...data })}\n\n`;
      res.end(chunk({ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: null }] }) +
        chunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }) + chunk({ choices: [], usage: chatUsage }) + 'data: [DONE]\n\n');
    });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', chatBody(true));
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.deepEqual([charge.amountMicro, charge.estimated], [-(tokens + 10_000), false]);
  });

  test('a stream cut before its usage: the estimate and the search', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ id: 'c3', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'x' }, finish_reason: null }] })}\n\n`);
      setTimeout(() => res.socket?.destroy(), 30);
    });
    const cut = chatBody(true, { messages: [{ role: 'user', content: 'x'.repeat(4000) }] });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', cut);
    await assert.rejects(res.text());
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    const estimate = estimateInputTokens(cut)!;
    assert.deepEqual([charge.estimated, charge.inputTokens], [true, estimate]);
    assert.equal(charge.amountMicro, -(Math.ceil(estimate * 2) + 8 + 10_000));
  });

  test('a search model (webSearchesPerCall) is charged its search without web_search_options too (found in review: it searches on every call)', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'c5', object: 'chat.completion', model: 'gpt-4o-search-preview', usage: chatUsage,
      choices: [{ index: 0, message: { role: 'assistant', content: 'ok', annotations: [] }, finish_reason: 'stop' }],
    }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', { model: 'search', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.deepEqual([charge.amountMicro, charge.estimated], [-(tokens + 25_000), false]);
  });

  test('a search model\'s Anthropic fallback, which runs no search, is charged none (found in review)', async () => {
    up.queue.push((_req, res) => json(res, 503, { error: { message: 'overloaded', type: 'server_error' } }));
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_f', type: 'message', role: 'assistant', model: 'claude', content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn',
      usage: { input_tokens: 100, output_tokens: 10 },
    }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', { model: 'routed', max_tokens: 20, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.deepEqual([charge.deployment, charge.amountMicro], ['ant', -tokens]);
  });

  test('web_search_options to a server that is not OpenAI (here the mock, which ignores it) is charged no search (found in review)', async () => {
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', { ...chatBody(false), model: 'local' });
    assert.equal(res.status, 200);
    await res.text();
    const charge = entriesOf(gw, 'acct_o').at(-1)!;
    assert.equal(charge.model, 'local');
    assert.ok(charge.amountMicro > -1_000, `tokens only: ${charge.amountMicro}`);
  });

  test('a refused chat call is free, search and all', async () => {
    up.queue.push((_req, res) => json(res, 400, { error: { message: 'web_search_options is not supported by this model', type: 'invalid_request_error' } }));
    const before = entriesOf(gw, 'acct_o').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-o', chatBody(false));
    assert.equal(res.status, 400);
    await res.text();
    assert.equal(entriesOf(gw, 'acct_o').length, before, 'nothing recorded');
  });

  test('the search is reserved: while one runs, a prepaid account with half a cent has nothing left for another call', async () => {
    await reservedWhileRunning('/v1/chat/completions', 'sk-cent', chatBody(false, { max_completion_tokens: 10 }),
      chatBody(false, { max_completion_tokens: 10, web_search_options: undefined }), (res) => json(res, 200, {
        id: 'c4', object: 'chat.completion', model: 'gpt', usage: chatUsage, choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
      }));
  });

  // Anthropic bills code execution by the container-hour, which no model price covers.
  test('Anthropic\'s code execution tool is refused before admission; web search and web fetch go through', async () => {
    const hits = up.hits;
    const messagesBody = (tools: unknown[]) => ({ model: 'claude', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }], tools });
    for (const type of ['code_execution_20250522', 'code_execution_20250825']) {
      const res = await postJson(`${gw.url}/v1/messages`, 'sk-o', messagesBody([{ type: 'web_search_20250305', name: 'web_search', max_uses: 1 }, { type, name: 'code_execution' }]));
      assert.equal(res.status, 400);
      const err = (await res.json()) as { error: { message: string } };
      assert.match(err.error.message, new RegExp(`tools\\[1\\].*${type}`));
    }
    assert.equal(up.hits, hits, 'never sent');
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_1', type: 'message', role: 'assistant', model: 'claude', content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn',
      usage: { input_tokens: 100, output_tokens: 10, server_tool_use: { web_search_requests: 1, web_fetch_requests: 1 } },
    }));
    const ok = await postJson(`${gw.url}/v1/messages`, 'sk-o', messagesBody([
      { type: 'web_search_20250305', name: 'web_search', max_uses: 1 }, { type: 'web_fetch_20250910', name: 'web_fetch', max_uses: 1 },
    ]));
    assert.equal(ok.status, 200);
    await ok.text();
    assert.equal(entriesOf(gw, 'acct_o').at(-1)!.amountMicro, -(300 + 150 + 10_000), 'tokens and the search');
  });
});
