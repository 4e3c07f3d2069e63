import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { after, before, beforeEach, describe, test } from 'node:test';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { FakeUpstream, type Behaviour } from '../helpers/fake-upstream.js';
import { chargeOf, entriesOf, leaveWhenSeen, startGateway, testConfig, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a reasoning model's reasoning is billed as output but never relayed, and an
 * abnormal end was charged the output relayed. A client that left at the first words (or asked
 * for an answer followed by padding, and left during the padding) was charged none of the
 * thousands of tokens the model had reasoned. A model with `reasoningTokensPerSecond` is now
 * charged at least that rate for the seconds since the provider had the request, within the
 * output the call reserved.
 */

const REASONING_MS = 400;
const RATE = 1000;

/** A Responses stream that reasons for REASONING_MS (nothing but its start event), then answers, and goes on. */
const reasoningStream = (open: ServerResponse[]): Behaviour => (_req, res) => {
  open.push(res);
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write(`event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_r', status: 'in_progress', usage: null } })}\n\n`);
  setTimeout(() => {
    if (!res.destroyed) res.write(`event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', sequence_number: 1, item_id: 'm', output_index: 0, content_index: 0, delta: 'Hello' })}\n\n`);
  }, REASONING_MS);
};

/** A chat stream that reasons for REASONING_MS (its headers only), then answers, and goes on. */
const reasoningChat = (open: ServerResponse[]): Behaviour => (_req, res) => {
  open.push(res);
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  setTimeout(() => {
    if (!res.destroyed) res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'Hello' }, finish_reason: null }] })}\n\n`);
  }, REASONING_MS);
};

/** A Messages stream that says nothing for REASONING_MS after message_start, then answers, and goes on. */
const slowMessages = (open: ServerResponse[]): Behaviour => (_req, res) => {
  open.push(res);
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write(`event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 10, output_tokens: 1 } } })}\n\n`);
  setTimeout(() => {
    if (!res.destroyed) res.write(`event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hello' } })}\n\n`);
  }, REASONING_MS);
};

