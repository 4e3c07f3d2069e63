import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ItemMemory } from '../../src/translate/item-memory.js';

const message = (id: string, text = 'hello') => ({ type: 'message', id, status: 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] });

describe('ItemMemory: items of translated Responses answers, referred to by later calls', () => {
  test('resolves an account\'s own references (item_reference, or an id alone), and no other account\'s', () => {
    const memory = new ItemMemory(() => 0);
    memory.remember('acct_a', [message('msg_1'), { type: 'function_call', id: 'fc_1', call_id: 'c', name: 'f', arguments: '{}' }, { type: 'reasoning', id: 'rs_1', summary: [] }]);
    const input = [{ role: 'user', content: 'hi' }, { type: 'item_reference', id: 'msg_1' }, { id: 'rs_1' }, { type: 'item_reference', id: 'fc_1' }];
    assert.deepEqual(memory.resolve('acct_a', input), [input[0], message('msg_1'), { type: 'reasoning', id: 'rs_1', summary: [] }, input[3]],
      'messages and reasoning are kept; function calls are sent whole by clients');
    assert.equal(memory.resolve('acct_b', input), input, 'another account\'s ids are unknown: the same input');
    assert.equal(memory.resolve('acct_a', 'a string'), 'a string');
  });

  test('keeps at most maxBytes, the least recently used dropped first', () => {
    const memory = new ItemMemory(() => 0, 1000);
    memory.remember('a', [message('m1', 'x'.repeat(300))]);
    memory.remember('a', [message('m2', 'x'.repeat(300))]);
    assert.ok(memory.recall('a', 'm1'), 'm1 used: m2 is now the oldest');
    memory.remember('a', [message('m3', 'x'.repeat(300))]);
    assert.equal(memory.recall('a', 'm2'), undefined);
    assert.ok(memory.recall('a', 'm1'));
    assert.ok(memory.recall('a', 'm3'));
    memory.remember('a', [message('huge', 'x'.repeat(2000))]);
    assert.equal(memory.recall('a', 'huge'), undefined, 'an item larger than the whole memory is not kept');
    assert.ok(memory.recall('a', 'm3'), 'and drops nothing');
  });

  test('forgets an item after ttlMs', () => {
    let now = 0;
    const memory = new ItemMemory(() => now, 1 << 20, 1000);
    memory.remember('a', [message('m1')]);
    now = 1000;
    assert.ok(memory.recall('a', 'm1'));
    now = 2001;
    assert.equal(memory.recall('a', 'm1'), undefined);
  });
});
