import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found: the reservation a call makes at admission ignored chat's `n` and counted only the
 * top-level text of the messages, so tool definitions, tool results, images and documents
 * were free to the estimate: a capped account could hold many expensive calls in flight.
 *
 * Each case below holds one call in flight (a mock with 400 ms of latency) whose reservation
 * should reach the account's $1 cap by itself; a second billable call must then be refused.
 */

describe('regression: reservations counted only text and one answer', () => {
  let gw: Running;
  before(async () => {
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 200_000 },
      plans: { capped: { rpm: 1000, concurrency: 10, dailyCapUsd: 1 } },
      accounts: { acct_c: { plan: 'capped' } },
      keys: { k_c: { account: 'acct_c', key: 'sk-c' } },
      models: {
        // $100 per million output tokens: 1,000 tokens x 10 answers = $1.
        'out-100': { provider: 'slow', price: { inputPerMillion: 0, outputPerMillion: 100 } },
        // $100 per million input tokens: 10,000 tokens = $1; $1,000: one image (1,600 tokens) = $1.60.
        'in-100': { provider: 'slow', price: { inputPerMillion: 100, outputPerMillion: 0 } },
        'in-1000': { provider: 'slow', price: { inputPerMillion: 1000, outputPerMillion: 0 } },
        cheap: { provider: 'slow', price: { inputPerMillion: 0.01, outputPerMillion: 0.01 } },
      },
      providers: { slow: { protocol: 'mock', latencyMs: 400 } },
    }));
  });
  after(() => gw.close());

  /** While `body` is in flight, a cheap billable call is refused by the cap; once it is over, admitted. */
  async function holdsTheCap(path: string, body: Record<string, unknown>): Promise<void> {
    const first = postJson(`${gw.url}${path}`, 'sk-c', body);
    await until(() => gw.gateway.inFlight === 1, 5000, 'the first call in flight');
    const second = await postJson(`${gw.url}/v1/chat/completions`, 'sk-c', { model: 'cheap', messages: [{ role: 'user', content: 'hi' }] });
    const code = ((await second.json()) as { error?: { code: string } }).error?.code;
    const answer = await first;
    await answer.text();
    assert.equal(answer.status, 200);
    assert.equal(code, 'daily_cap_exceeded', 'the first call\'s reservation reaches the cap');
    // Its real cost is tiny: once it settles, the cap has room again.
    const third = await postJson(`${gw.url}/v1/chat/completions`, 'sk-c', { model: 'cheap', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(third.status, 200);
    await third.text();
  }

  test('chat\'s n multiplies the output reserved', async () => {
    await holdsTheCap('/v1/chat/completions', { model: 'out-100', n: 10, max_tokens: 1000, messages: [{ role: 'user', content: 'hi' }] });
  });

  test('tool definitions count as input', async () => {
    const tools = [{ type: 'function', function: { name: 'lookup', description: 'd'.repeat(40_000), parameters: { type: 'object' } } }];
    await holdsTheCap('/v1/chat/completions', { model: 'in-100', max_tokens: 1, tools, messages: [{ role: 'user', content: 'hi' }] });
  });

  test('tool results count as input (Anthropic tool_result blocks)', async () => {
    await holdsTheCap('/v1/messages', {
      model: 'in-100', max_tokens: 1, messages: [
        { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'lookup', input: {} }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'r'.repeat(40_000) }] },
      ],
    });
  });

  test('an image counts a fixed 1,600 tokens, whatever its bytes', async () => {
    await holdsTheCap('/v1/chat/completions', {
      model: 'in-1000', max_tokens: 1,
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }] }],
    });
  });
});
