import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { json } from '../helpers/fake-upstream.js';
import { behindFakeProvider } from '../helpers/behind-fake.js';
import { entriesOf, postJson } from '../helpers/gateway.js';

/**
 * Found in review of metering on the Responses and Messages relays under a broken or hostile
 * provider: Responses events skipped by their `event:` name carried text deltas the client
 * read (its SDK goes by the data's `type`), so they were relayed unmetered; a Messages stream's
 * early `message_delta` (1 output token) was final for all the text after it; and web searches
 * were lost when the usage could not be believed, or when a final count said fewer than ran.
 */
describe('regression: metering under a broken provider (Responses and Messages)', () => {
  const price = { inputPerMillion: 2, outputPerMillion: 8, webSearchPerThousand: 10 };
  const { up, gw } = behindFakeProvider((base) => ({
    plans: { p: { rpm: 1000, concurrency: 5 } },
    accounts: { acct_m: { plan: 'p' } },
    keys: { key_m: { account: 'acct_m', key: 'sk-m' } },
    models: { gpt: { provider: 'oai', price }, claude: { provider: 'ant', price }, emb: { provider: 'oai', price: { inputPerMillion: 1, outputPerMillion: 10 } } },
    providers: { oai: { protocol: 'openai', baseUrl: base }, ant: { protocol: 'anthropic', baseUrl: base } },
  }));

  const lastCharge = () => entriesOf(gw(), 'acct_m').at(-1)!;
  const named = (name: string, data: Record<string, unknown>) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
  const respond = (body: string) => up.queue.push((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(body);
  });
  const responses = (extra: Record<string, unknown> = {}) => ({ model: 'gpt', stream: true, input: 'hi', max_output_tokens: 20_000, ...extra });
  const usage = { input_tokens: 100, input_tokens_details: { cached_tokens: 0 }, output_tokens: 10, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 110 };
  const completed = (output: unknown[], u: unknown) => ({ type: 'response.completed', response: { id: 'r', object: 'response', status: 'completed', output, usage: u } });
  const searchItem = { type: 'web_search_call', id: 'ws', status: 'completed', action: { type: 'search', query: 'q' } };

  test('Responses: text deltas labelled response.in_progress are metered by their data\'s type; the stream cut, charged the output relayed', async () => {
    let text = named('response.created', { type: 'response.created', response: { id: 'r', status: 'in_progress' } });
    for (let i = 0; i < 40; i++) text += named('response.in_progress', { type: 'response.output_text.delta', item_id: 'm', output_index: 0, content_index: 0, delta: 'y'.repeat(1000) });
    respond(text); // and no final event
    const res = await postJson(`${gw().url}/v1/responses`, 'sk-m', responses());
    assert.equal(res.status, 200);
    assert.ok((await res.text()).includes('yyyy'));
    const charge = lastCharge();
    assert.deepEqual([charge.estimated, charge.outputTokens], [true, 10_000], 'the 40,000 characters relayed');
  });

  test('Responses: a response.completed labelled response.in_progress is the final event: charged from its usage', async () => {
    respond(named('response.created', { type: 'response.created', response: { id: 'r', status: 'in_progress' } }) +
      named('response.output_text.delta', { type: 'response.output_text.delta', item_id: 'm', output_index: 0, content_index: 0, delta: 'ok' }) +
      named('response.in_progress', completed([], usage)));
    const res = await postJson(`${gw().url}/v1/responses`, 'sk-m', responses());
    assert.equal(res.status, 200);
    await res.text();
    const charge = lastCharge();
    assert.deepEqual([charge.estimated, charge.inputTokens, charge.outputTokens], [false, 100, 10]);
  });

  test('Responses: a whole answer listing 3 searches, its usage null, is charged the searches with its estimate', async () => {
    up.queue.push((_req, res) => json(res, 200, { id: 'r', object: 'response', status: 'completed', output: [searchItem, searchItem, searchItem], usage: null }));
    const res = await postJson(`${gw().url}/v1/responses`, 'sk-m', responses({ stream: false }));
    assert.equal(res.status, 200);
    await res.text();
    const charge = lastCharge();
    // $10 a thousand searches: 10,000 micro-dollars each, and a few for the estimate's tokens.
    assert.equal(charge.estimated, true);
    assert.ok(-charge.amountMicro >= 30_000 && -charge.amountMicro < 30_100, String(charge.amountMicro));
  });

  test('Responses: a stream whose final response lists 2 searches, its usage null, is charged the searches', async () => {
    respond(named('response.created', { type: 'response.created', response: { id: 'r', status: 'in_progress' } }) +
      named('response.completed', completed([searchItem, searchItem], null)));
    const res = await postJson(`${gw().url}/v1/responses`, 'sk-m', responses());
    assert.equal(res.status, 200);
    await res.text();
    const charge = lastCharge();
    assert.equal(charge.estimated, true);
    assert.ok(-charge.amountMicro >= 20_000 && -charge.amountMicro < 20_100, String(charge.amountMicro));
  });

  test('Responses: what a remote MCP server answered counts as input when the stream ends before its usage (found in review: charged the words sent)', async () => {
    const mcp = { type: 'mcp_call', id: 'mcp_1', server_label: 'docs', name: 'fetch', arguments: '{}', output: 'o'.repeat(100_000), error: null };
    respond(named('response.created', { type: 'response.created', response: { id: 'r', status: 'in_progress' } }) +
      named('response.output_item.done', { type: 'response.output_item.done', output_index: 0, item: mcp }) +
      named('response.output_text.delta', { type: 'response.output_text.delta', item_id: 'm', output_index: 1, content_index: 0, delta: 'so' }));
    const res = await postJson(`${gw().url}/v1/responses`, 'sk-m', responses({ tools: [{ type: 'mcp', server_label: 'docs', server_url: 'https://mcp.example.com' }] }));
    assert.equal(res.status, 200);
    await res.text();
    const charge = lastCharge();
    assert.equal(charge.estimated, true);
    assert.ok(charge.inputTokens >= 25_000 && charge.inputTokens < 25_200, String(charge.inputTokens));
  });

  const messages = { model: 'claude', stream: true, max_tokens: 20_000, messages: [{ role: 'user', content: 'hi' }] };
  const start = named('message_start', { type: 'message_start', message: { id: 'msg', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 100, output_tokens: 1 } } });
  /** A /v1/messages call answered by the stream queued with `respond`: its charge. */
  const messagesCharge = async () => {
    const res = await postJson(`${gw().url}/v1/messages`, 'sk-m', messages);
    assert.equal(res.status, 200);
    await res.text();
    return lastCharge();
  };
  const textDelta = (text: string) => named('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } });
  const search = (index: number) => named('content_block_start', { type: 'content_block_start', index, content_block: { type: 'server_tool_use', id: `s${index}`, name: 'web_search', input: {} } });
  const failed = (index: number) => named('content_block_start', {
    type: 'content_block_start', index, content_block: { type: 'web_search_tool_result', tool_use_id: 's', content: { type: 'web_search_tool_result_error', error_code: 'max_uses_exceeded' } },
  });

  for (const [endpoint, path, body] of [['messages', '/v1/messages', messages], ['a translated chat call', '/v1/chat/completions', { ...messages, stream_options: { include_usage: true } }]] as const) {
    test(`${endpoint}: an early message_delta (1 output token), then 40,000 characters: charged the output relayed`, async () => {
      let text = start + named('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }) +
        named('message_delta', { type: 'message_delta', delta: {}, usage: { output_tokens: 1 } });
      for (let i = 0; i < 40; i++) text += textDelta('y'.repeat(1000));
      respond(`${text}${named('content_block_stop', { type: 'content_block_stop', index: 0 })}${named('message_stop', { type: 'message_stop' })}`);
      const res = await postJson(`${gw().url}${path}`, 'sk-m', body);
      assert.equal(res.status, 200);
      await res.text();
      const charge = lastCharge();
      assert.deepEqual([charge.estimated, charge.outputTokens], [true, 10_000]);
    });
  }

  test('messages: a message_delta after more output is final again (a later count covers it all)', async () => {
    respond(start + named('message_delta', { type: 'message_delta', delta: {}, usage: { output_tokens: 1 } }) + textDelta('y'.repeat(400)) +
      named('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 150 } }) + named('message_stop', { type: 'message_stop' }));
    const charge = await messagesCharge();
    assert.deepEqual([charge.estimated, charge.outputTokens], [false, 150]);
  });

  test('messages: two searches, then a final count of 0 searches: charged the 2 that ran', async () => {
    respond(start + search(0) + search(1) +
      named('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 10, server_tool_use: { web_search_requests: 0 } } }) +
      named('message_stop', { type: 'message_stop' }));
    const charge = await messagesCharge();
    assert.deepEqual([charge.estimated, charge.amountMicro], [false, -(100 * 2 + 10 * 8 + 20_000)]);
  });

  test('messages: output in a content_block_start after the count is counted, and the count is not final', async () => {
    respond(start + named('message_delta', { type: 'message_delta', delta: {}, usage: { output_tokens: 1 } }) +
      named('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: 'y'.repeat(40_000) } }) +
      named('message_stop', { type: 'message_stop' }));
    const charge = await messagesCharge();
    assert.deepEqual([charge.estimated, charge.outputTokens], [true, 10_000]);
  });

  const fetched = (index: number, page: string) => named('content_block_start', {
    type: 'content_block_start', index, content_block: {
      type: 'web_fetch_tool_result', tool_use_id: 'f', content: { type: 'web_fetch_result', url: 'https://example.com/', content: { type: 'document', source: { type: 'text', media_type: 'text/plain', data: page } } },
    },
  });

  test('messages: a fetched page after message_start counts as input when the stream ends without a count that includes it (found in review: charged nothing)', async () => {
    // 100,000 characters fetched: about 25,000 tokens Anthropic bills as input, after message_start's 100.
    respond(start + fetched(0, 'p'.repeat(100_000)) + textDelta('so'));
    const charge = await messagesCharge();
    assert.equal(charge.estimated, true);
    assert.ok(charge.inputTokens >= 25_100 && charge.inputTokens < 25_200, String(charge.inputTokens));
  });

  const cachedStart = named('message_start', { type: 'message_start', message: { id: 'msg', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 50, cache_read_input_tokens: 100_000, output_tokens: 1 } } });
  const results = named('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'web_search_tool_result', tool_use_id: 's', content: [{ type: 'web_search_result', url: 'https://example.com/', title: 't', encrypted_content: 'e'.repeat(3_900) }] } });

  test('messages: what a server tool brought in adds to the reported input, its cache reads kept apart (found in review: all priced as input)', async () => {
    respond(cachedStart + results + textDelta('so'));
    const charge = await messagesCharge();
    assert.equal(charge.estimated, true);
    // 100,000 cache reads (free at this price) and about 1,050 input at $2 a million; all of it at the input price was $0.20.
    assert.ok(charge.inputTokens > 101_000 && charge.inputTokens < 101_100, String(charge.inputTokens));
    assert.ok(-charge.amountMicro > 2_000 && -charge.amountMicro < 2_300, String(charge.amountMicro));
  });

  test('messages: once a message_delta input count includes the results, an abnormal end adds nothing for them', async () => {
    respond(cachedStart + results + named('message_delta', { type: 'message_delta', delta: {}, usage: { input_tokens: 1_050, cache_read_input_tokens: 100_000, output_tokens: 1 } }) + textDelta('more'));
    const charge = await messagesCharge();
    assert.equal(charge.estimated, true);
    assert.equal(charge.inputTokens, 101_050);
    assert.equal(-charge.amountMicro, 1_050 * 2 + 1 * 8, 'the reported input, the cache reads at their price, the output relayed');
  });

  test('messages: a message_delta\'s cumulative input count includes what was fetched: charged as it says', async () => {
    respond(start + fetched(0, 'p'.repeat(100_000)) + textDelta('so') +
      named('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { input_tokens: 24_000, output_tokens: 10 } }) +
      named('message_stop', { type: 'message_stop' }));
    const charge = await messagesCharge();
    assert.deepEqual([charge.estimated, charge.inputTokens, charge.outputTokens], [false, 24_000, 10]);
  });

  test('messages: a search whose result is an error is not charged (Anthropic bills none): 3 started, 1 failed, a count of 2', async () => {
    respond(start + search(0) + search(1) + search(2) + failed(3) +
      named('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 10, server_tool_use: { web_search_requests: 2 } } }) +
      named('message_stop', { type: 'message_stop' }));
    const charge = await messagesCharge();
    assert.deepEqual([charge.estimated, charge.amountMicro], [false, -(100 * 2 + 10 * 8 + 20_000)]);
  });

  test('messages: error results before any search cancel none of the searches after them', async () => {
    respond(start + failed(0) + failed(1) + search(2) + search(3) +
      named('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 10 } }) +
      named('message_stop', { type: 'message_stop' }));
    const charge = await messagesCharge();
    assert.deepEqual([charge.estimated, charge.amountMicro], [false, -(100 * 2 + 10 * 8 + 20_000)]);
  });

  const wholeMessage = (content: unknown[], usage: unknown) => ({ id: 'msg', type: 'message', role: 'assistant', content, stop_reason: 'end_turn', usage });
  const searchBlock = { type: 'server_tool_use', id: 's', name: 'web_search', input: { query: 'q' } };

  test('messages, whole: two searches with a count of 0 are charged the 2; with usage that cannot be believed, the 2 and the estimate', async () => {
    up.queue.push((_req, res) => json(res, 200, wholeMessage([searchBlock, searchBlock, { type: 'text', text: 'ok' }], {
      input_tokens: 100, output_tokens: 10, server_tool_use: { web_search_requests: 0 },
    })));
    const exact = await postJson(`${gw().url}/v1/messages`, 'sk-m', { ...messages, stream: false });
    assert.equal(exact.status, 200);
    await exact.text();
    assert.deepEqual([lastCharge().estimated, lastCharge().amountMicro], [false, -(100 * 2 + 10 * 8 + 20_000)]);
    up.queue.push((_req, res) => json(res, 200, wholeMessage([searchBlock, searchBlock, { type: 'text', text: 'ok' }], { input_tokens: 'many' })));
    const broken = await postJson(`${gw().url}/v1/messages`, 'sk-m', { ...messages, stream: false });
    assert.equal(broken.status, 200);
    await broken.text();
    assert.equal(lastCharge().estimated, true);
    assert.ok(-lastCharge().amountMicro >= 20_000 && -lastCharge().amountMicro < 20_100, String(lastCharge().amountMicro));
  });

  test('a count of output no model generates (a broken provider reported 1e9) is taken down to 10,000,000; one past the model\'s outputTokenLimit is not', async () => {
    up.queue.push((_req, res) => json(res, 200, { id: 'r', object: 'response', status: 'completed', output: [], usage: { ...usage, output_tokens: 999_999_999 } }));
    const res = await postJson(`${gw().url}/v1/responses`, 'sk-m', responses({ stream: false, max_output_tokens: 16 }));
    assert.equal(res.status, 200);
    await res.text();
    // 10,000,000 output tokens at $8 a million, and 100 input at $2.
    assert.deepEqual([lastCharge().outputTokens, lastCharge().amountMicro], [10_000_000, -(80_000_000 + 200)]);
    // A call sent no limit may be billed past the model's outputTokenLimit (128,000 here): charged as reported.
    up.queue.push((_req, res) => json(res, 200, { id: 'r', object: 'response', status: 'completed', output: [], usage: { ...usage, output_tokens: 200_000 } }));
    const open = await postJson(`${gw().url}/v1/responses`, 'sk-m', { model: 'gpt', input: 'hi' });
    assert.equal(open.status, 200);
    await open.text();
    assert.equal(lastCharge().outputTokens, 200_000);
  });

  const embedding = (extra: Record<string, unknown>) => ({ object: 'list', model: 'emb', data: [{ object: 'embedding', index: 0, embedding: [0.5, 0.5] }], ...extra });

  test('embeddings: completion tokens a provider reports are no output to charge', async () => {
    up.queue.push((_req, res) => json(res, 200, embedding({ usage: { prompt_tokens: 3, completion_tokens: 1_000_000_000, total_tokens: 1_000_000_003 } })));
    const res = await postJson(`${gw().url}/v1/embeddings`, 'sk-m', { model: 'emb', input: 'abc' });
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual([lastCharge().estimated, lastCharge().outputTokens, lastCharge().amountMicro], [false, 0, -3]);
  });

  test('embeddings: an answer over 8 MiB without usage is charged its input estimate, not its vectors as output', async () => {
    const vector = Array.from({ length: 3072 }, () => 0.123456789);
    const data = Array.from({ length: 300 }, (_, index) => ({ object: 'embedding', index, embedding: vector }));
    up.queue.push((_req, res) => json(res, 200, { object: 'list', model: 'emb', data }));
    const res = await postJson(`${gw().url}/v1/embeddings`, 'sk-m', { model: 'emb', input: 'x'.repeat(400) });
    assert.equal(res.status, 200);
    assert.ok((await res.arrayBuffer()).byteLength > 8 * 1024 * 1024);
    assert.deepEqual([lastCharge().estimated, lastCharge().outputTokens], [true, 0]);
    assert.ok(-lastCharge().amountMicro < 1_000, String(lastCharge().amountMicro));
  });
});

describe('dataTypeIs: a name is trusted only when the data says the same type first', () => {
  test('cases', async () => {
    const { dataTypeIs } = await import('../../src/providers/sse.js');
    const name = 'response.output_text.done';
    assert.equal(dataTypeIs(`event: ${name}\ndata: {"type":"${name}","text":"x"}`, name), true);
    assert.equal(dataTypeIs(`data: {"type":"${name}"}`, name), true);
    assert.equal(dataTypeIs(`event: ${name}\ndata:{"type":"${name}"}`, name), true);
    assert.equal(dataTypeIs(`event: ${name}\ndata: {"type":"${name}x"}`, name), false);
    assert.equal(dataTypeIs(`event: ${name}\ndata: {"type":"response.output_text.delta","delta":"x"}`, name), false);
    assert.equal(dataTypeIs(`event: ${name}\ndata: {"delta":"x","type":"${name}"}`, name), false);
    assert.equal(dataTypeIs(`event: ${name}`, name), false);
  });
});
