import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ItemMemory } from '../../src/translate/item-memory.js';

const message = (id: string, text = 'hello') => ({ type: 'message', id, status: 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] });
const ref = (id: string) => ({ type: 'item_reference', id });
const BUDGET = 1 << 20;
/** Whether `id` is kept for `key` (resolving it, which makes it the most recently used). */
const kept = (memory: ItemMemory, key: string, id: string) => (memory.resolve(key, [ref(id)], BUDGET) as unknown[])[0] !== undefined
  && ((memory.resolve(key, [ref(id)], BUDGET) as Array<Record<string, unknown>>)[0]!.type !== 'item_reference');

describe('ItemMemory: items of translated Responses answers, referred to by later calls', () => {
  test('resolves a key\'s own references (item_reference, or an id alone), and no other key\'s', () => {
    const memory = new ItemMemory(() => 0);
    memory.remember('key_a', [message('msg_1'), { type: 'function_call', id: 'fc_1', call_id: 'c', name: 'f', arguments: '{}' }, { type: 'reasoning', id: 'rs_1', summary: [] }]);
    const input = [{ role: 'user', content: 'hi' }, ref('msg_1'), { id: 'rs_1' }, ref('fc_1')];
    assert.deepEqual(memory.resolve('key_a', input, BUDGET), [input[0], message('msg_1'), { type: 'reasoning', id: 'rs_1', summary: [] }, input[3]],
      'messages and reasoning are kept; function calls are sent whole by clients');
    assert.equal(memory.resolve('key_b', input, BUDGET), input, 'another key\'s ids are unknown (found in review): the same input');
    assert.equal(memory.resolve('key_a', 'a string', BUDGET), 'a string');
  });

  test('puts each item back once, and no more than the budget (found in review: 2,000 references to one large answer built a 400 MB request)', () => {
    const memory = new ItemMemory(() => 0);
    memory.remember('k', [message('big', 'x'.repeat(10_000)), message('small')]);
    const out = memory.resolve('k', [ref('big'), ref('big'), ref('small')], BUDGET) as Array<Record<string, unknown>>;
    assert.deepEqual(out.map((i) => i.type), ['message', 'item_reference', 'message']);
    const tight = memory.resolve('k', [ref('big'), ref('small')], 1000) as Array<Record<string, unknown>>;
    assert.deepEqual(tight.map((i) => i.type), ['item_reference', 'message'], 'past the budget a reference stays (and is refused)');
  });

  test('keeps at most maxBytesPerKey per key and maxBytes in all, the least recently used first out', () => {
    const memory = new ItemMemory(() => 0, 7000, 3500);
    memory.remember('a', [message('a1', 'x'.repeat(500))]);
    memory.remember('a', [message('a2', 'x'.repeat(500))]);
    assert.ok(kept(memory, 'a', 'a1'), 'a1 used: a2 is now the oldest of a');
    memory.remember('a', [message('a3', 'x'.repeat(500))]);
    assert.ok(!kept(memory, 'a', 'a2'), 'a over its share: its least recently used went');
    assert.ok(kept(memory, 'a', 'a1') && kept(memory, 'a', 'a3'));
    // Other keys fill the whole: the least recently used key loses its items first.
    memory.remember('b', [message('b1', 'x'.repeat(500)), message('b2', 'x'.repeat(500))]);
    memory.remember('c', [message('c1', 'x'.repeat(500)), message('c2', 'x'.repeat(500))]);
    assert.ok(!kept(memory, 'a', 'a1'), 'a, used least recently, went first');
    assert.ok(kept(memory, 'c', 'c2'));
    memory.remember('a', [message('huge', 'x'.repeat(5000))]);
    assert.ok(!kept(memory, 'a', 'huge'), 'an item larger than a key\'s share is not kept');
  });

  test('forgets an item after ttlMs', () => {
    let now = 0;
    const memory = new ItemMemory(() => now, 1 << 20, 1 << 20, 1000);
    memory.remember('a', [message('m1')]);
    now = 1000;
    assert.ok(kept(memory, 'a', 'm1'));
    now = 2001;
    assert.ok(!kept(memory, 'a', 'm1'));
  });
});
