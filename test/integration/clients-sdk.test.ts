import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';
import { FakeUpstream, json, responseObject, responsesStream } from '../helpers/fake-upstream.js';
import { entriesOf, startGateway, testConfig, type Running } from '../helpers/gateway.js';

/**
 * The Responses API, token counting and the models list, driven by the official SDKs through
 * the gateway to a fake provider (and to the mock), with the spend checked exactly in
 * /v1/usage and the billing history (CONTRACT section 8).
 */

// $1 input, $2 output, $0.50 cached per million tokens.
const PRICE = { inputPerMillion: 1, outputPerMillion: 2, cacheReadPerMillion: 0.5 };
// 1,000 input tokens of which 400 cached, 50 output (10 of them reasoning): 600 + 200 + 100 micro-dollars.
const USAGE = { input_tokens: 1000, input_tokens_details: { cached_tokens: 400 }, output_tokens: 50, output_tokens_details: { reasoning_tokens: 10 }, total_tokens: 1050 };
const COST = 0.0009;

const CALL = { call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' };

describe('clients people use: Responses, count_tokens, the models list (official SDKs)', () => {
  const up = new FakeUpstream();
  let gw: Running;
  let openai: OpenAI;
  let anthropic: Anthropic;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 10 }, counted: { rpm: 3, concurrency: 10 } },
      accounts: { acct_c: { plan: 'p' }, acct_r: { plan: 'counted' } },
      keys: { key_c: { account: 'acct_c', key: 'sk-clients' }, key_r: { account: 'acct_r', key: 'sk-rpm' } },
      models: {
        'echo-1': { provider: 'mock', displayName: 'Echo One' },
        'gpt-r': { provider: 'oai', upstreamModel: 'gpt-upstream', price: PRICE },
        'claude-c': { provider: 'ant', upstreamModel: 'claude-upstream', price: PRICE },
      },
      providers: {
        mock: { protocol: 'mock' },
        oai: { protocol: 'openai', baseUrl: `${base}/v1`, apiKeyEnv: 'UP_KEY' },
        ant: { protocol: 'anthropic', baseUrl: base, apiKeyEnv: 'UP_KEY' },
      },
    }), { env: { UP_KEY: 'sk-provider' } });
    openai = new OpenAI({ apiKey: 'sk-clients', baseURL: `${gw.url}/v1`, maxRetries: 0 });
    anthropic = new Anthropic({ apiKey: 'sk-clients', baseURL: gw.url, maxRetries: 0 });
  });
  after(async () => {
    await gw.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
  });

  const usageCost = async (model: string) => {
    const res = await fetch(`${gw.url}/v1/usage?group_by=model`, { headers: { authorization: 'Bearer sk-clients' } });
    const rows = ((await res.json()) as { data: Array<{ model: string; cost: number; requests: number; input_tokens: number; output_tokens: number }> }).data;
    return rows.find((r) => r.model === model);
  };

  test('responses.create: a function call passes through; the spend is exact (cached input at the cache price, reasoning in output)', async () => {
    up.queue.push((_req, res) => json(res, 200, responseObject([{ call: CALL }], USAGE)));
    const response = await openai.responses.create({
      model: 'gpt-r', input: [{ role: 'user', content: 'Weather in Paris?' }], store: false, max_output_tokens: 500,
      tools: [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } }, strict: false }],
    });
    const call = response.output[0] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.equal(call.type, 'function_call');
    assert.equal(call.name, 'get_weather');
    assert.equal(call.arguments, '{"city":"Paris"}');
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/responses');
    assert.equal(seen.body.model, 'gpt-upstream');
    assert.equal(seen.body.store, false);
    assert.equal(seen.headers.authorization, 'Bearer sk-provider');
    const charge = entriesOf(gw, 'acct_c').at(-1)!;
    assert.equal(charge.amountMicro, -COST * 1e6);
    assert.equal(charge.estimated, false);
    assert.equal(charge.inputTokens, 1000);
    assert.equal(charge.outputTokens, 50);
    const history = await (await fetch(`${gw.url}/v1/billing/history?limit=1`, { headers: { authorization: 'Bearer sk-clients' } })).json() as { data: Array<{ amount: number; model: string }> };
    assert.deepEqual([history.data[0]!.amount, history.data[0]!.model], [-COST, 'gpt-r']);
  });

  test('responses, streamed through the SDK: the tool call\'s arguments arrive whole, charged once, exactly', async () => {
    up.queue.push(responsesStream([{ call: CALL }], USAGE));
    const before = (await usageCost('gpt-r'))!;
    const stream = openai.responses.stream({ model: 'gpt-r', input: 'Weather in Paris?', stream: true } as never);
    const deltas: string[] = [];
    stream.on('response.function_call_arguments.delta', (e) => deltas.push(e.delta));
    const final = await stream.finalResponse();
    assert.deepEqual(deltas, ['{"city":', '"Paris"}']);
    assert.equal((final.output[0] as OpenAI.Responses.ResponseFunctionToolCall).arguments, '{"city":"Paris"}');
    assert.equal(final.usage?.output_tokens_details.reasoning_tokens, 10);
    const after = (await usageCost('gpt-r'))!;
    assert.equal(after.requests, before.requests + 1);
    assert.ok(Math.abs(after.cost - before.cost - COST) < 1e-9, `${after.cost - before.cost}`);
  });

  test('responses on the mock: plain and streamed, in the real event sequence', async () => {
    const plain = await openai.responses.create({ model: 'echo-1', input: 'hello responses', max_output_tokens: 100 });
    assert.equal(plain.output_text, 'hello responses');
    assert.equal(plain.usage?.output_tokens, 4);
    const stream = openai.responses.stream({ model: 'echo-1', input: [{ role: 'user', content: [{ type: 'input_text', text: 'streamed reply' }] }] });
    const types: string[] = [];
    stream.on('event', (e) => types.push(e.type));
    const final = await stream.finalResponse();
    assert.equal(final.output_text, 'streamed reply');
    assert.deepEqual([...new Set(types)], [
      'response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added',
      'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed',
    ]);
    await assert.rejects(openai.responses.retrieve('resp_x'), (err: InstanceType<typeof OpenAI.NotFoundError>) => err.status === 404);
  });

  test('messages.countTokens: the mock counts as it meters; anthropic providers are asked, with their headers; OpenAI-protocol ones through the call\'s translation', async () => {
    const counted = await anthropic.messages.countTokens({ model: 'echo-1', system: 'be brief', messages: [{ role: 'user', content: 'count these words' }] });
    assert.equal(counted.input_tokens, Math.ceil(('be brief'.length + 'count these words'.length) / 4));
    up.queue.push((_req, res) => json(res, 200, { input_tokens: 1234 }));
    const passed = await anthropic.messages.countTokens(
      { model: 'claude-c', messages: [{ role: 'user', content: 'hi' }] },
      { headers: { 'anthropic-beta': 'token-efficient-tools-2025-02-19' } },
    );
    assert.equal(passed.input_tokens, 1234);
    const seen = up.seen.at(-1)!;
    assert.equal(seen.path, '/v1/messages/count_tokens');
    assert.equal(seen.body.model, 'claude-upstream');
    assert.equal(seen.headers['x-api-key'], 'sk-provider');
    assert.equal(seen.headers['anthropic-beta'], 'token-efficient-tools-2025-02-19');
    assert.ok(typeof seen.headers['anthropic-version'] === 'string');
    // An OpenAI-protocol model: the Messages body as the call would send it, in the Responses form OpenAI's count takes.
    up.queue.push((_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: 77 }));
    const translated = await anthropic.messages.countTokens({
      model: 'gpt-r', system: 'be brief', messages: [{ role: 'user', content: 'hi' }],
      tools: [{ name: 'get', input_schema: { type: 'object', properties: {} } }],
    });
    assert.equal(translated.input_tokens, 77);
    const asked = up.seen.at(-1)!;
    assert.equal(asked.path, '/v1/responses/input_tokens');
    assert.equal(asked.headers.authorization, 'Bearer sk-provider');
    assert.deepEqual(asked.body, {
      model: 'gpt-upstream',
      input: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }],
      tools: [{ type: 'function', name: 'get', parameters: { type: 'object', properties: {} }, strict: false }],
    });
    // A compatible server without the count (vLLM, Ollama): an error, never a made-up 0.
    up.queue.push((_req, res) => json(res, 404, { detail: 'Not Found' }));
    await assert.rejects(anthropic.messages.countTokens({ model: 'gpt-r', messages: [{ role: 'user', content: 'hi' }] }),
      (err: InstanceType<typeof Anthropic.BadRequestError>) => err.status === 400 && /cannot count tokens/.test(err.message), 'never a made-up 0');
    // What the call's translation refuses, the count refuses the same way, before asking.
    const asks = up.seen.length;
    await assert.rejects(anthropic.messages.countTokens({ model: 'gpt-r', messages: [{ role: 'user', content: [{ type: 'search_result', source: 's', title: 't', content: [] }] }] } as never),
      (err: InstanceType<typeof Anthropic.BadRequestError>) => err.status === 400 && /no equivalent/.test(err.message));
    assert.equal(up.seen.length, asks);
    const entries = entriesOf(gw, 'acct_c').length;
    up.queue.push((_req, res) => json(res, 200, { input_tokens: 99 }));
    await anthropic.messages.countTokens({ model: 'claude-c', messages: [{ role: 'user', content: 'priced model' }] });
    assert.equal(entriesOf(gw, 'acct_c').length, entries, 'counting on a priced model is not billed');
  });

  test('responses.inputTokens.count: the mock counts as it meters; OpenAI-protocol providers are asked as they are; anthropic ones through the call\'s translation', async () => {
    const counted = await openai.responses.inputTokens.count({ model: 'echo-1', instructions: 'be brief', input: 'count these words' });
    assert.deepEqual(counted, { object: 'response.input_tokens', input_tokens: Math.ceil(('be brief'.length + 'count these words'.length) / 4) });
    up.queue.push((_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: 4321 }));
    const body = { model: 'gpt-r', previous_response_id: 'resp_1', input: [{ role: 'user' as const, content: 'go on' }], tools: [{ type: 'web_search' as const }] };
    assert.equal((await openai.responses.inputTokens.count(body)).input_tokens, 4321);
    let asked = up.seen.at(-1)!;
    assert.equal(asked.path, '/v1/responses/input_tokens');
    assert.deepEqual(asked.body, { ...body, model: 'gpt-upstream' }, 'passed through, the model swapped');
    // An Anthropic model: the Responses body as the call would send it, with count_tokens' fields only.
    up.queue.push((_req, res) => json(res, 200, { input_tokens: 55 }));
    const translated = await openai.responses.inputTokens.count({ model: 'claude-c', instructions: 'be brief', input: 'hi', max_output_tokens: 10 } as never);
    assert.deepEqual(translated, { object: 'response.input_tokens', input_tokens: 55 });
    asked = up.seen.at(-1)!;
    assert.equal(asked.path, '/v1/messages/count_tokens');
    assert.equal(asked.headers['x-api-key'], 'sk-provider');
    assert.deepEqual(asked.body, { model: 'claude-upstream', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], system: [{ type: 'text', text: 'be brief' }] });
    // What Anthropic cannot express is 400 in OpenAI's envelope, before asking.
    const seen = up.seen.length;
    await assert.rejects(openai.responses.inputTokens.count({ model: 'claude-c', previous_response_id: 'resp_1', input: 'x' }),
      (err: InstanceType<typeof OpenAI.BadRequestError>) => err.status === 400 && (err.error as { param?: string }).param === 'previous_response_id');
    assert.equal(up.seen.length, seen);
    // A translated count takes none of the client's headers (an OpenAI client's anthropic-beta would count what its calls will not be billed; found in review).
    up.queue.push((_req, res) => json(res, 200, { input_tokens: 5 }));
    await openai.responses.inputTokens.count({ model: 'claude-c', input: 'x' }, { headers: { 'anthropic-beta': 'context-1m-2025-08-07' } });
    assert.equal(up.seen.at(-1)!.headers['anthropic-beta'], undefined);
    assert.equal(up.seen.at(-1)!.headers['anthropic-version'], '2023-06-01');
    // A provider's answer without a believable count is an error, never a made-up figure, passed through or not (found in review: a compatible server's 200 page was relayed).
    for (const [model, answer] of [['claude-c', { input_tokens: -1 }], ['gpt-r', {}], ['gpt-r', '<html>hi</html>']] as const) {
      up.queue.push((_req, res) => (typeof answer === 'string' ? res.writeHead(200, { 'content-type': 'text/html' }).end(answer) : json(res, 200, answer)));
      await assert.rejects(openai.responses.inputTokens.count({ model, input: 'x' }), (err: InstanceType<typeof OpenAI.APIError>) => err.status === 502, `${model} ${JSON.stringify(answer)}`);
    }
    await assert.rejects(openai.responses.inputTokens.count({ model: 'echo-1', input: 7 } as never), (err: InstanceType<typeof OpenAI.BadRequestError>) => err.status === 400);
    const entries = entriesOf(gw, 'acct_c').length;
    up.queue.push((_req, res) => json(res, 200, { object: 'response.input_tokens', input_tokens: 9 }));
    await openai.responses.inputTokens.count({ model: 'gpt-r', input: 'priced model' });
    assert.equal(entriesOf(gw, 'acct_c').length, entries, 'counting on a priced model is not billed');
  });

  test('count_tokens has an RPM window of its own, which both counts share: a burst of counts never eats the model calls\' RPM', async () => {
    const counter = new Anthropic({ apiKey: 'sk-rpm', baseURL: gw.url, maxRetries: 0 });
    const openaiCounter = new OpenAI({ apiKey: 'sk-rpm', baseURL: `${gw.url}/v1`, maxRetries: 0 });
    // A count the model's translation refuses is refused before admission: it consumes nothing (found in review: each used up a count).
    for (let i = 0; i < 5; i++) {
      await assert.rejects(counter.messages.countTokens({ model: 'gpt-r', top_k: 3, messages: [{ role: 'user', content: 'x' }] } as never),
        (err: InstanceType<typeof Anthropic.BadRequestError>) => err.status === 400 && /top_k/.test(err.message));
    }
    for (let i = 0; i < 2; i++) await counter.messages.countTokens({ model: 'echo-1', messages: [{ role: 'user', content: 'x' }] });
    await openaiCounter.responses.inputTokens.count({ model: 'echo-1', input: 'x' });
    await assert.rejects(counter.messages.countTokens({ model: 'echo-1', messages: [{ role: 'user', content: 'x' }] }),
      (err: InstanceType<typeof Anthropic.RateLimitError>) => err.status === 429);
    await assert.rejects(openaiCounter.responses.inputTokens.count({ model: 'echo-1', input: 'x' }),
      (err: InstanceType<typeof OpenAI.RateLimitError>) => err.status === 429);
    for (let i = 0; i < 3; i++) {
      const m = await counter.messages.create({ model: 'echo-1', max_tokens: 10, messages: [{ role: 'user', content: 'call' }] });
      assert.equal((m.content[0] as { text: string }).text, 'call');
    }
  });

  test('one models list for both SDKs', async () => {
    const fromAnthropic: Array<{ id: string; display_name: string; type: string; created_at: string }> = [];
    for await (const model of anthropic.models.list()) fromAnthropic.push(model);
    assert.deepEqual(fromAnthropic.map((m) => m.id), ['claude-c', 'echo-1', 'gpt-r']);
    const echo = fromAnthropic.find((m) => m.id === 'echo-1')!;
    assert.equal(echo.display_name, 'Echo One');
    assert.equal(echo.type, 'model');
    assert.ok(!Number.isNaN(Date.parse(echo.created_at)));
    assert.equal((await anthropic.models.retrieve('gpt-r')).display_name, 'gpt-r');
    const fromOpenai: string[] = [];
    for await (const model of openai.models.list()) fromOpenai.push(model.id);
    assert.deepEqual(fromOpenai, ['claude-c', 'echo-1', 'gpt-r']);
    const raw = (await (await fetch(`${gw.url}/v1/models`, { headers: { authorization: 'Bearer sk-clients' } })).json()) as Record<string, unknown>;
    assert.deepEqual([raw.object, raw.has_more, raw.first_id, raw.last_id], ['list', false, 'claude-c', 'gpt-r']);
  });
});
