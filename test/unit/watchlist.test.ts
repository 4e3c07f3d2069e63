import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import { Watch, Watchlist } from '../../src/providers/watchlist.js';

test('watches fire in order after their duration unless removed or re-armed; one timer serves them all', () => {
  mock.timers.enable({ apis: ['setTimeout'] });
  try {
    let now = 0;
    const list = new Watchlist(100, () => now);
    const fired: string[] = [];
    const watch = (name: string) => new Watch(() => fired.push(name));
    const a = watch('a');
    const b = watch('b');
    const c = watch('c');
    list.arm(a);
    now = 30;
    list.arm(b);
    now = 60;
    list.arm(c);
    list.remove(b);
    list.remove(b); // twice is harmless
    now = 99;
    mock.timers.tick(99);
    assert.deepEqual(fired, []);
    now = 100;
    mock.timers.tick(1);
    assert.deepEqual(fired, ['a'], 'a at 100; b was removed');
    list.arm(a); // re-armed after firing: due at 200, after c
    now = 130;
    list.arm(c); // re-armed before firing: due at 230 now, not 160
    now = 160;
    mock.timers.tick(60);
    assert.deepEqual(fired, ['a']);
    now = 200;
    mock.timers.tick(40);
    assert.deepEqual(fired, ['a', 'a']);
    now = 230;
    mock.timers.tick(30);
    assert.deepEqual(fired, ['a', 'a', 'c']);
    // Empty, then used again: a new timer is armed.
    list.arm(b);
    now = 330;
    mock.timers.tick(100);
    assert.deepEqual(fired, ['a', 'a', 'c', 'b']);
  } finally {
    mock.timers.reset();
  }
});
