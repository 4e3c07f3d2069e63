import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { searchesAllowed, UNBOUNDED_SEARCHES } from '../../src/billing/estimate.js';
import { eventData, SseSplitter } from '../../src/providers/sse.js';
import { chatToMessages } from '../../src/translate/chat-to-messages.js';
import { StreamEnded, Untranslatable } from '../../src/translate/common.js';
import { messagesToChat } from '../../src/translate/messages-to-chat.js';
import { responsesFilesOf, responsesInputOf } from '../../src/translate/chat-to-responses-input.js';
import { responsesToMessages } from '../../src/translate/responses-to-messages.js';
import type { CallFacts, Translation, Translator } from '../../src/translate/types.js';

/**
 * Translation, table-driven, without sockets: requests and answers both ways, and recorded
 * provider streams (test/fixtures/streams, after the providers' documented examples) replayed in
 * every two-chunk split of their bytes.
 */

const FIXTURES = join(__dirname, '..', 'fixtures', 'streams');

function facts(clientBody: Record<string, unknown>, extra: Partial<CallFacts> = {}): CallFacts {
  return { model: 'gw-model', maxOutputTokens: 4096, inputTokens: 321, requestId: 'req_1', clientBody, ...extra };
}

function translation(t: Translator, clientBody: Record<string, unknown>): Translation {
  const request = t.request(clientBody, facts(clientBody));
  return { ...facts(clientBody), names: request.names, created: 1_730_000_000, itemPrefix: 'req_1' };
}

function refused(t: Translator, body: Record<string, unknown>, param: string): void {
  assert.throws(() => t.request(body, facts(body)), (err: unknown) => err instanceof Untranslatable && err.param === param, `refuses ${param}`);
}

/** Runs a stream's bytes, split in two at `at`, through the splitter and the transducer. */
function replay(bytes: Buffer, at: number, transduce: (event: string | null) => string): string {
  const splitter = new SseSplitter();
  let out = '';
  for (const part of [bytes.subarray(0, at), bytes.subarray(at)]) for (const event of splitter.push(part)) out += transduce(event);
  const rest = splitter.rest();
  if (rest !== '') out += transduce(rest);
  return out + transduce(null);
}

const parse = (out: string) => out.split('\n\n').filter((e) => e !== '').map((e) => eventData(`${e}\n\n`)!);
const json = (out: string) => parse(out).filter((d) => d !== '[DONE]').map((d) => JSON.parse(d) as Record<string, unknown>);

