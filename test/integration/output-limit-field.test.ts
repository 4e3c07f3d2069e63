import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';
import { FakeUpstream, json, openaiCompletion, openaiStream } from '../helpers/fake-upstream.js';
import { entriesOf, postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';

/**
 * An OpenAI-protocol provider's `outputLimitField`: servers such as Ollama and LM Studio read a
 * chat call's output limit only from `max_tokens`, so a call that sent only
 * `max_completion_tokens` (every Messages call translated for them: Claude Code's) was generated
 * without the limit it reserved by. With `"outputLimitField": "max_tokens"` the limit goes where
 * such a server reads it.
 */
describe('a provider that reads only max_tokens (outputLimitField)', () => {
  const up = new FakeUpstream();
  let gw: Running;

  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 4, dailyCapUsd: 10 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
      models: {
        'local-llm': { provider: 'ollama', upstreamModel: 'qwen3', price: { inputPerMillion: 1, outputPerMillion: 2 } },
        'gpt-x': { provider: 'oai', upstreamModel: 'gpt-upstream', price: { inputPerMillion: 1, outputPerMillion: 2 } },
        'either': {
          price: { inputPerMillion: 1, outputPerMillion: 2 },
          deployments: [{ provider: 'oai', upstreamModel: 'gpt-upstream' }, { provider: 'ollama', upstreamModel: 'qwen3', fallback: true }],
        },
      },
      providers: {
        ollama: { protocol: 'openai', baseUrl: `${base}/v1`, outputLimitField: 'max_tokens' },
        oai: { protocol: 'openai', baseUrl: `${base}/v1` },
      },
    }));
  });
  after(async () => {
    await gw?.close();
    await up.close();
  });
  beforeEach(() => {
    up.seen.length = 0;
    up.queue.length = 0;
  });

  const messagesCall = (model: string) => postJson(`${gw.url}/v1/messages`, 'sk-a', { model, max_tokens: 321, messages: [{ role: 'user', content: 'hi' }] });

  test('a translated Messages call (Claude Code\'s) sends its limit as max_tokens', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('hello')));
    const res = await messagesCall('local-llm');
    assert.equal(res.status, 200);
    await res.text();
    const sent = up.seen[0]!.body;
    assert.equal(sent.max_tokens, 321);
    assert.equal(sent.max_completion_tokens, undefined);
  });

  test('by default the limit goes as max_completion_tokens (OpenAI\'s reasoning models take no other)', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('hello')));
    const res = await messagesCall('gpt-x');
    await res.text();
    assert.equal(up.seen[0]!.body.max_completion_tokens, 321);
    assert.equal(up.seen[0]!.body.max_tokens, undefined);
  });

  test('a routed call sends each deployment the field its server reads', async () => {
    up.queue.push((_req, res) => json(res, 503, { error: { message: 'busy' } }), (_req, res) => json(res, 200, openaiCompletion('hello')));
    const res = await messagesCall('either');
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual(up.seen.map((s) => [s.body.model, s.body.max_completion_tokens, s.body.max_tokens]), [['gpt-upstream', 321, undefined], ['qwen3', undefined, 321]]);
  });

  test('a chat call passed on with only max_completion_tokens also gets max_tokens, its stream still metered', async () => {
    up.queue.push(openaiStream(['a', 'b'], { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', {
      model: 'local-llm', messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 50, stream: true,
    });
    assert.equal(res.status, 200);
    const text = await res.text();
    assert.doesNotMatch(text, /"usage":\{"prompt_tokens"/, 'the usage chunk the gateway asked for is not relayed');
    const sent = up.seen[0]!.body;
    assert.deepEqual([sent.model, sent.max_completion_tokens, sent.max_tokens, sent.stream_options], ['qwen3', 50, 50, { include_usage: true }]);
    assert.equal(entriesOf(gw, 'acct_a').at(-1)!.outputTokens, 2);
  });

  test('the limit is added to the text as it came (not re-serialised); a max_tokens of null is replaced', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('hello')), (_req, res) => json(res, 200, openaiCompletion('hello')));
    const text = '{"model":"local-llm", "messages":[{"role":"user","content":"hi"}], "max_completion_tokens":50}';
    await (await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', text)).text();
    assert.equal(up.seen[0]!.text, '{"max_tokens":50,"model":"qwen3", "messages":[{"role":"user","content":"hi"}], "max_completion_tokens":50}');
    await (await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'local-llm', messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 60, max_tokens: null })).text();
    assert.equal(up.seen[1]!.body.max_tokens, 60);
  });

  test('a chat call that sets max_tokens itself is passed on as it came', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('hello')));
    const text = '{"model":"local-llm","messages":[{"role":"user","content":"hi"}],"max_tokens":40}';
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', text);
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(up.seen[0]!.text, text.replace('"local-llm"', '"qwen3"'));
  });
});