describe('regression: a reasoning model\'s unseen output is charged when its call ends abnormally', () => {
  const up = new FakeUpstream();
  const open: ServerResponse[] = [];
  let gw: Running;

  before(async () => {
    const base = await up.start();
    const price = { inputPerMillion: 1, outputPerMillion: 8 };
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 1000, concurrency: 4, dailyCapUsd: 100 } },
      accounts: { acct_r: { plan: 'p' } },
      keys: { key_r: { account: 'acct_r', key: 'sk-r' } },
      models: {
        'o-think': { provider: 'oai', price, reasoningTokensPerSecond: RATE },
        'plain': { provider: 'oai', price },
        'claude-r': { provider: 'ant', price, reasoningTokensPerSecond: RATE },
      },
      providers: { oai: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 5000 }, ant: { protocol: 'anthropic', baseUrl: base, timeoutMs: 5000 } },
    }));
  });
  after(async () => {
    for (const res of open) res.destroy();
    await gw?.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
  });

  const last = (): LedgerEntry => entriesOf(gw, 'acct_r').at(-1)!;

  /** A streamed call left at its first words; its charge. */
  const leftAtFirstWords = (model: string, maxOutput: number, effort = 'high', path = '/v1/responses', body?: Record<string, unknown>): Promise<LedgerEntry> => {
    up.queue.push(path === '/v1/responses' ? reasoningStream(open) : slowMessages(open));
    return chargeOf(gw, 'acct_r', () => leaveWhenSeen(`${gw.url}${path}`, 'sk-r', body ?? { model, input: 'think hard', stream: true, max_output_tokens: maxOutput, reasoning: { effort } }, 'Hello'));
  };

  test('left at its first words after reasoning: charged the rate for the time it reasoned', async () => {
    const charge = await leftAtFirstWords('o-think', 50_000);
    assert.equal(charge.estimated, true);
    // 400 ms at 1,000 tokens a second: at least 400 (the run's own delays add a little).
    assert.ok(charge.outputTokens >= (REASONING_MS * RATE) / 1000 && charge.outputTokens < 5_000, String(charge.outputTokens));
  });

  test('never above the output the call reserved', async () => {
    const charge = await leftAtFirstWords('o-think', 100);
    assert.equal(charge.outputTokens, 100);
  });

  test('a call asking for minimal effort reasons little: charged the output relayed (found in review)', async () => {
    const charge = await leftAtFirstWords('o-think', 50_000, 'minimal');
    assert.equal(charge.outputTokens, 2);
  });

  test('a decoy effort in the other endpoint\'s field does not turn the charge off (found in review): a compatible server may read either', async () => {
    // A chat call whose `reasoning_effort` (the field chat servers read) is high, beside a Responses-style `reasoning.effort` of none.
    const body = { model: 'o-think', stream: true, max_completion_tokens: 50_000, messages: [{ role: 'user', content: 'think hard' }], reasoning_effort: 'high', reasoning: { effort: 'none' } };
    up.queue.push(reasoningChat(open));
    await chargeOf(gw, 'acct_r', () => leaveWhenSeen(`${gw.url}/v1/chat/completions`, 'sk-r', body, 'Hello'));
    assert.ok(last().outputTokens >= (REASONING_MS * RATE) / 1000, String(last().outputTokens));
    // A Responses call whose own `reasoning.effort` is high, beside a top-level `reasoning_effort` of none.
    const charge = await leftAtFirstWords('o-think', 50_000, '', '/v1/responses', { model: 'o-think', input: 'think hard', stream: true, max_output_tokens: 50_000, reasoning: { effort: 'high' }, reasoning_effort: 'none' });
    assert.ok(charge.outputTokens >= (REASONING_MS * RATE) / 1000, String(charge.outputTokens));
  });

  test('Claude reasons only with thinking on: a plain call is charged the output relayed, a thinking one the rate', async () => {
    const call = (extra: Record<string, unknown>) => ({ model: 'claude-r', max_tokens: 8_000, stream: true, messages: [{ role: 'user', content: 'hi' }], ...extra });
    const plain = await leftAtFirstWords('claude-r', 0, '', '/v1/messages', call({}));
    assert.equal(plain.outputTokens, 2);
    const thinking = await leftAtFirstWords('claude-r', 0, '', '/v1/messages', call({ thinking: { type: 'enabled', budget_tokens: 4_000 } }));
    assert.ok(thinking.outputTokens >= (REASONING_MS * RATE) / 1000 && thinking.outputTokens <= 8_000, String(thinking.outputTokens));
    // A `-thinking` id whose client turned thinking off sends it off: no reasoning (found in review).
    const off = await leftAtFirstWords('claude-r-thinking', 0, '', '/v1/messages', call({ model: 'claude-r-thinking', thinking: { type: 'disabled' } }));
    assert.equal(off.outputTokens, 2);
  });

  test('a chat effort on Claude is charged the rate, unless its translation left thinking off for a tool loop\'s step (review: charged reasoning it never did)', async () => {
    const body = (messages: unknown[]) => ({ model: 'claude-r', stream: true, max_tokens: 8_000, reasoning_effort: 'high', messages, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] });
    up.queue.push(slowMessages(open));
    const on = await chargeOf(gw, 'acct_r', () => leaveWhenSeen(`${gw.url}/v1/chat/completions`, 'sk-r', body([{ role: 'user', content: 'hi' }]), 'Hello'));
    assert.ok(on.outputTokens >= (REASONING_MS * RATE) / 1000, String(on.outputTokens));
    up.queue.push(slowMessages(open));
    const loop = [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'done' },
    ];
    const off = await chargeOf(gw, 'acct_r', () => leaveWhenSeen(`${gw.url}/v1/chat/completions`, 'sk-r', body(loop), 'Hello'));
    assert.ok(off.outputTokens < 10, String(off.outputTokens));
  });

  test('a model without reasoningTokensPerSecond is charged the output relayed, as before', async () => {
    const charge = await leftAtFirstWords('plain', 50_000);
    assert.equal(charge.outputTokens, 2, '"Hello": 5 characters');
  });
});