describe('chat client -> Anthropic provider', () => {
  test('request: system and developer messages, tools, tool calls and results in one user turn, images, limits', () => {
    const body = {
      model: 'gw-model', max_completion_tokens: 900, stop: 'END', temperature: 0.5, top_p: 0.9, user: 'u-7', stream: true,
      stream_options: { include_usage: true }, parallel_tool_calls: false, tool_choice: 'required',
      tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'developer', content: [{ type: 'text', text: 'Use tools.' }] },
        { role: 'user', content: [{ type: 'text', text: 'Weather?' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0' } }, { type: 'image_url', image_url: { url: 'https://x.test/a.jpg' } }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call.1:odd', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call.1:odd', content: 'Sunny' },
        { role: 'user', content: 'Thanks' },
      ],
    };
    const { body: out, dropped } = chatToMessages.request(body, facts(body, { maxOutputTokens: 900 }));
    assert.deepEqual(dropped, []);
    const msgs = out.messages as Array<{ role: string; content: Array<Record<string, unknown>> }>;
    assert.deepEqual(out.system, [{ type: 'text', text: 'Be brief.' }, { type: 'text', text: 'Use tools.' }]);
    assert.deepEqual(msgs.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.deepEqual(msgs[0]!.content[1], { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0' } });
    assert.deepEqual(msgs[0]!.content[2], { type: 'image', source: { type: 'url', url: 'https://x.test/a.jpg' } });
    const use = msgs[1]!.content[0]!;
    assert.equal(use.type, 'tool_use');
    assert.match(use.id as string, /^[A-Za-z0-9_-]+$/);
    assert.deepEqual(use.input, { city: 'Paris' });
    // The result sits in the user turn right after the call, before the user's own text, with the same id.
    assert.deepEqual(msgs[2]!.content, [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny' }, { type: 'text', text: 'Thanks' }]);
    assert.deepEqual([out.max_tokens, out.stop_sequences, out.temperature, out.top_p, out.stream], [900, ['END'], 0.5, 0.9, true]);
    assert.deepEqual(out.metadata, { user_id: 'u-7' });
    assert.deepEqual(out.tool_choice, { type: 'any', disable_parallel_tool_use: true });
    assert.deepEqual(out.tools, [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }]);
  });

  test('request: tool_choice each way; reasoning_effort becomes a thinking budget; optional fields dropped visibly', () => {
    const cases: Array<[unknown, unknown]> = [['auto', { type: 'auto' }], ['none', { type: 'none' }], ['required', { type: 'any' }],
      [{ type: 'function', function: { name: 'f' } }, { type: 'tool', name: 'f' }]];
    for (const [choice, want] of cases) {
      const body = { model: 'm', messages: [{ role: 'user', content: 'x' }], tool_choice: choice, tools: [{ type: 'function', function: { name: 'f' } }] };
      assert.deepEqual(chatToMessages.request(body, facts(body)).body.tool_choice, want);
      const bare = { model: 'm', messages: [{ role: 'user', content: 'x' }], tool_choice: choice };
      assert.equal(chatToMessages.request(bare, facts(bare)).body.tool_choice, undefined, 'no tool_choice without tools');
    }
    const body = { model: 'm', messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'medium', seed: 1, store: true };
    const out = chatToMessages.request(body, facts(body));
    assert.deepEqual(out.body.thinking, { type: 'enabled', budget_tokens: 4096 - 1 });
    assert.deepEqual(out.dropped, ['store', 'seed']);
  });

  test('request: a tool loop\'s next step keeps thinking off, visibly (found in review: Anthropic refuses a last assistant tool turn without the thinking that began it)', () => {
    const loop = [
      { role: 'user', content: 'weather?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'sunny' },
    ];
    const body = { model: 'm', messages: loop, reasoning_effort: 'high', tools: [{ type: 'function', function: { name: 'f' } }] };
    const out = chatToMessages.request(body, facts(body));
    assert.equal(out.body.thinking, undefined);
    assert.deepEqual(out.dropped, ['reasoning_effort']);
    // After the loop, a plain assistant turn: thinking again.
    const after = { ...body, messages: [...loop, { role: 'assistant', content: 'It is sunny.' }, { role: 'user', content: 'thanks' }] };
    assert.deepEqual(chatToMessages.request(after, facts(after)).body.thinking, { type: 'enabled', budget_tokens: 4096 - 1 });
  });

  test('request: a JSON schema for the answer becomes Anthropic\'s output_config.format (found in review: refused, LangChain\'s and the AI SDK\'s way to ask for an object)', () => {
    const schema = { type: 'object', properties: { name: { type: 'string' } }, required: ['name'], additionalProperties: false };
    const body = { model: 'm', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'Person', strict: true, schema } } };
    assert.deepEqual(chatToMessages.request(body, facts(body)).body.output_config, { format: { type: 'json_schema', schema } });
    const described = { ...body, response_format: { type: 'json_schema', json_schema: { name: 'Person', description: 'a person', schema } } };
    assert.deepEqual(chatToMessages.request(described, facts(described)).dropped, ['response_format.json_schema.description']);
    const text = { model: 'm', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'text' } };
    assert.equal(chatToMessages.request(text, facts(text)).body.output_config, undefined);
    refused(chatToMessages, { model: 'm', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format');
  });

  test('request: what Anthropic cannot express is 400 naming the field', () => {
    const m = [{ role: 'user', content: 'x' }];
    refused(chatToMessages, { model: 'm', messages: m, n: 2 }, 'n');
    refused(chatToMessages, { model: 'm', messages: m, logprobs: true }, 'logprobs');
    refused(chatToMessages, { model: 'm', messages: m, presence_penalty: 0.5 }, 'presence_penalty');
    refused(chatToMessages, { model: 'm', messages: m, response_format: { type: 'json_object' } }, 'response_format');
    refused(chatToMessages, { model: 'm', messages: m, temperature: 1.5 }, 'temperature');
    refused(chatToMessages, { model: 'm', messages: m, audio: { voice: 'x' } }, 'audio');
    // Stop sequences of another type are refused here, not sent on for the provider's 400 (found in review).
    refused(chatToMessages, { model: 'm', messages: m, stop: 5 }, 'stop');
    refused(chatToMessages, { model: 'm', messages: m, stop: ['END', 7] }, 'stop');
    refused(chatToMessages, { model: 'm', messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: {} }] }] }, 'messages[0].content[0]');
    refused(chatToMessages, { model: 'm', messages: [{ role: 'assistant', tool_calls: [{ id: 'c', function: { name: 'f', arguments: '{oops' } }] }] },
      'messages[0].tool_calls[0].function.arguments');
    refused(chatToMessages, { model: 'm', messages: m, tools: [{ type: 'custom', custom: { name: 'x' } }] }, 'tools[0]');
  });

  test('answer: text, tool calls with their names restored, stop reasons and usage (cache tokens inside prompt_tokens)', () => {
    const long = `tool_${'x'.repeat(80)}`;
    const body = { model: 'gw-model', messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: { name: long } }] };
    const call = translation(chatToMessages, body);
    const sent = (chatToMessages.request(body, facts(body)).body.tools as Array<{ name: string }>)[0]!.name;
    assert.equal(sent.length, 64);
    const answer = chatToMessages.answer({
      id: 'msg_1', type: 'message', role: 'assistant', stop_reason: 'tool_use',
      content: [{ type: 'thinking', thinking: 'hm', signature: 's' }, { type: 'text', text: 'Calling.' }, { type: 'tool_use', id: 'toolu_1', name: sent, input: { a: 1 } }],
      usage: { input_tokens: 100, cache_read_input_tokens: 900, cache_creation_input_tokens: 50, output_tokens: 20 },
    }, call);
    const choice = (answer.choices as Array<{ message: Record<string, unknown>; finish_reason: string }>)[0]!;
    assert.equal(choice.message.content, 'Calling.');
    assert.deepEqual(choice.message.tool_calls, [{ id: 'toolu_1', type: 'function', function: { name: long, arguments: '{"a":1}' } }]);
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.deepEqual(answer.usage, { prompt_tokens: 1050, completion_tokens: 20, total_tokens: 1070, prompt_tokens_details: { cached_tokens: 900 } });
    assert.equal(answer.model, 'gw-model');
    for (const [reason, finish] of [['end_turn', 'stop'], ['stop_sequence', 'stop'], ['pause_turn', 'stop'], ['max_tokens', 'length'], ['refusal', 'content_filter']]) {
      const a = chatToMessages.answer({ content: [], stop_reason: reason, usage: {} }, call);
      assert.equal((a.choices as Array<{ finish_reason: string }>)[0]!.finish_reason, finish, reason);
    }
  });

  test('stream: a recorded Anthropic stream in every two-chunk split gives the same chunks; tool calls counted among tool blocks only', () => {
    const bytes = readFileSync(join(FIXTURES, 'anthropic-thinking-tool-use.sse'));
    const body = { model: 'gw-model', messages: [{ role: 'user', content: 'x' }], stream: true, stream_options: { include_usage: true } };
    const whole = replay(bytes, bytes.length, chatToMessages.stream(translation(chatToMessages, body)));
    for (let at = 1; at < bytes.length; at++) assert.equal(replay(bytes, at, chatToMessages.stream(translation(chatToMessages, body))), whole, `split at ${at}`);
    assert.ok(whole.endsWith('data: [DONE]\n\n'));
    const chunks = json(whole);
    let text = '';
    let args = '';
    for (const c of chunks) {
      const delta = (c.choices as Array<{ delta: Record<string, unknown> }>)[0]?.delta ?? {};
      if (typeof delta.content === 'string') text += delta.content;
      for (const tc of (delta.tool_calls as Array<{ index: number; id?: string; function: { name?: string; arguments: string } }> | undefined) ?? []) {
        assert.equal(tc.index, 0, 'the first tool call is index 0, whatever its block index');
        if (tc.id !== undefined) assert.deepEqual([tc.id, tc.function.name], ['toolu_01T1x1fJ34qAmk2tNTrN7Up6', 'get_weather']);
        args += tc.function.arguments;
      }
    }
    assert.equal(text, 'Okay, let\'s check the weather for San Francisco, CA — “ünïcödé” 🌁:');
    assert.deepEqual(JSON.parse(args), { location: 'San Francisco, CA', unit: 'fahrenheit' });
    const finish = chunks.find((c) => (c.choices as Array<{ finish_reason: string | null }>)[0]?.finish_reason != null);
    assert.equal((finish!.choices as Array<{ finish_reason: string }>)[0]!.finish_reason, 'tool_calls');
    assert.deepEqual(chunks.at(-1)!.usage, { prompt_tokens: 472 + 2048 + 100, completion_tokens: 89, total_tokens: 2620 + 89, prompt_tokens_details: { cached_tokens: 2048 } });
    assert.ok(chunks.every((c) => c.model === 'gw-model' && c.id === 'chatcmpl-msg_014p7gG3wDgGV9EUtLvnow3U'));
    // Each chunk is byte for byte JSON.stringify of the chunk object (its head is built once per id).
    for (const event of whole.split('\n\n').filter((e) => e !== '' && e !== 'data: [DONE]')) {
      const c = JSON.parse(eventData(`${event}\n\n`)!) as Record<string, unknown>;
      const choices = c.choices as Array<Record<string, unknown>>;
      const rebuilt = choices.length === 0 ? { id: c.id, object: c.object, created: c.created, model: c.model, choices, usage: c.usage }
        : { id: c.id, object: c.object, created: c.created, model: c.model, choices: [{ index: 0, delta: choices[0]!.delta, logprobs: null, finish_reason: choices[0]!.finish_reason }] };
      assert.equal(`${event}\n\n`, `data: ${JSON.stringify(rebuilt)}\n\n`);
    }
  });

  test('stream: a tool called with no input gets arguments "{}", as a whole answer does (found in review: "", which JSON.parse refuses)', () => {
    const body = { model: 'gw-model', messages: [{ role: 'user', content: 'x' }], stream: true };
    const t = chatToMessages.stream(translation(chatToMessages, body));
    const out = [
      'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":5,"output_tokens":0}}}\n\n',
      'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":{}}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}\n\n',
      'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
      'event: content_block_start\ndata: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_2","name":"add","input":{}}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\":1}"}}\n\n',
      'event: content_block_stop\ndata: {"type":"content_block_stop","index":1}\n\n',
      'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}\n\n',
      'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ].map((e) => t(e)).join('') + t(null);
    const args = ['', ''];
    for (const c of json(out)) {
      for (const tc of ((c.choices as Array<{ delta: { tool_calls?: Array<{ index: number; function: { arguments: string } }> } }>)[0]?.delta.tool_calls ?? [])) args[tc.index] += tc.function.arguments;
    }
    assert.deepEqual(args.map((a) => JSON.parse(a)), [{}, { a: 1 }]);
  });

  test('stream: an input given whole in its block\'s start is the call\'s arguments; a stream without message_delta still ends with a finish_reason (found in review: "{}"; none, which the SDK refuses)', () => {
    const body = { model: 'gw-model', messages: [{ role: 'user', content: 'x' }], stream: true };
    const t = chatToMessages.stream(translation(chatToMessages, body));
    const out = [
      'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":5,"output_tokens":0}}}\n\n',
      'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"add","input":{"a":1}}}\n\n',
      'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
      'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ].map((e) => t(e)).join('') + t(null);
    const chunks = json(out).map((c) => (c.choices as Array<{ delta: { tool_calls?: Array<{ function: { arguments: string } }> }; finish_reason: string | null }>)[0]!);
    assert.equal(chunks.map((c) => c.delta.tool_calls?.[0]?.function.arguments ?? '').join(''), '{"a":1}');
    assert.deepEqual(chunks.map((c) => c.finish_reason).filter((f) => f !== null), ['tool_calls']);
    const plain = chatToMessages.stream(translation(chatToMessages, body));
    const said = json(['event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":5,"output_tokens":0}}}\n\n',
      'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}\n\n',
      'event: message_stop\ndata: {"type":"message_stop"}\n\n'].map((e) => plain(e)).join(''));
    assert.deepEqual(said.map((c) => (c.choices as Array<{ finish_reason: string | null }>)[0]!.finish_reason).filter((f) => f !== null), ['stop'], 'one finish_reason, not two');
  });

  test('stream: no usage chunk unless the client asked; a provider error mid-stream is an error chunk', () => {
    const body = { model: 'gw-model', messages: [{ role: 'user', content: 'x' }], stream: true };
    const bytes = readFileSync(join(FIXTURES, 'anthropic-thinking-tool-use.sse'));
    const out = replay(bytes, bytes.length, chatToMessages.stream(translation(chatToMessages, body)));
    assert.ok(json(out).every((c) => c.usage === undefined));
    const t = chatToMessages.stream(translation(chatToMessages, body));
    const error = t('event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n');
    assert.deepEqual(JSON.parse(eventData(error)!), { error: { message: 'Overloaded', type: 'overloaded_error', code: null } });
  });
});

describe('Anthropic client -> OpenAI provider', () => {
  test('request: system (top level and inside messages), tool results first as tool messages, images, documents', () => {
    const body = {
      model: 'gw-model', max_tokens: 32000, stream: true, stop_sequences: ['###'], temperature: 1, metadata: { user_id: 'user_abc' },
      system: [{ type: 'text', text: 'You are Claude Code.', cache_control: { type: 'ephemeral' } }],
      thinking: { type: 'adaptive' }, output_config: { effort: 'high' }, context_management: { edits: [] },
      tools: [{ name: 'Bash', description: 'Run', input_schema: { type: 'object', properties: { command: { type: 'string' } } }, defer_loading: true }],
      tool_choice: { type: 'auto', disable_parallel_tool_use: true },
      messages: [
        { role: 'system', content: 'A system note inside messages.' },
        { role: 'user', content: [{ type: 'text', text: 'List files' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAA' } }] },
        { role: 'assistant', content: [{ type: 'thinking', thinking: 't', signature: 's' }, { type: 'text', text: 'Running.' }, { type: 'tool_use', id: 'toolu_1', name: 'Bash', input: { command: 'ls' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'a.txt' }] }, { type: 'text', text: 'and now?' }] },
      ],
    };
    const { body: out, dropped } = messagesToChat.request(body, facts(body, { maxOutputTokens: 32000 }));
    assert.deepEqual(new Set(dropped), new Set(['thinking', 'context_management', 'output_config.effort', 'cache_control', 'defer_loading']));
    assert.deepEqual(out.messages, [
      { role: 'system', content: 'You are Claude Code.' },
      { role: 'system', content: 'A system note inside messages.' },
      { role: 'user', content: [{ type: 'text', text: 'List files' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AAA' } }] },
      { role: 'assistant', content: 'Running.', tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'Bash', arguments: '{"command":"ls"}' } }] },
      { role: 'tool', tool_call_id: 'toolu_1', content: 'a.txt' },
      { role: 'user', content: 'and now?' },
    ]);
    assert.deepEqual([out.max_completion_tokens, out.stop, out.temperature, out.user, out.stream], [32000, ['###'], 1, 'user_abc', true]);
    assert.deepEqual(out.stream_options, { include_usage: true });
    assert.deepEqual(out.tools, [{ type: 'function', function: { name: 'Bash', description: 'Run', parameters: { type: 'object', properties: { command: { type: 'string' } } } } }]);
    assert.deepEqual([out.tool_choice, out.parallel_tool_calls], ['auto', false]);
  });

  test('request: output_config.format (Anthropic\'s structured output) becomes response_format, held to the schema (found in review: dropped with output_config)', () => {
    const schema = { type: 'object', properties: { name: { type: 'string' } }, required: ['name'], additionalProperties: false };
    const body = { model: 'm', max_tokens: 100, messages: [{ role: 'user', content: 'x' }], output_config: { format: { type: 'json_schema', schema }, effort: 'low' } };
    const { body: out, dropped } = messagesToChat.request(body, facts(body));
    assert.deepEqual(out.response_format, { type: 'json_schema', json_schema: { name: 'output', schema, strict: true } });
    assert.deepEqual(dropped, ['output_config.effort']);
    refused(messagesToChat, { model: 'm', max_tokens: 100, messages: [{ role: 'user', content: 'x' }], output_config: { format: { type: 'json_schema' } } }, 'output_config.format');
    // A schema with an optional property, which OpenAI's strict mode refuses: sent not strict (review of that change).
    const optional = { type: 'object', properties: { a: { type: 'string' }, b: { type: 'array', items: { type: 'object', properties: { c: { type: 'string' } }, additionalProperties: false } } }, required: ['a', 'b'], additionalProperties: false };
    const loose = { model: 'm', max_tokens: 100, messages: [{ role: 'user', content: 'x' }], output_config: { format: { type: 'json_schema', schema: optional } } };
    assert.equal((messagesToChat.request(loose, facts(loose)).body.response_format as { json_schema: { strict: boolean } }).json_schema.strict, false);
  });

  test('request: a schema\'s strictness is found in time linear in its size (found in review: 49,000 properties and 449,000 required names held the process 20 s)', () => {
    const names = Array.from({ length: 20_000 }, (_, i) => `p${i}`);
    const properties = Object.fromEntries(names.map((n) => [n, true]));
    const required = [...Array.from({ length: 200_000 }, (_, i) => `r${i}`), ...names];
    const body = { model: 'm', max_tokens: 100, messages: [{ role: 'user', content: 'x' }], output_config: { format: { type: 'json_schema', schema: { type: 'object', additionalProperties: false, properties, required } } } };
    const started = performance.now();
    const out = messagesToChat.request(body, facts(body)).body;
    assert.ok(performance.now() - started < 2000, `took ${Math.round(performance.now() - started)} ms`);
    assert.equal((out.response_format as { json_schema: { strict: boolean } }).json_schema.strict, true);
  });

  test('request: tool_choice each way; what chat cannot express is 400 naming the field', () => {
    for (const [choice, want] of [[{ type: 'any' }, 'required'], [{ type: 'none' }, 'none'], [{ type: 'tool', name: 'f' }, { type: 'function', function: { name: 'f' } }]] as const) {
      const body = { model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'x' }], tool_choice: choice, tools: [{ name: 'f', input_schema: {} }] };
      assert.deepEqual(messagesToChat.request(body, facts(body)).body.tool_choice, want);
      const bare = { model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'x' }], tool_choice: choice };
      assert.equal(messagesToChat.request(bare, facts(bare)).body.tool_choice, undefined, 'no tool_choice without tools');
    }
    const m = [{ role: 'user', content: 'x' }];
    refused(messagesToChat, { model: 'm', max_tokens: 10, messages: m, top_k: 5 }, 'top_k');
    refused(messagesToChat, { model: 'm', max_tokens: 10, messages: m, tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 'tools[0]');
    refused(messagesToChat, { model: 'm', max_tokens: 10, messages: m, mcp_servers: [] }, 'mcp_servers');
    refused(messagesToChat, { model: 'm', max_tokens: 10, messages: m, surprise: 1 }, 'surprise');
    refused(messagesToChat, { model: 'm', max_tokens: 10, messages: m, stop_sequences: 'END' }, 'stop_sequences');
    refused(messagesToChat, { model: 'm', max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', content: [{ type: 'image', source: {} }] }] }] },
      'messages[0].content[0].content[0]');
  });

  test('answer: content, tool calls (invalid JSON kept, never {}), odd ids made valid, stop reasons, usage without the cached tokens', () => {
    const body = { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', content: 'x' }] };
    const call = translation(messagesToChat, body);
    const answer = messagesToChat.answer({
      id: 'chatcmpl-9', choices: [{ index: 0, finish_reason: 'tool_calls', message: { role: 'assistant', content: 'Sure.', tool_calls: [
        { id: 'call:1', type: 'function', function: { name: 'f', arguments: '{"a":1}' } },
        { id: 'call_2', type: 'function', function: { name: 'g', arguments: '{"a":' } },
      ] } }],
      usage: { prompt_tokens: 1200, completion_tokens: 30, prompt_tokens_details: { cached_tokens: 1000 } },
    }, call);
    const content = answer.content as Array<Record<string, unknown>>;
    assert.deepEqual(content[0], { type: 'text', text: 'Sure.' });
    assert.match(content[1]!.id as string, /^call_1_[0-9a-f]{8}$/);
    assert.deepEqual([content[1]!.name, content[1]!.input], ['f', { a: 1 }]);
    assert.deepEqual(content[2]!.input, { _raw_arguments: '{"a":' });
    assert.equal(answer.stop_reason, 'tool_use');
    assert.deepEqual(answer.usage, { input_tokens: 200, output_tokens: 30, cache_read_input_tokens: 1000, cache_creation_input_tokens: 0 });
    for (const [finish, reason] of [['stop', 'end_turn'], ['length', 'max_tokens'], ['content_filter', 'refusal']]) {
      assert.equal(messagesToChat.answer({ choices: [{ finish_reason: finish, message: {} }] }, call).stop_reason, reason);
    }
    // A compatible server that finishes a tool-calling turn with "stop" still made a tool_use turn.
    const ollama = { finish_reason: 'stop', message: { tool_calls: [{ id: 'c', function: { name: 'f', arguments: '{}' } }] } };
    assert.equal(messagesToChat.answer({ choices: [ollama] }, call).stop_reason, 'tool_use');
    const t = messagesToChat.stream(call);
    const streamed = t('data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{}"}}]}}]}\n\n') +
      t('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n') + t('data: [DONE]\n\n');
    assert.deepEqual(json(streamed).find((e) => e.type === 'message_delta')!.delta, { stop_reason: 'tool_use', stop_sequence: null });
    // Structured output refused: OpenAI says so in `refusal`, finishing with "stop"; Anthropic's answer stopped for refusal (found in review: end_turn).
    const refusal = messagesToChat.answer({ choices: [{ finish_reason: 'stop', message: { content: null, refusal: 'I cannot help with that.' } }] }, call);
    assert.deepEqual([refusal.content, refusal.stop_reason], [[{ type: 'text', text: 'I cannot help with that.' }], 'refusal']);
    const r = messagesToChat.stream(call);
    const refused = r('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":""}}]}\n\n') +
      r('data: {"choices":[{"index":0,"delta":{"refusal":"I cannot"}}]}\n\n') + r('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n') + r('data: [DONE]\n\n');
    assert.equal(json(refused).filter((e) => e.type === 'content_block_delta').map((e) => (e.delta as { text: string }).text).join(''), 'I cannot');
    assert.deepEqual(json(refused).find((e) => e.type === 'message_delta')!.delta, { stop_reason: 'refusal', stop_sequence: null });
  });

  test('stream: a recorded OpenAI stream in every two-chunk split gives the same events: message_start with a real input count, blocks, input_json_delta, usage', () => {
    const bytes = readFileSync(join(FIXTURES, 'openai-tool-calls.sse'));
    const body = { model: 'gw-model', max_tokens: 100, messages: [{ role: 'user', content: 'x' }], stream: true };
    const whole = replay(bytes, bytes.length, messagesToChat.stream(translation(messagesToChat, body)));
    for (let at = 1; at < bytes.length; at++) assert.equal(replay(bytes, at, messagesToChat.stream(translation(messagesToChat, body))), whole, `split at ${at}`);
    const events = json(whole);
    const types = events.map((e) => e.type);
    assert.deepEqual(types.filter((t) => t !== 'content_block_delta'), [
      'message_start', 'content_block_start', 'content_block_stop', 'content_block_start', 'content_block_start',
      'content_block_stop', 'content_block_stop', 'message_delta', 'message_stop',
    ]);
    const start = events[0]!.message as { usage: Record<string, number>; model: string };
    assert.ok(start.usage.input_tokens > 0, 'message_start never reports zero input');
    assert.equal(start.model, 'gw-model');
    const blocks = new Map<number, { type: string; id?: string; name?: string; text: string }>();
    for (const e of events) {
      if (e.type === 'content_block_start') {
        const b = e.content_block as { type: string; id?: string; name?: string };
        blocks.set(e.index as number, { ...b, text: '' });
      } else if (e.type === 'content_block_delta') {
        const d = e.delta as { type: string; text?: string; partial_json?: string };
        blocks.get(e.index as number)!.text += d.type === 'text_delta' ? d.text : d.partial_json;
      }
    }
    assert.equal(blocks.get(0)!.text, 'Let me look that up — “ünïcödé” 🌁.');
    assert.deepEqual([blocks.get(1)!.name, JSON.parse(blocks.get(1)!.text)], ['get_weather', { location: 'Paris, France' }]);
    assert.deepEqual([blocks.get(2)!.name, JSON.parse(blocks.get(2)!.text)], ['get_time', { tz: 'Europe/Paris' }]);
    assert.match(blocks.get(2)!.id!, /^[A-Za-z0-9_-]+$/, 'an id Anthropic clients accept');
    const delta = events.find((e) => e.type === 'message_delta')!;
    assert.deepEqual(delta.delta, { stop_reason: 'tool_use', stop_sequence: null });
    assert.deepEqual(delta.usage, { input_tokens: 176, output_tokens: 58, cache_read_input_tokens: 1024, cache_creation_input_tokens: 0 });
  });

  test('stream: tool calls without an index (Gemini\'s) are told apart by id; arguments that are not a JSON object arrive kept whole, never as JSON the client cannot parse (found in review: merged into one block; sent as they came)', () => {
    const body = { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', content: 'x' }], stream: true };
    const t = messagesToChat.stream(translation(messagesToChat, body));
    const call = (tc: Record<string, unknown>) => t(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { tool_calls: [tc] } }] })}\n\n`);
    const out = call({ id: 'function-call-1', type: 'function', function: { name: 'glob', arguments: '{"pattern":' } })
      + call({ function: { arguments: '"**/*"}' } }) // neither index nor id: the call before goes on
      + call({ id: 'function-call-2', type: 'function', function: { name: 'read', arguments: "{'path': 'a.md'}" } })
      + call({ id: 'function-call-3', type: 'function', function: { name: 'ls', arguments: '' } })
      + t('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n') + t('data: [DONE]\n\n');
    const events = json(out);
    const blocks = events.filter((e) => e.type === 'content_block_start').map((e) => e.content_block as { id: string; name: string });
    assert.deepEqual(blocks.map((b) => [b.id, b.name]), [['function-call-1', 'glob'], ['function-call-2', 'read'], ['function-call-3', 'ls']]);
    const input = (index: number) => events.filter((e) => e.type === 'content_block_delta' && e.index === index)
      .map((e) => (e.delta as { partial_json: string }).partial_json).join('');
    assert.deepEqual(JSON.parse(input(0)), { pattern: '**/*' });
    assert.deepEqual(JSON.parse(input(1)), { _raw_arguments: "{'path': 'a.md'}" }, 'as the whole answer keeps them');
    assert.equal(input(2), '', 'no arguments: no delta (the client reads {})');
    assert.deepEqual(events.filter((e) => e.type === 'content_block_stop').map((e) => e.index), [0, 1, 2]);
    assert.equal((events.find((e) => e.type === 'message_delta')!.delta as { stop_reason: string }).stop_reason, 'tool_use');
  });

  test('stream: a provider error mid-stream is an Anthropic error event; a stream that said why it stopped is closed without [DONE]; one that did not is broken off, never shown finished', () => {
    const body = { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', content: 'x' }], stream: true };
    const t = messagesToChat.stream(translation(messagesToChat, body));
    const out = t('data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n') + t('data: {"error":{"message":"server overloaded"}}\n\n');
    assert.deepEqual(json(out).map((e) => e.type), ['message_start', 'content_block_start', 'content_block_delta', 'error']);
    const ended = messagesToChat.stream(translation(messagesToChat, body));
    const closed = ended('data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}\n\n') + ended(null);
    assert.deepEqual(json(closed).map((e) => e.type), ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
    // The usage chunk comes before [DONE], the provider's final event: the closing events wait for it.
    const paused = messagesToChat.stream(translation(messagesToChat, body));
    const beforeDone = paused('data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}\n\n')
      + paused('data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n');
    assert.deepEqual(json(beforeDone).map((e) => e.type), ['message_start', 'content_block_start', 'content_block_delta']);
    const atDone = json(paused('data: [DONE]\n\n') + paused(null));
    assert.deepEqual(atDone.map((e) => e.type), ['content_block_stop', 'message_delta', 'message_stop']);
    assert.deepEqual((atDone[1]!.usage as Record<string, number>).output_tokens, 1);
    const cut = messagesToChat.stream(translation(messagesToChat, body));
    cut('data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n');
    assert.throws(() => cut(null), StreamEnded);
    for (const [other, request] of [
      [chatToMessages, { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', content: 'x' }], stream: true }],
      [responsesToMessages, { model: 'gw-model', input: 'x', stream: true }],
    ] as const) {
      const early = other.stream(translation(other, request));
      early('event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":1,"output_tokens":0}}}\n\n');
      assert.throws(() => early(null), StreamEnded, 'an Anthropic stream without message_stop');
    }
  });
});

describe('Responses client -> Anthropic provider', () => {
  const codexLike = (extra: Record<string, unknown> = {}) => ({
    model: 'gw-model', stream: true, store: false, include: ['reasoning.encrypted_content'], prompt_cache_key: 'sess-1', parallel_tool_calls: false,
    reasoning: { effort: 'medium', summary: 'auto' }, tool_choice: 'auto',
    tools: [
      { type: 'function', name: 'exec_command', description: 'Run', parameters: { type: 'object', properties: { cmd: { type: 'string' } } }, strict: false },
      { type: 'namespace', name: 'mcp_fs', tools: [{ type: 'function', name: 'read', parameters: { type: 'object', properties: {} } }] },
      { type: 'web_search' },
    ],
    input: [
      { type: 'message', role: 'developer', content: [{ type: 'input_text', text: 'You are Codex.' }] },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'List files' }] },
      { type: 'function_call', call_id: 'call_1', name: 'exec_command', arguments: '{"cmd":"ls"}' },
      { type: 'function_call_output', call_id: 'call_1', output: 'a.txt' },
    ],
    ...extra,
  });

  test('request: developer items become the system prompt; calls and outputs pair up; tools flattened; optional fields dropped visibly', () => {
    const body = codexLike();
    const { body: out, dropped, names } = responsesToMessages.request(body, facts(body, { maxOutputTokens: 8000 }));
    assert.deepEqual(out.system, [{ type: 'text', text: 'You are Codex.' }]);
    assert.deepEqual(out.messages, [
      { role: 'user', content: [{ type: 'text', text: 'List files' }] },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'call_1', name: 'exec_command', input: { cmd: 'ls' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_1', content: 'a.txt' }] },
    ]);
    assert.deepEqual((out.tools as Array<{ name: string; type?: string }>).map((t) => t.type ?? t.name), ['exec_command', 'mcp_fs__read', 'web_search_20250305']);
    assert.equal(names.get('mcp_fs__read'), 'mcp_fs\u0000read');
    assert.deepEqual(out.tool_choice, { type: 'auto', disable_parallel_tool_use: true });
    // Its last assistant turn calls a tool with no thinking given back: thinking stays off, visibly (Anthropic would refuse it).
    assert.equal(out.thinking, undefined);
    assert.deepEqual([out.max_tokens, out.stream], [8000, true]);
    assert.deepEqual(new Set(dropped), new Set(['store', 'include', 'prompt_cache_key', 'reasoning.effort']));
    const first = codexLike({ input: [{ type: 'message', role: 'user', content: 'List files' }] });
    assert.deepEqual(responsesToMessages.request(first, facts(first, { maxOutputTokens: 8000 })).body.thinking, { type: 'enabled', budget_tokens: 4096 });
  });

  test('request: a web search tool goes to Anthropic bounded by the searches its call reserves, once (an earlier review: unbounded)', () => {
    const body = codexLike({ tools: [{ type: 'web_search' }, { type: 'web_search_preview' }] });
    const { body: out } = responsesToMessages.request(body, facts(body, { maxOutputTokens: 8000 }));
    assert.deepEqual(out.tools, [{ type: 'web_search_20250305', name: 'web_search', max_uses: UNBOUNDED_SEARCHES }]);
    assert.equal(searchesAllowed(body), UNBOUNDED_SEARCHES);
  });

  test('request: a reasoning item the gateway made comes back as the signed thinking block, before the tool_use it led to', () => {
    const call = translation(responsesToMessages, codexLike());
    const answer = responsesToMessages.answer({
      id: 'msg_9', stop_reason: 'tool_use', usage: { input_tokens: 10, output_tokens: 5 },
      content: [{ type: 'thinking', thinking: 'I should list.', signature: 'sig-abc' }, { type: 'tool_use', id: 'toolu_9', name: 'exec_command', input: { cmd: 'ls' } }],
    }, call);
    const [reasoning, fc] = answer.output as Array<Record<string, unknown>>;
    const body = codexLike({ input: [{ type: 'message', role: 'user', content: 'go' }, reasoning, fc, { type: 'function_call_output', call_id: 'toolu_9', output: 'a.txt' }] });
    const out = responsesToMessages.request(body, facts(body, { maxOutputTokens: 8000 })).body;
    assert.deepEqual((out.messages as Turn[])[1], { role: 'assistant', content: [
      { type: 'thinking', thinking: 'I should list.', signature: 'sig-abc' }, { type: 'tool_use', id: 'toolu_9', name: 'exec_command', input: { cmd: 'ls' } },
    ] });
    assert.deepEqual(out.thinking, { type: 'enabled', budget_tokens: 4096 }, 'the thinking given back: thinking stays on');
    // Another provider's reasoning cannot be given to Anthropic: dropped, and said so.
    const foreign = codexLike({ input: [{ type: 'reasoning', id: 'rs_x', summary: [], encrypted_content: 'gAAAA-openai' }, { type: 'message', role: 'user', content: 'hi' }] });
    assert.ok(responsesToMessages.request(foreign, facts(foreign, { maxOutputTokens: 8000 })).dropped.includes('reasoning'));
  });

  test('answer and stream: a redacted thinking block is a reasoning item without a summary, and comes back as the block (found in review: dropped)', () => {
    const redacted = { type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4a' };
    const toolUse = { type: 'tool_use', id: 'toolu_7', name: 'exec_command', input: { cmd: 'ls' } };
    const givenBack = (items: unknown[]) => {
      const body = codexLike({ input: [{ type: 'message', role: 'user', content: 'go' }, ...items, { type: 'function_call_output', call_id: 'toolu_7', output: 'a.txt' }] });
      const out = responsesToMessages.request(body, facts(body, { maxOutputTokens: 8000 })).body;
      assert.deepEqual((out.messages as Turn[])[1], { role: 'assistant', content: [redacted, toolUse] });
      assert.deepEqual(out.thinking, { type: 'enabled', budget_tokens: 4096 }, 'thinking stays on');
    };
    const answer = responsesToMessages.answer({ id: 'msg_7', stop_reason: 'tool_use', usage: {}, content: [redacted, toolUse] }, translation(responsesToMessages, codexLike()));
    const output = answer.output as Array<Record<string, unknown>>;
    assert.deepEqual([output[0]!.type, output[0]!.summary], ['reasoning', []]);
    givenBack(output);
    // Streamed: whole in content_block_start, with no deltas.
    const events = [
      { type: 'message_start', message: { id: 'msg_7', usage: { input_tokens: 5 } } },
      { type: 'content_block_start', index: 0, content_block: redacted }, { type: 'content_block_stop', index: 0 },
      { type: 'content_block_start', index: 1, content_block: { ...toolUse, input: {} } },
      { type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '{"cmd":"ls"}' } }, { type: 'content_block_stop', index: 1 },
      { type: 'message_delta', delta: { stop_reason: 'tool_use' }, usage: { output_tokens: 3 } }, { type: 'message_stop' },
    ];
    const bytes = Buffer.from(events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join(''));
    const streamed = json(replay(bytes, bytes.length, responsesToMessages.stream(translation(responsesToMessages, codexLike()))));
    const completed = streamed.at(-1)!.response as { output: unknown[] };
    const done = streamed.find((e) => e.type === 'response.output_item.done')!.item as Record<string, unknown>;
    assert.deepEqual(done, completed.output[0]);
    givenBack(completed.output);
  });

  test('request: text.format json_schema becomes output_config.format, and the answer says the format it was asked', () => {
    const schema = { type: 'object', properties: { name: { type: 'string' } }, required: ['name'], additionalProperties: false };
    const body = { model: 'm', input: 'x', text: { format: { type: 'json_schema', name: 'Person', strict: true, schema } } };
    assert.deepEqual(responsesToMessages.request(body, facts(body)).body.output_config, { format: { type: 'json_schema', schema } });
    refused(responsesToMessages, { model: 'm', input: 'x', text: { format: { type: 'json_object' } } }, 'text.format');
  });

  test('request: what Anthropic cannot express is 400 naming the field', () => {
    refused(responsesToMessages, { model: 'm', input: 'x', previous_response_id: 'resp_1' }, 'previous_response_id');
    refused(responsesToMessages, { model: 'm', input: 'x', text: 'json' }, 'text');
    refused(responsesToMessages, { model: 'm', input: 'x', text: { format: { type: 'json_schema' } } }, 'text.format');
    refused(responsesToMessages, { model: 'm', input: [{ type: 'item_reference', id: 'x' }] }, 'input[0]');
    refused(responsesToMessages, { model: 'm', input: 'x', temperature: 2 }, 'temperature');
    refused(responsesToMessages, { model: 'm', input: 'x', conversation: 'c' }, 'conversation');
  });

  test('answer: reasoning, message and function_call items (namespaced names split back), status and usage', () => {
    const call = translation(responsesToMessages, codexLike());
    const answer = responsesToMessages.answer({
      id: 'msg_2', stop_reason: 'max_tokens', usage: { input_tokens: 100, cache_read_input_tokens: 900, cache_creation_input_tokens: 0, output_tokens: 40 },
      content: [{ type: 'text', text: 'Reading.' }, { type: 'tool_use', id: 'toolu_2', name: 'mcp_fs__read', input: {} }],
    }, call);
    const output = answer.output as Array<Record<string, unknown>>;
    assert.deepEqual(output.map((o) => o.type), ['message', 'function_call']);
    assert.deepEqual((output[0]!.content as unknown[])[0], { type: 'output_text', text: 'Reading.', annotations: [] });
    assert.deepEqual([output[1]!.call_id, output[1]!.namespace, output[1]!.name, output[1]!.arguments], ['toolu_2', 'mcp_fs', 'read', '{}']);
    // A plain function whose name has "__" in it is no namespace; a namespaced call in the history goes back flattened.
    const plain = responsesToMessages.answer({ content: [{ type: 'tool_use', id: 't', name: 'a__b', input: {} }] }, call).output as Array<Record<string, unknown>>;
    assert.deepEqual([plain[0]!.name, plain[0]!.namespace], ['a__b', undefined]);
    const history = codexLike({ input: [{ type: 'function_call', call_id: 'c1', namespace: 'mcp_fs', name: 'read', arguments: '{}' }] });
    assert.equal(((responsesToMessages.request(history, facts(history, { maxOutputTokens: 8000 })).body.messages as Turn[])[0]!.content[0]!).name, 'mcp_fs__read');
    assert.deepEqual([answer.status, answer.incomplete_details], ['incomplete', { reason: 'max_output_tokens' }]);
    assert.deepEqual(answer.usage, { input_tokens: 1000, input_tokens_details: { cached_tokens: 900 }, output_tokens: 40, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 1040 });
  });

  test('stream: a block left open at message_stop is closed with its text; an input given whole at a block\'s start is the call\'s arguments; text sent to a tool block is not its arguments; the context window\'s stop is incomplete (found in review)', () => {
    const body = codexLike();
    const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const t = responsesToMessages.stream(translation(responsesToMessages, body));
    const out = [
      ev('message_start', { message: { id: 'm1', usage: { input_tokens: 5, output_tokens: 0 } } }),
      ev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_1', name: 'add', input: { a: 1 } } }),
      ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'stray' } }),
      ev('content_block_stop', { index: 0 }),
      ev('content_block_start', { index: 1, content_block: { type: 'text', text: '' } }),
      ev('content_block_delta', { index: 1, delta: { type: 'text_delta', text: 'Hello' } }),
      ev('message_delta', { delta: { stop_reason: 'model_context_window_exceeded' }, usage: { output_tokens: 3 } }),
      ev('message_stop', {}),
    ].map((e) => t(e)).join('') + t(null);
    const events = json(out);
    assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
    const final = events.at(-1)!;
    assert.equal(final.type, 'response.incomplete');
    const response = final.response as { status: string; output: Array<Record<string, unknown>> };
    assert.equal(response.status, 'incomplete');
    assert.deepEqual(response.output.map((o) => [o.type, o.status]), [['function_call', 'completed'], ['message', 'completed']]);
    assert.equal(response.output[0]!.arguments, '{"a":1}');
    assert.equal(events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join(''), '{"a":1}');
    assert.deepEqual((response.output[1]!.content as Array<{ text: string }>).map((c) => c.text), ['Hello']);
    assert.deepEqual(events.filter((e) => e.type === 'response.output_item.done').map((e) => e.output_index), [0, 1]);
    const whole = responsesToMessages.answer({ id: 'm2', stop_reason: 'model_context_window_exceeded', usage: { input_tokens: 1, output_tokens: 1 }, content: [] }, translation(responsesToMessages, body));
    assert.equal(whole.status, 'incomplete');
  });

  test('stream: a recorded Anthropic stream in every two-chunk split gives the same Responses events, numbered in order', () => {
    const bytes = readFileSync(join(FIXTURES, 'anthropic-thinking-tool-use.sse'));
    const body = codexLike({ tools: [{ type: 'function', name: 'get_weather', parameters: {} }] });
    const whole = replay(bytes, bytes.length, responsesToMessages.stream(translation(responsesToMessages, body)));
    for (let at = 1; at < bytes.length; at++) assert.equal(replay(bytes, at, responsesToMessages.stream(translation(responsesToMessages, body))), whole, `split at ${at}`);
    const events = json(whole);
    assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
    assert.deepEqual([...new Set(events.map((e) => e.type))], [
      'response.created', 'response.in_progress', 'response.output_item.added', 'response.reasoning_summary_part.added', 'response.reasoning_summary_text.delta',
      'response.reasoning_summary_text.done', 'response.reasoning_summary_part.done', 'response.output_item.done', 'response.content_part.added',
      'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.function_call_arguments.delta',
      'response.function_call_arguments.done', 'response.completed',
    ]);
    const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
    assert.deepEqual(JSON.parse(args), { location: 'San Francisco, CA', unit: 'fahrenheit' });
    const completed = events.at(-1)!.response as { output: Array<Record<string, unknown>>; usage: Record<string, unknown>; status: string };
    assert.deepEqual(completed.output.map((o) => o.type), ['reasoning', 'message', 'function_call']);
    assert.deepEqual([completed.output[2]!.call_id, completed.output[2]!.name, completed.output[2]!.arguments], ['toolu_01T1x1fJ34qAmk2tNTrN7Up6', 'get_weather', args]);
    assert.equal(completed.status, 'completed');
    assert.deepEqual(completed.usage, { input_tokens: 2620, input_tokens_details: { cached_tokens: 2048 }, output_tokens: 89, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 2709 });
    // The reasoning item carries the signed thinking, for the next turn.
    const again = codexLike({ input: [{ type: 'message', role: 'user', content: 'x' }, completed.output[0], completed.output[2]] });
    const thinking = ((responsesToMessages.request(again, facts(again, { maxOutputTokens: 8000 })).body.messages as Turn[])[1]!.content[0]);
    assert.deepEqual(thinking, { type: 'thinking', thinking: 'The user wants the weather, so I call get_weather.', signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds' });
  });
});

describe('Anthropic text deltas, read without parsing', () => {
  /** The fixture with every text delta's data in another field order: read by JSON.parse, not the text-delta reader. */
  function parsedTheSlowWay(bytes: Buffer): Buffer {
    // Line by line on "\n" only (a regex's ^, $ and . would also stop at U+2028 inside a text).
    const out = Buffer.from(bytes.toString('utf8').replace(/(?<=^|\n)data: (\{"type":"content_block_delta"[^\n]*\})(?=\n)/g, (_, data: string) => {
      const { type, index, delta } = JSON.parse(data) as Record<string, unknown>;
      return `data: ${JSON.stringify({ index, type, delta })}`;
    }));
    assert.ok(!out.includes('{"type":"content_block_delta"'), 'every delta rewritten');
    return out;
  }
  const streams: Array<[string, Translator, Record<string, unknown>]> = [
    ['chat', chatToMessages, { model: 'gw-model', messages: [{ role: 'user', content: 'x' }], stream: true, stream_options: { include_usage: true } }],
    ['Responses', responsesToMessages, { model: 'gw-model', stream: true, input: 'x', tools: [{ type: 'function', name: 'get_weather', parameters: {} }] }],
  ];

  for (const [name, t, body] of streams) {
    test(`${name}: the same bytes out as when each delta is parsed, in every two-chunk split`, () => {
      const bytes = readFileSync(join(FIXTURES, 'anthropic-thinking-tool-use.sse'));
      const slow = parsedTheSlowWay(bytes);
      assert.notEqual(slow.toString(), bytes.toString(), 'the slow-way fixture differs');
      const want = replay(slow, slow.length, t.stream(translation(t, body)));
      for (let at = 1; at < bytes.length; at++) assert.equal(replay(bytes, at, t.stream(translation(t, body))), want, `split at ${at}`);
    });

    test(`${name}: texts with every escape, another block index, a delta for no block: the same bytes as parsed, and no delta parsed`, () => {
      const ev = (type: string, fields: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
      const texts = ['a"b\\c/', 'line\nbreak\r\t\b\f', '\u0000\u001f\u007f', 'é€\u2028😀', '\ud800 lone \udfff', ''];
      const deltas = [...texts.map((text) => ev('content_block_delta', { index: 3, delta: { type: 'text_delta', text } })),
        ev('content_block_delta', { index: 9, delta: { type: 'text_delta', text: 'no such block' } })];
      const others = [
        ev('message_start', { message: { id: 'msg_1', usage: { input_tokens: 3, output_tokens: 1 } } }),
        ev('content_block_start', { index: 3, content_block: { type: 'text', text: '' } }),
        ev('content_block_stop', { index: 3 }),
        ev('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 9 } }),
        ev('message_stop', {}),
      ];
      const bytes = Buffer.from(others[0]! + others[1]! + deltas.join('') + others.slice(2).join(''));
      const parse = JSON.parse;
      let parses = 0;
      JSON.parse = (...args: Parameters<typeof parse>) => (parses++, parse(...args));
      let fast: string;
      try {
        fast = replay(bytes, bytes.length, t.stream(translation(t, body)));
      } finally {
        JSON.parse = parse;
      }
      const plainTexts = texts.filter((text) => !JSON.stringify(text).includes('\\')).length;
      assert.equal(parses, others.length + (name === 'Responses' ? texts.length - plainTexts : 0),
        'only the other events are parsed (and, for Responses, the escaped texts it keeps for the done event)');
      assert.equal(fast, replay(parsedTheSlowWay(bytes), bytes.length, t.stream(translation(t, body))));
    });

    test(`${name}: a text sent with escapes JSON.stringify would not write reaches the client as the same text`, () => {
      const start = 'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":3,"output_tokens":1}}}\n\n' +
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n';
      const deltas = ['\\u00e9t\\u00E9 \\/ ok', '\\ud83d\\ude00\\n'].map((text) =>
        `event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"${text}"}}\n\n`).join('');
      const end = 'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n' +
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}\n\n' +
        'event: message_stop\ndata: {"type":"message_stop"}\n\n';
      const out = json(replay(Buffer.from(start + deltas + end), 1, t.stream(translation(t, body))));
      const text = name === 'chat'
        ? out.map((c) => (c.choices as Array<{ delta: { content?: string } }>)[0]?.delta.content ?? '').join('')
        : out.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
      assert.equal(text, 'été / ok😀\n');
      if (name === 'Responses') assert.equal(out.find((e) => e.type === 'response.output_text.done')!.text, 'été / ok😀\n');
    });
  }
});

type Turn = { role: string; content: Array<Record<string, unknown>> };

describe('chat request -> Responses input, for counting', () => {
  test('every message kind: system and developer, user parts, assistant text, refusals and tool calls, tool results; tools with strict said', () => {
    const chat = {
      model: 'm',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'developer', content: [{ type: 'text', text: 'Cite.' }] },
        { role: 'user', content: [
          { type: 'text', text: 'Read this' },
          { type: 'image_url', image_url: { url: 'https://x/i.png', detail: 'high' } },
          { type: 'file', file: { filename: 'a.pdf', file_data: 'data:application/pdf;base64,AAAA' } },
          { type: 'file', file: { file_id: 'file-1' } },
          { type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } },
        ] },
        { role: 'assistant', content: 'Looking.', tool_calls: [
          { id: 'call_1', type: 'function', function: { name: 'get', arguments: '{"q":1}' } },
          { id: 'call_2', type: 'custom', custom: { name: 'sh', input: 'ls' } },
        ] },
        { role: 'tool', tool_call_id: 'call_1', content: [{ type: 'text', text: 'one' }, { type: 'text', text: 'two' }] },
        { role: 'tool', tool_call_id: 'call_2', content: 'a.txt' },
        { role: 'assistant', content: null, refusal: 'No.' },
        { role: 'function', name: 'old', content: 'legacy' },
        { role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }] },
      ],
      tools: [
        { type: 'function', function: { name: 'get', description: 'Gets.', parameters: { type: 'object', properties: { q: { type: 'number' } } } } },
        { type: 'function', function: { name: 'put', strict: true } },
        { type: 'custom', custom: { name: 'sh', format: { type: 'text' } } },
        { type: 'custom', custom: { name: 'sql', format: { type: 'grammar', grammar: { syntax: 'lark', definition: 'start: "x"' } } } },
        { type: 'web_search' },
      ],
    };
    assert.deepEqual(responsesInputOf(chat), {
      input: [
        { role: 'system', content: 'Be brief.' },
        { role: 'developer', content: [{ type: 'input_text', text: 'Cite.' }] },
        { role: 'user', content: [
          { type: 'input_text', text: 'Read this' },
          { type: 'input_image', image_url: 'https://x/i.png', detail: 'high' },
          { type: 'input_file', filename: 'a.pdf', file_data: 'data:application/pdf;base64,AAAA' },
          { type: 'input_file', file_id: 'file-1' },
        ] },
        { role: 'assistant', content: 'Looking.' },
        { type: 'function_call', call_id: 'call_1', name: 'get', arguments: '{"q":1}' },
        { type: 'custom_tool_call', call_id: 'call_2', name: 'sh', input: 'ls' },
        { type: 'function_call_output', call_id: 'call_1', output: 'onetwo' },
        { type: 'custom_tool_call_output', call_id: 'call_2', output: 'a.txt' },
        { role: 'assistant', content: 'No.' },
      ],
      tools: [
        { type: 'function', name: 'get', description: 'Gets.', parameters: { type: 'object', properties: { q: { type: 'number' } } }, strict: false },
        { type: 'function', name: 'put', parameters: { type: 'object', properties: {} }, strict: true },
        { type: 'custom', name: 'sh', format: { type: 'text' } },
        // Chat nests a grammar; the Responses API has it flat (found in review: the count refused it, and the call went on uncounted).
        { type: 'custom', name: 'sql', format: { type: 'grammar', syntax: 'lark', definition: 'start: "x"' } },
      ],
    });
    assert.deepEqual(responsesFilesOf(chat), [
      { type: 'input_file', filename: 'a.pdf', file_data: 'data:application/pdf;base64,AAAA' }, { type: 'input_file', file_id: 'file-1' },
    ]);
  });

  test('a client\'s object where a string belongs is left out, never String()ed (found in review: a toString of 1 threw, a 500)', () => {
    const odd = { toString: 1 };
    const chat = { messages: [
      { role: 'assistant', content: odd, refusal: odd, tool_calls: [{ id: odd, type: 'function', function: { name: odd, arguments: odd } }, { id: [odd], type: 'custom', custom: { name: odd, input: odd } }] },
      { role: 'tool', tool_call_id: odd, content: odd },
    ] };
    assert.deepEqual(responsesInputOf(chat), { input: [
      { type: 'function_call', call_id: '', name: '', arguments: '' },
      { type: 'custom_tool_call', call_id: '', name: '', input: '' },
      { type: 'custom_tool_call_output', call_id: '', output: '' },
    ] });
  });

  test('what is not a chat request gives an empty input, never a throw', () => {
    for (const body of [{}, { messages: 'x' }, { messages: [null, 1, 'x', { role: 'user' }, { role: 'user', content: [null, { type: 'image_url' }, { type: 'file' }] }], tools: [null, 'x'] }]) {
      assert.deepEqual(responsesInputOf(body as Record<string, unknown>), { input: [] });
    }
  });
});

describe('fields neither sent nor named (found in review, against CONTRACT section 9)', () => {
  test('named in x-gateway-dropped: a chat message\'s name; a Responses image\'s detail. Sent: a Messages tool\'s strict', () => {
    const chat = { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', name: 'alice', content: 'x' }] };
    assert.deepEqual(chatToMessages.request(chat, facts(chat)).dropped, ['messages.name']);
    const responses = { model: 'gw-model', input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png', detail: 'low' }] }] };
    assert.deepEqual(responsesToMessages.request(responses, facts(responses)).dropped, ['input_image.detail']);
    const messages = { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', content: 'x' }], tools: [{ name: 'f', strict: true, input_schema: { type: 'object', properties: {} } }] };
    const sent = messagesToChat.request(messages, facts(messages));
    assert.deepEqual([(sent.body.tools as Array<{ function: { strict?: boolean } }>)[0]!.function.strict, sent.dropped], [true, []]);
  });

  test('malformed, not merely unused: 400 naming the field', () => {
    const messages = { model: 'gw-model', max_tokens: 10, messages: [{ role: 'user', content: 'x' }] };
    refused(messagesToChat, { ...messages, tools: { name: 'f' } }, 'tools');
    refused(messagesToChat, { ...messages, metadata: 'x' }, 'metadata');
    refused(responsesToMessages, { model: 'gw-model', input: 'x', reasoning: 'high' }, 'reasoning');
    refused(responsesToMessages, { model: 'gw-model', input: 'x', tools: { type: 'web_search' } }, 'tools');
  });
});
