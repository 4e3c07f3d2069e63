import assert from 'node:assert/strict';
import { test } from 'node:test';
import { usageField as usageOfBytes } from '../../src/providers/usage-field.js';

/** The answer as the provider's bytes (UTF-8), which is what the gateway scans. */
const usageField = (text: string): unknown => usageOfBytes(Buffer.from(text, 'utf8'));
import { rng } from '../helpers/fake-clock.js';

const USAGE = { prompt_tokens: 12, completion_tokens: 9, total_tokens: 21, prompt_tokens_details: { cached_tokens: 4 } };

test('finds the top-level usage of OpenAI and Anthropic answers, whatever the text around it', () => {
  const tricky = 'he said "usage": {"prompt_tokens": 999} and {,"usage":{}} \\ \\" } {';
  const openai = { id: 'c', choices: [{ message: { role: 'assistant', content: tricky, tool_calls: [{ function: { arguments: '{"usage":{"x":1}}' } }] } }], usage: USAGE, system_fingerprint: 'fp' };
  assert.deepEqual(usageField(JSON.stringify(openai)), USAGE);
  assert.deepEqual(usageField(JSON.stringify(openai, null, 2)), USAGE, 'pretty-printed');
  const anthropic = {
    id: 'm', content: [{ type: 'tool_use', input: { usage: { input_tokens: 999 } } }, { type: 'text', text: tricky }],
    usage: { input_tokens: 5, output_tokens: 7, service_tier: 'standard {odd}' },
  };
  assert.deepEqual(usageField(JSON.stringify(anthropic)), anthropic.usage, 'a nested usage key before the top-level one is passed over');
});

test('undefined (so the whole answer is parsed) when there is no usage object', () => {
  for (const text of ['', 'not json', '{"usage":null}', '{"usage":5}', '{"a":"\\"usage\\":{\\"x\\":1}"}', '{"usage":{"a":1', '{"usage" {"a":1}}']) {
    assert.equal(usageField(text), undefined, text);
  }
});

test('agrees with JSON.parse on random answers', () => {
  const r = rng(11);
  const word = () => ['usage', '"usage":{', '\\', '"', '{', '}', ',', ' ', 'tokens', 'é', '\n'][Math.floor(r() * 11)]!;
  for (let i = 0; i < 2000; i++) {
    let content = '';
    for (let j = Math.floor(r() * 12); j > 0; j--) content += word();
    const usage = r() < 0.8 ? { prompt_tokens: Math.floor(r() * 1000), completion_tokens: Math.floor(r() * 1000), note: content } : undefined;
    const nested = r() < 0.5 ? { fake: content } : undefined;
    const usageLast = r() < 0.5; // OpenAI's and Anthropic's order; otherwise a nested usage may come after it
    const answer = usageLast
      ? JSON.stringify({ id: content, choices: [{ message: { content, usage: nested } }], usage, tail: content }, null, r() < 0.3 ? 1 : undefined)
      : JSON.stringify({ id: content, usage, choices: [{ message: { content, usage: nested } }] });
    const found = usageField(answer);
    const parsed = (JSON.parse(answer) as { usage?: unknown }).usage;
    // Never a wrong answer; undefined only sends the caller to a full parse.
    if (found !== undefined) assert.deepEqual(found, parsed, answer);
    else if (usageLast || nested === undefined) assert.equal(parsed, undefined, `missed the usage of ${answer}`);
  }
});
