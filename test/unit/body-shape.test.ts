import assert from 'node:assert/strict';
import { test } from 'node:test';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { bodyShapeProblem, MAX_CONTAINERS, MAX_KEYS, MAX_VALUES } from '../../src/http/body-shape.js';

/**
 * Found in review: JSON.parse of 4 MB of nested brackets took over half a second, before any
 * limit could refuse the key. A large body past the bounds is refused unparsed, quickly; real
 * bodies (text, however long) pass.
 */
const timed = (body: string) => {
  const buffer = Buffer.from(body);
  const started = performance.now();
  const problem = bodyShapeProblem(buffer);
  return { problem, ms: performance.now() - started };
};

test('a large body of many small arrays or objects, or of many keys, or too deep, is refused quickly', () => {
  const one = '['.repeat(120) + ']'.repeat(120);
  const arrays = `{"model":"m","messages":[{"role":"user","content":[${Array.from({ length: 16_000 }, () => one).join(',')}]}]}`;
  const refused = timed(arrays);
  assert.match(refused.problem ?? '', /more than 100000 objects and arrays/);
  assert.ok(refused.ms < 250, `${refused.ms.toFixed(1)} ms for ${arrays.length} bytes`);
  const keys = `{"model":"m","x":{${Array.from({ length: MAX_KEYS + 1 }, (_, i) => `"k${i}":0`).join(',')}}}`;
  assert.match(timed(keys).problem ?? '', /more than 50000 keys/);
  const numbers = `{"model":"m","input":[${Array.from({ length: MAX_VALUES + 2 }, () => '7').join(',')}]}`;
  assert.match(timed(numbers).problem ?? '', /more than 500000 values/);
  assert.equal(timed(`{"model":"m","input":[${Array.from({ length: 300_000 }, () => '7').join(',')}]}`).problem, null, 'an embeddings request of 300,000 token ids passes');
  // As the estimate counts it (which refuses the same bodies once parsed): the body itself, then 127 levels in it.
  const nested = (levels: number) => ({ model: 'm', x: JSON.parse(`${'['.repeat(levels)}${']'.repeat(levels)}`) as unknown, pad: 'p'.repeat(70_000) });
  assert.match(timed(JSON.stringify(nested(128))).problem ?? '', /deeper than 128/);
  assert.equal(estimateInputTokens(nested(128)), null);
  assert.equal(timed(JSON.stringify(nested(127))).problem, null, '127 levels in the body pass');
  assert.notEqual(estimateInputTokens(nested(127)), null);
  assert.equal(timed(`{"x":[${Array.from({ length: MAX_CONTAINERS - 2 }, () => '{}').join(',')}]}`).problem, null, 'the bound itself passes (the body and its array count)');
});

test('brackets, colons and escaped quotes inside strings are not structure; a small body is never scanned; real text passes fast', () => {
  const tricky = `{"model":"m","messages":[{"role":"user","content":"${'[{:\\\\\\"'.repeat(20_000)}"}]}`;
  assert.doesNotThrow(() => JSON.parse(tricky));
  assert.equal(timed(tricky).problem, null);
  assert.equal(timed(`{"x":${'['.repeat(200)}${']'.repeat(200)}}`).problem, null, 'small: left to the parser and the estimate\'s own depth check');
  const text = JSON.stringify({ model: 'm', messages: Array.from({ length: 2000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `turn ${i} ${'lorem ipsum '.repeat(170)}` })) });
  const real = timed(text);
  assert.equal(real.problem, null);
  assert.ok(text.length > 4_000_000 && real.ms < 250, `${real.ms.toFixed(1)} ms for ${text.length} bytes`);
});
