import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { anthropicMessage, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { behindFakeProvider } from '../helpers/behind-fake.js';
import { postJson, until } from '../helpers/gateway.js';

/**
 * Found in review of what the gateway checks against what a compatible server reads from the
 * same bytes. Ollama decodes with Go's encoding/json, which matches keys ignoring case (Unicode
 * folds included), so `"Model"` or `"MAX_TOKENS"` beside the checked field picked the model or
 * the output limit there; llama.cpp's `n_predict` wins over `max_tokens` (-1: no limit); and of
 * `max_completion_tokens` and `max_tokens` the gateway reserved the first while Ollama reads
 * only the second.
 */
describe('regression: fields a compatible server reads that the gateway did not check', () => {
  const { up, gw } = behindFakeProvider((base) => ({
    plans: { p: { rpm: 1000, concurrency: 5, dailyCapUsd: 1 } },
    accounts: { acct_d: { plan: 'p' } },
    keys: { key_d: { account: 'acct_d', key: 'sk-d' } },
    models: {
      // $10 per million output tokens: 128,000 of them ($1.28) are more than the $1 cap.
      cheap: { provider: 'compat', price: { inputPerMillion: 1, outputPerMillion: 10 }, outputTokenLimit: 200_000 },
      claude: { provider: 'ant', price: { inputPerMillion: 1, outputPerMillion: 10 } },
    },
    providers: { compat: { protocol: 'openai', baseUrl: base }, ant: { protocol: 'anthropic', baseUrl: base } },
  }));

  const messages = [{ role: 'user', content: 'hi' }];
  const cases: Array<[string, string, Record<string, unknown>, string]> = [
    ['chat', '/v1/chat/completions', { model: 'cheap', messages, max_tokens: 16, Model: 'llama3.1:405b' }, 'Model'],
    ['chat', '/v1/chat/completions', { model: 'cheap', messages, max_tokens: 1, MAX_TOKENS: 128_000 }, 'MAX_TOKENS'],
    // The Kelvin sign folds to k in Go: this is max_tokens there.
    ['chat', '/v1/chat/completions', { model: 'cheap', messages, max_tokens: 1, 'max_to\u212Aens': 128_000 }, 'max_to\u212Aens'],
    ['chat', '/v1/chat/completions', { model: 'cheap', messages, max_tokens: 16, n_predict: -1 }, 'n_predict'],
    ['chat', '/v1/chat/completions', { model: 'cheap', messages, max_tokens: 16, 'max-tokens': 128_000 }, 'max-tokens'],
    ['responses', '/v1/responses', { model: 'cheap', input: 'hi', max_output_tokens: 16, Max_Output_Tokens: 128_000 }, 'Max_Output_Tokens'],
    ['messages', '/v1/messages', { model: 'claude', messages, max_tokens: 16, Max_Tokens: 128_000 }, 'Max_Tokens'],
    ['embeddings', '/v1/embeddings', { model: 'cheap', input: 'hi', MODEL: 'other' }, 'MODEL'],
  ];
  for (const [endpoint, path, body, param] of cases) {
    test(`${endpoint}: ${JSON.stringify(param)} beside the checked fields is 400 naming it, never sent`, async () => {
      const hits = up.hits;
      const res = await postJson(`${gw().url}${path}`, 'sk-d', body);
      const err = (await res.json()) as { error: { type: string; param?: string; message: string } };
      assert.equal(res.status, 400, JSON.stringify(err));
      assert.equal(err.error.param, param);
      assert.equal(up.hits, hits, 'never sent upstream');
    });
  }

  test('chat with max_completion_tokens 1 and max_tokens 128,000 reserves the larger: while it runs, the $1 cap has nothing left', async () => {
    let release: (() => void) | null = null;
    up.queue.push((_req, res) => {
      release = () => json(res, 200, openaiCompletion('ok', { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 }));
    });
    const running = postJson(`${gw().url}/v1/chat/completions`, 'sk-d', { model: 'cheap', messages, max_completion_tokens: 1, max_tokens: 128_000 });
    await until(() => release !== null, 5000, 'the call upstream');
    const hits = up.hits;
    const next = await postJson(`${gw().url}/v1/chat/completions`, 'sk-d', { model: 'cheap', messages, max_tokens: 1 });
    const err = (await next.json()) as { error: { code: string } };
    assert.equal(next.status, 402, JSON.stringify(err));
    assert.equal(err.error.code, 'daily_cap_exceeded');
    assert.equal(up.hits, hits, 'never sent upstream');
    release!();
    const done = await running;
    assert.equal(done.status, 200);
    await done.text();
  });

  test('translated to Anthropic, a chat call with both limits sends the first (max_completion_tokens), not the larger it reserves', async () => {
    up.queue.push((_req, res) => json(res, 200, anthropicMessage('ok', { input_tokens: 1, output_tokens: 1 })));
    const res = await postJson(`${gw().url}/v1/chat/completions`, 'sk-d', { model: 'claude', messages, max_completion_tokens: 100, max_tokens: 4000 });
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(up.seen.at(-1)!.body.max_tokens, 100);
  });
});
