import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { behindFakeProvider } from '../helpers/behind-fake.js';
import { anthropicMessage, json } from '../helpers/fake-upstream.js';
import { entriesOf, postJson } from '../helpers/gateway.js';

/**
 * Found in review: a provider's final usage was believed up to 10^9 of each count. Output was
 * taken down to the most any model generates, but 999,999,999 input and cache tokens made one
 * "hi" $7,050 of charge, and 999,999,999 web searches, for a call whose tool allowed one, about
 * $10,000,000. Input and cache together are now believed up to ten rounds of the largest
 * context window (100M tokens: a call's server-tool rounds each read it again), and searches up
 * to what the request's tools allow.
 */
describe('regression: usage past what any call can use is taken down to it', () => {
  const price = { inputPerMillion: 3, outputPerMillion: 15, cacheReadPerMillion: 0.3, cacheWritePerMillion: 3.75, webSearchPerThousand: 10 };
  const { up, gw } = behindFakeProvider((base) => ({
    plans: { p: { rpm: 1000, concurrency: 5, dailyCapUsd: 100_000 } },
    accounts: { acct_m: { plan: 'p' } },
    keys: { key_m: { account: 'acct_m', key: 'sk-m' } },
    models: { claude: { provider: 'ant', price } },
    providers: { ant: { protocol: 'anthropic', baseUrl: base } },
  }));
  const ask = async (usage: Record<string, unknown>, tools?: unknown[]) => {
    up.queue.push((_req, res) => json(res, 200, anthropicMessage('ok', usage as Record<string, number>)));
    const res = await postJson(`${gw().url}/v1/messages`, 'sk-m', { model: 'claude', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }], ...(tools ? { tools } : {}) });
    assert.equal(res.status, 200);
    await res.text();
    return entriesOf(gw(), 'acct_m').at(-1)!;
  };

  test('searches: at most the tools\' max_uses; without one (or without a tool), a thousand more than the searches reserved', async () => {
    const bounded = await ask({ input_tokens: 10, output_tokens: 5, server_tool_use: { web_search_requests: 999_999_999 } },
      [{ type: 'web_search_20250305', name: 'web_search', max_uses: 1 }]);
    assert.equal(bounded.amountMicro, -(30 + 75 + 10_000), 'one search, $0.01');
    const unbounded = await ask({ input_tokens: 10, output_tokens: 5, server_tool_use: { web_search_requests: 999_999_999 } },
      [{ type: 'web_search_20250305', name: 'web_search' }]);
    assert.equal(unbounded.amountMicro, -(30 + 75 + 1005 * 10_000), 'five reserved and a thousand more');
    const none = await ask({ input_tokens: 10, output_tokens: 5, server_tool_use: { web_search_requests: 999_999_999 } });
    assert.equal(none.amountMicro, -(30 + 75 + 1000 * 10_000), 'no search tool the gateway sees: a thousand');
    const honest = await ask({ input_tokens: 10, output_tokens: 5, server_tool_use: { web_search_requests: 3 } },
      [{ type: 'web_search_20250305', name: 'web_search', max_uses: 5 }]);
    assert.equal(honest.amountMicro, -(30 + 75 + 30_000), 'what the provider reports within the bound is charged');
  });

  test('input and cache tokens: at most 100,000,000 together (input first): ten rounds of the largest context window', async () => {
    const e = await ask({ input_tokens: 999_999_999, output_tokens: 5, cache_read_input_tokens: 999_999_999, cache_creation_input_tokens: 999_999_999 });
    assert.equal(e.inputTokens, 100_000_000);
    assert.equal(e.amountMicro, -(300_000_000 + 75));
    const cached = await ask({ input_tokens: 40_000_000, output_tokens: 5, cache_read_input_tokens: 999_999_999 });
    assert.equal(cached.inputTokens, 100_000_000);
    assert.equal(cached.amountMicro, -(120_000_000 + 18_000_000 + 75), '40M input and the 60M of cache reads left');
    const legitimate = await ask({ input_tokens: 2_000_000, output_tokens: 5, cache_read_input_tokens: 30_000_000 });
    assert.equal(legitimate.amountMicro, -(6_000_000 + 9_000_000 + 75), 'a long call\'s server-tool rounds, each reading its context again: charged whole');
  });
});
