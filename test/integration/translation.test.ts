import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { FakeUpstream, json, recordedStream } from '../helpers/fake-upstream.js';
import { accessLog, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Any model behind any endpoint (CONTRACT section 9), through the official SDKs: the openai SDK
 * on an Anthropic-protocol model and the Anthropic SDK on an OpenAI-protocol model, to the fake
 * provider, plain and streamed (the recorded streams of test/fixtures/streams), with a tool-call
 * round trip; the spend is exact, metered from the provider's own usage.
 */

// $1 input, $2 output, $0.50 cache read, $4 cache write per million tokens.
const PRICE = { inputPerMillion: 1, outputPerMillion: 2, cacheReadPerMillion: 0.5, cacheWritePerMillion: 4 };
const FIXTURES = join(__dirname, '..', 'fixtures', 'streams');
const WEATHER = { type: 'object', properties: { location: { type: 'string' }, unit: { type: 'string' } }, required: ['location'] };

describe('translation through the official SDKs', () => {
  const up = new FakeUpstream();
  let gw: Running;
  let openai: OpenAI;
  let anthropic: Anthropic;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 10 } },
      accounts: { acct_t: { plan: 'p' } },
      keys: { key_t: { account: 'acct_t', key: 'sk-translate' }, key_t2: { account: 'acct_t', key: 'sk-translate-2' } },
      models: {
        'claude-t': { provider: 'ant', upstreamModel: 'claude-upstream', price: PRICE },
        'gpt-t': { provider: 'oai', upstreamModel: 'gpt-upstream', price: PRICE },
      },
      providers: {
        ant: { protocol: 'anthropic', baseUrl: base, apiKeyEnv: 'UP_KEY' },
        oai: { protocol: 'openai', baseUrl: `${base}/v1`, apiKeyEnv: 'UP_KEY' },
      },
    }), { env: { UP_KEY: 'sk-provider' } });
    openai = new OpenAI({ apiKey: 'sk-translate', baseURL: `${gw.url}/v1`, maxRetries: 0 });
    anthropic = new Anthropic({ apiKey: 'sk-translate', baseURL: gw.url, maxRetries: 0 });
  });
  after(async () => {
    await gw.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
  });
  const lastCharge = () => entriesOf(gw, 'acct_t').at(-1)!;

  test('openai chat on an Anthropic model: a Messages request upstream; the tool call comes back as tool_calls; charged exactly', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_up1', type: 'message', role: 'assistant', model: 'claude-upstream', stop_reason: 'tool_use', stop_sequence: null,
      content: [{ type: 'text', text: 'Checking.' }, { type: 'tool_use', id: 'toolu_A1', name: 'get_weather', input: { location: 'Paris' } }],
      usage: { input_tokens: 100, cache_read_input_tokens: 900, cache_creation_input_tokens: 50, output_tokens: 20 },
    }));
    const tools = [{ type: 'function' as const, function: { name: 'get_weather', parameters: WEATHER } }];
    const first = await openai.chat.completions.create({
      model: 'claude-t', max_tokens: 300, tools,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Weather in Paris?' }],
    });
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/messages');
    assert.equal(seen.headers['x-api-key'], 'sk-provider');
    assert.deepEqual([seen.body.model, seen.body.max_tokens, seen.body.system], ['claude-upstream', 300, [{ type: 'text', text: 'Be brief.' }]]);
    const message = first.choices[0]!.message;
    assert.equal(message.content, 'Checking.');
    assert.deepEqual(message.tool_calls?.map((c) => [c.id, c.type === 'function' ? c.function.name : '', c.type === 'function' ? c.function.arguments : '']),
      [['toolu_A1', 'get_weather', '{"location":"Paris"}']]);
    assert.equal(first.choices[0]!.finish_reason, 'tool_calls');
    assert.deepEqual(first.usage, { prompt_tokens: 1050, completion_tokens: 20, total_tokens: 1070, prompt_tokens_details: { cached_tokens: 900 } });
    assert.equal(first.model, 'claude-t');
    // 100 x $1 + 900 x $0.5 + 50 x $4 + 20 x $2 per million.
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-(100 + 450 + 200 + 40), false]);

    // The round trip: the result goes back as a tool_result in the user turn right after the tool_use.
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_up2', type: 'message', role: 'assistant', stop_reason: 'end_turn', content: [{ type: 'text', text: 'Sunny, 21°C.' }],
      usage: { input_tokens: 1200, output_tokens: 9 },
    }));
    const second = await openai.chat.completions.create({
      model: 'claude-t', max_tokens: 300, tools,
      messages: [{ role: 'user', content: 'Weather in Paris?' }, message, { role: 'tool', tool_call_id: 'toolu_A1', content: 'sunny, 21' }],
    });
    assert.equal(second.choices[0]!.message.content, 'Sunny, 21°C.');
    const turns = up.seen.at(-1)!.body.messages as Array<{ role: string; content: Array<Record<string, unknown>> }>;
    assert.deepEqual(turns.map((t) => t.role), ['user', 'assistant', 'user']);
    assert.deepEqual(turns[1]!.content[1], { type: 'tool_use', id: 'toolu_A1', name: 'get_weather', input: { location: 'Paris' } });
    assert.deepEqual(turns[2]!.content, [{ type: 'tool_result', tool_use_id: 'toolu_A1', content: 'sunny, 21' }]);
    assert.equal(lastCharge().amountMicro, -(1200 + 18));
  });

  test('openai chat streamed on an Anthropic model: the recorded stream arrives as chunks; tool arguments whole; charged once, exactly', async () => {
    up.queue.push(recordedStream(readFileSync(join(FIXTURES, 'anthropic-thinking-tool-use.sse'))));
    const before = entriesOf(gw, 'acct_t').length;
    const stream = await openai.chat.completions.create({
      model: 'claude-t', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'Weather in SF?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: WEATHER } }],
    });
    let text = '';
    let args = '';
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | null | undefined = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (choice?.delta.content) text += choice.delta.content;
      for (const tc of choice?.delta.tool_calls ?? []) args += tc.function?.arguments ?? '';
      if (choice?.finish_reason) finish = choice.finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(up.seen.at(-1)!.body.stream, true);
    assert.equal(text, 'Okay, let\'s check the weather for San Francisco, CA — “ünïcödé” 🌁:');
    assert.deepEqual(JSON.parse(args), { location: 'San Francisco, CA', unit: 'fahrenheit' });
    assert.equal(finish, 'tool_calls');
    assert.deepEqual(usage, { prompt_tokens: 2620, completion_tokens: 89, total_tokens: 2709, prompt_tokens_details: { cached_tokens: 2048 } });
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'the charge');
    // 472 x $1 + 2048 x $0.5 + 100 x $4 + 89 x $2 per million.
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-(472 + 1024 + 400 + 178), false]);
  });

  test('Anthropic messages on an OpenAI model: a chat request upstream; tool_calls come back as tool_use; charged exactly', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'chatcmpl-up', object: 'chat.completion', model: 'gpt-upstream',
      choices: [{ index: 0, finish_reason: 'tool_calls', message: { role: 'assistant', content: null, tool_calls: [
        { id: 'call_Q1', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Oslo"}' } }] } }],
      usage: { prompt_tokens: 1500, completion_tokens: 12, prompt_tokens_details: { cached_tokens: 1000 } },
    }));
    const tools = [{ name: 'get_weather', description: 'Weather', input_schema: WEATHER as Anthropic.Tool.InputSchema }];
    const first = await anthropic.messages.create({
      model: 'gpt-t', max_tokens: 256, tools, system: 'Be brief.', messages: [{ role: 'user', content: 'Weather in Oslo?' }],
    });
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/chat/completions');
    assert.equal(seen.headers.authorization, 'Bearer sk-provider');
    assert.deepEqual([seen.body.model, seen.body.max_completion_tokens], ['gpt-upstream', 256]);
    assert.deepEqual((seen.body.messages as unknown[])[0], { role: 'system', content: 'Be brief.' });
    assert.deepEqual(first.content, [{ type: 'tool_use', id: 'call_Q1', name: 'get_weather', input: { location: 'Oslo' } }]);
    assert.equal(first.stop_reason, 'tool_use');
    assert.deepEqual(first.usage, { input_tokens: 500, output_tokens: 12, cache_read_input_tokens: 1000, cache_creation_input_tokens: 0 });
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-(500 + 500 + 24), false]);

    up.queue.push((_req, res) => json(res, 200, {
      id: 'chatcmpl-up2', choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'Cold.' } }],
      usage: { prompt_tokens: 1600, completion_tokens: 2 },
    }));
    const second = await anthropic.messages.create({
      model: 'gpt-t', max_tokens: 256, tools,
      messages: [
        { role: 'user', content: 'Weather in Oslo?' },
        { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_Q1', content: '-3 C' }] },
      ],
    });
    assert.deepEqual(second.content, [{ type: 'text', text: 'Cold.' }]);
    assert.deepEqual((up.seen.at(-1)!.body.messages as unknown[]).slice(1), [
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_Q1', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_Q1', content: '-3 C' },
    ]);
  });

  test('Anthropic messages streamed on an OpenAI model: the recorded stream arrives as events; tool inputs parsed; optional fields dropped visibly', async () => {
    up.queue.push(recordedStream(readFileSync(join(FIXTURES, 'openai-tool-calls.sse'))));
    const before = entriesOf(gw, 'acct_t').length;
    const stream = anthropic.messages.stream({
      model: 'gpt-t', max_tokens: 1024, thinking: { type: 'enabled', budget_tokens: 512 } as never, messages: [{ role: 'user', content: 'Paris weather and time?' }],
    });
    const response = await stream.withResponse();
    assert.equal(response.response.headers.get('x-gateway-dropped'), 'thinking');
    const message = await stream.finalMessage();
    assert.equal(up.seen.at(-1)!.body.stream, true);
    assert.equal(up.seen.at(-1)!.body.thinking, undefined);
    assert.deepEqual(message.content.map((b) => b.type), ['text', 'tool_use', 'tool_use']);
    assert.equal((message.content[0] as Anthropic.TextBlock).text, 'Let me look that up — “ünïcödé” 🌁.');
    assert.deepEqual((message.content[1] as Anthropic.ToolUseBlock).input, { location: 'Paris, France' });
    assert.deepEqual((message.content[2] as Anthropic.ToolUseBlock).input, { tz: 'Europe/Paris' });
    assert.equal(message.stop_reason, 'tool_use');
    assert.deepEqual([message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens], [176, 58, 1024]);
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'the charge');
    // 176 x $1 + 1024 x $0.5 + 58 x $2 per million.
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-(176 + 512 + 116), false]);
    await until(() => accessLog(gw).some((l) => l.dropped === 'thinking'), 2000, 'the log line naming what was dropped');
  });

  test('Anthropic messages streamed on an OpenAI model whose provider pauses between its usage chunk and [DONE]: message_stop comes after the charge (found in review: it came with the usage chunk, before the call settled)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}\n\n');
      res.write('data: {"id":"c1","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3}}\n\n');
      // The provider's final event comes a moment later: the answer's last events must wait for it.
      setTimeout(() => res.end('data: [DONE]\n\n'), 300);
    });
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-translate', { model: 'gpt-t', max_tokens: 50, stream: true, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(res.status, 200);
    const decoder = new TextDecoder();
    let text = '';
    let chargedAtStop: number | null = null;
    for await (const chunk of res.body!) {
      text += decoder.decode(chunk as Uint8Array, { stream: true });
      if (chargedAtStop === null && text.includes('event: message_stop')) chargedAtStop = entriesOf(gw, 'acct_t').length - before;
    }
    assert.equal(chargedAtStop, 1, 'charged when message_stop reached the client');
    assert.match(text, /"usage":\{"input_tokens":10,"output_tokens":3/);
    // 10 x $1 + 3 x $2 per million.
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-16, false]);
  });

  test('openai responses on an Anthropic model: plain with a tool round trip, and streamed from the recorded stream; charged exactly', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_r1', type: 'message', role: 'assistant', stop_reason: 'tool_use',
      content: [{ type: 'tool_use', id: 'toolu_R1', name: 'get_weather', input: { location: 'Rome' } }],
      usage: { input_tokens: 300, cache_read_input_tokens: 700, output_tokens: 15 },
    }));
    const tools = [{ type: 'function' as const, name: 'get_weather', parameters: WEATHER, strict: false }];
    const first = await openai.responses.create({ model: 'claude-t', instructions: 'Be brief.', input: 'Weather in Rome?', tools, store: false, max_output_tokens: 400 });
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/messages');
    assert.deepEqual([seen.body.system, seen.body.max_tokens], [[{ type: 'text', text: 'Be brief.' }], 400]);
    const call = first.output[0] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.deepEqual([call.type, call.call_id, call.name, call.arguments], ['function_call', 'toolu_R1', 'get_weather', '{"location":"Rome"}']);
    assert.deepEqual([first.usage?.input_tokens, first.usage?.input_tokens_details.cached_tokens, first.usage?.output_tokens], [1000, 700, 15]);
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-(300 + 350 + 30), false]);

    up.queue.push(recordedStream(readFileSync(join(FIXTURES, 'anthropic-thinking-tool-use.sse'))));
    const before = entriesOf(gw, 'acct_t').length;
    const stream = openai.responses.stream({
      model: 'claude-t', tools, store: false,
      input: [{ role: 'user', content: 'Weather in Rome?' }, call, { type: 'function_call_output', call_id: 'toolu_R1', output: 'warm' }, { role: 'user', content: 'And SF?' }],
    });
    const final = await stream.finalResponse();
    const turns = up.seen.at(-1)!.body.messages as Array<{ role: string; content: Array<Record<string, unknown>> }>;
    assert.deepEqual(turns.map((t) => t.role), ['user', 'assistant', 'user']);
    assert.deepEqual(turns[2]!.content, [{ type: 'tool_result', tool_use_id: 'toolu_R1', content: 'warm' }, { type: 'text', text: 'And SF?' }]);
    assert.deepEqual(final.output.map((o) => o.type), ['reasoning', 'message', 'function_call']);
    assert.equal(final.output_text, 'Okay, let\'s check the weather for San Francisco, CA — “ünïcödé” 🌁:');
    assert.deepEqual(JSON.parse((final.output[2] as OpenAI.Responses.ResponseFunctionToolCall).arguments), { location: 'San Francisco, CA', unit: 'fahrenheit' });
    assert.equal(final.usage?.input_tokens, 2620);
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'the charge');
    assert.deepEqual([lastCharge().amountMicro, lastCharge().estimated], [-(472 + 1024 + 400 + 178), false]);
  });

  test('a reference to an item of an earlier translated answer is put back whole, in the call and in its count; not for another key (found in review)', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_up9', type: 'message', role: 'assistant', model: 'claude-upstream', stop_reason: 'end_turn', stop_sequence: null,
      content: [{ type: 'text', text: 'The first answer.' }], usage: { input_tokens: 10, output_tokens: 4 },
    }));
    // A client's x-request-id does not make the ids: another call reusing it gets ids of its own.
    const first = await openai.responses.create({ model: 'claude-t', input: 'hi' }, { headers: { 'x-request-id': 'sess-42' } });
    const id = first.output[0]!.id!;
    assert.doesNotMatch(id, /sess-42/);
    const input = [{ role: 'user' as const, content: 'hi' }, { type: 'item_reference' as const, id }, { role: 'user' as const, content: 'and?' }];
    up.queue.push((_req, res) => json(res, 200, { input_tokens: 33 }));
    const counted = await openai.responses.inputTokens.count({ model: 'claude-t', input });
    assert.equal(counted.input_tokens, 33);
    const sent = up.seen.at(-1)!.body.messages as Array<{ role: string; content: unknown }>;
    assert.deepEqual(sent.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.match(JSON.stringify(sent[1]), /The first answer\./);
    // Another key of the same account does not know it.
    const other = await fetch(`${gw.url}/v1/responses`, {
      method: 'POST', headers: { authorization: 'Bearer sk-translate-2', 'content-type': 'application/json' }, body: JSON.stringify({ model: 'claude-t', input }),
    });
    assert.equal(other.status, 400);
    assert.match(await other.text(), /item_reference/);
  });

  test('a provider answer too deeply nested to rebuild is 502 for the client, charged once, and the gateway lives on', async () => {
    const deep = `${'{"a":'.repeat(200_000)}1${'}'.repeat(200_000)}`;
    up.queue.push((_req, res) => {
      const body = `{"id":"msg_deep","type":"message","role":"assistant","stop_reason":"tool_use","content":[{"type":"tool_use","id":"toolu_d","name":"f","input":${deep}}],"usage":{"input_tokens":10,"output_tokens":5}}`;
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) });
      res.end(body);
    });
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', { model: 'claude-t', max_tokens: 10, messages: [{ role: 'user', content: 'x' }] });
    assert.equal(res.status, 502);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_error');
    assert.equal(entriesOf(gw, 'acct_t').length, before + 1, 'the provider answered: the call is charged, once');
    assert.equal(lastCharge().amountMicro, -(10 + 10));
    await until(() => gw.gateway.inFlight === 0, 2000, 'the slot released');
  });

  test('a stream asked for, a whole JSON answer given (a compatible server ignoring stream): the client gets it translated, whole, with its own length; charged once', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_plain', type: 'message', role: 'assistant', model: 'claude-upstream', stop_reason: 'end_turn', stop_sequence: null,
      content: [{ type: 'text', text: 'Not streamed, after all.' }], usage: { input_tokens: 30, output_tokens: 7 },
    }));
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', { model: 'claude-t', stream: true, max_tokens: 10, messages: [{ role: 'user', content: 'x' }] });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
    const text = await res.text();
    assert.equal(res.headers.get('content-length'), String(Buffer.byteLength(text)), 'the length is the translated answer\'s');
    const body = JSON.parse(text) as { object: string; choices: Array<{ message: { content: string } }> };
    assert.equal(body.object, 'chat.completion');
    assert.equal(body.choices[0]!.message.content, 'Not streamed, after all.');
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'charged once');
    assert.equal(lastCharge().amountMicro, -(30 + 14));
    await until(() => gw.gateway.inFlight === 0, 2000, 'the slot released');
  });

  /** An Anthropic stream as the provider writes it, one write per event. */
  const anthropicEvents = (events: Array<[string, unknown]>, end = true) => (_req: unknown, res: import('node:http').ServerResponse) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (const [type, data] of events) res.write(`event: ${type}\ndata: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
    if (end) res.end();
  };
  const started: Array<[string, unknown]> = [
    ['message_start', { type: 'message_start', message: { id: 'msg_cut', type: 'message', role: 'assistant', content: [], model: 'claude-upstream', usage: { input_tokens: 40, output_tokens: 1 } } }],
    ['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }],
    ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'abcdefgh' } }],
  ];
  const chatStream = { model: 'claude-t', stream: true, max_tokens: 10, messages: [{ role: 'user', content: 'x' }] };

  test('a translated stream that ends before its final event is cut for the client, never shown finished; charged an estimate', async () => {
    up.queue.push(anthropicEvents(started));
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', chatStream);
    assert.equal(res.status, 200);
    await assert.rejects(res.text(), 'the client sees a broken answer, not a [DONE]');
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'charged once');
    assert.equal(lastCharge().estimated, true);
    assert.equal(lastCharge().inputTokens, 40, 'at least the input the provider reported');
    assert.equal(lastCharge().outputTokens, 2, 'the 8 characters relayed');
    await until(() => gw.gateway.inFlight === 0, 2000, 'the slot released');
  });

  test('a translated stream with an event too deeply nested to rebuild is cut, charged once, and the gateway lives on', async () => {
    const deep = `${'{"a":'.repeat(200_000)}1${'}'.repeat(200_000)}`;
    up.queue.push(anthropicEvents([...started, ['error', `{"type":"error","error":{"type":${deep},"message":"x"}}`]], false));
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', chatStream);
    assert.equal(res.status, 200);
    await assert.rejects(res.text());
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'charged once');
    assert.equal(lastCharge().estimated, true);
    await until(() => gw.gateway.inFlight === 0, 2000, 'the slot released');
    assert.ok(accessLog(gw).length > 0);
    up.queue.push(anthropicEvents([...started,
      ['content_block_stop', { type: 'content_block_stop', index: 0 }],
      ['message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 3 } }],
      ['message_stop', { type: 'message_stop' }]]));
    const next = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', chatStream);
    const text = await next.text();
    assert.ok(text.includes('"content":"abcdefgh"') && text.endsWith('data: [DONE]\n\n'), text);
  });

  test('a whole answer asked for, a stream given: 502 for the client, charged once', async () => {
    up.queue.push(anthropicEvents(started));
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', { ...chatStream, stream: false });
    assert.equal(res.status, 502);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_error');
    await until(() => entriesOf(gw, 'acct_t').length === before + 1, 2000, 'charged');
    await until(() => gw.gateway.inFlight === 0, 2000, 'the slot released');
    assert.equal(entriesOf(gw, 'acct_t').length, before + 1, 'charged once');
    assert.equal(lastCharge().estimated, true, 'the provider had the request: an abnormal end');
    assert.equal(lastCharge().inputTokens, 40, 'at least the input it reported');
  });

  test('a whole answer asked for, a stream given that breaks off before its first event: 502 for the client, not a dropped connection; charged once', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('event: message_start\ndata: {"type":"message_st', () => res.destroy());
    });
    const before = entriesOf(gw, 'acct_t').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-translate', { ...chatStream, stream: false });
    assert.equal(res.status, 502);
    const body = (await res.json()) as { error: { code: string; message: string } };
    assert.equal(body.error.code, 'upstream_error');
    assert.match(body.error.message, /stream broke off before its first event/);
    await until(() => gw.gateway.inFlight === 0, 2000, 'the slot released');
    assert.equal(entriesOf(gw, 'acct_t').length, before + 1, 'charged once');
    assert.equal(lastCharge().estimated, true, 'the provider had the request: an abnormal end');
  });

  test('what the target cannot express is 400 naming the field, before anything reaches the provider or is charged', async () => {
    const hits = up.hits;
    const entries = entriesOf(gw, 'acct_t').length;
    await assert.rejects(openai.chat.completions.create({ model: 'claude-t', n: 2, messages: [{ role: 'user', content: 'x' }] }),
      (err: InstanceType<typeof OpenAI.BadRequestError>) => err.status === 400 && (err.error as { param?: string }).param === 'n');
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-translate', { model: 'gpt-t', max_tokens: 10, top_k: 3, messages: [{ role: 'user', content: 'x' }] });
    assert.equal(res.status, 400);
    const body = (await res.json()) as { error: { type: string; message: string } };
    assert.equal(body.error.type, 'invalid_request_error');
    assert.match(body.error.message, /top_k/);
    assert.equal(up.hits, hits);
    assert.equal(entriesOf(gw, 'acct_t').length, entries);
    assert.equal(gw.gateway.inFlight, 0);
  });
});
