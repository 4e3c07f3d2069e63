import assert from 'node:assert/strict';
import { test } from 'node:test';
import { responses } from '../../src/protocols/responses/index.js';
import type { Usage } from '../../src/money.js';
import type { Exchange } from '../../src/providers/types.js';

/** A watcher over a recording exchange: only the two notes a watcher may make. */
function watcher() {
  const noted = { output: 0, usage: [] as Usage[] };
  const ex = { noteOutput: (n: number) => (noted.output += n), noteUsage: (u: Usage) => noted.usage.push(u) } as unknown as Exchange;
  return { w: responses.watch(ex), noted };
}

const ev = (type: string, fields: Record<string, unknown>, name: string | null = type) =>
  `${name === null ? '' : `event: ${name}\n`}data: ${JSON.stringify({ type, ...fields })}\n\n`;
const usage = { input_tokens: 120, input_tokens_details: { cached_tokens: 100 }, output_tokens: 9, output_tokens_details: { reasoning_tokens: 4 } };

test('Responses watcher: pass-through events are skipped by name, deltas counted, the final event held and metered', () => {
  const { w, noted } = watcher();
  const parse = JSON.parse;
  let parsed = 0;
  JSON.parse = (...args: Parameters<typeof parse>) => (parsed++, parse(...args));
  try {
    const big = { response: { instructions: 'i'.repeat(20_000), tools: [{ type: 'function', name: 'f' }] } };
    assert.deepEqual(w.see(ev('response.created', big)), { forward: true, final: false });
    assert.deepEqual(w.see(ev('response.in_progress', big)), { forward: true, final: false });
    assert.equal(parsed, 0, 'events with nothing to meter are passed by name, unparsed');
  } finally {
    JSON.parse = parse;
  }
  assert.deepEqual(w.see(ev('response.output_text.delta', { delta: 'Hello' })), { forward: true, final: false });
  assert.deepEqual(w.see(ev('response.function_call_arguments.delta', { delta: '{"a":1}' })), { forward: true, final: false });
  assert.deepEqual(w.see(ev('response.output_item.done', { item: { type: 'message', content: [{ text: 'x'.repeat(50) }] } })), { forward: true, final: false });
  assert.equal(noted.output, 12);
  assert.equal(w.usage(), null);
  assert.deepEqual(w.see(ev('response.completed', { response: { usage } })), { forward: true, final: true });
  const want = { inputTokens: 20, outputTokens: 9, cacheReadTokens: 100, cacheWriteTokens: 0, webSearches: 0 };
  assert.deepEqual(w.usage(), want);
  assert.deepEqual(noted.usage, [want]);
});

test('Responses watcher: an event without a name, or with one it does not know, is read from its data type', () => {
  for (const name of [null, 'message', 'response.completed ']) {
    const { w } = watcher();
    assert.deepEqual(w.see(ev('response.output_text.delta', { delta: 'abc' }, name)), { forward: true, final: false });
    assert.deepEqual(w.see(ev('response.incomplete', { response: { usage } }, name)), { forward: true, final: true }, `name ${name}`);
    assert.equal(w.usage()?.outputTokens, 9);
  }
  const { w } = watcher();
  assert.deepEqual(w.see('data: [DONE]\n\n'), { forward: true, final: false });
  assert.deepEqual(w.see(ev('response.failed', { response: { usage: { input_tokens: -1 } } })), { forward: true, final: true });
  assert.equal(w.usage(), null, 'unbelievable usage is no usage');
});
