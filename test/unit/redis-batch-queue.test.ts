import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import { BatchQueue, type BatchOp } from '../../src/limiter/redis-batch.js';

/**
 * The batch queue's answers when a call fails without them: an op that asks (`late`) gets the
 * reply that came after the deadline, or undefined when none will come; never twice, and never
 * for an op that was answered in time. Timers are mocked: the deadline passes when the test says.
 */
describe('BatchQueue: answers that come late, or never', () => {
  beforeEach(() => mock.timers.enable({ apis: ['setTimeout', 'setImmediate'] }));
  afterEach(() => mock.timers.reset());

  /** A queue whose one call the test settles by hand, and what each op of it heard. */
  function setUp() {
    let settle: { resolve: (reply: unknown) => void; reject: (err: Error) => void } | null = null;
    const queue = new BatchQueue(() => new Promise((resolve, reject) => { settle = { resolve, reject }; }), 100, () => new Error('unavailable'), (m) => new Error(m));
    const heard: string[] = [];
    const op = (name: string, withLate: boolean): BatchOp => ({
      keys: [], args: ['a', name],
      resolve: (r) => heard.push(`${name} resolved ${String(r)}`),
      reject: (e) => heard.push(`${name} rejected ${e.message}`),
      ...(withLate ? { late: (r: unknown) => heard.push(`${name} late ${String(r)}`) } : {}),
    });
    queue.push('acct', () => ['k'], op('x', true));
    queue.push('acct', () => ['k'], op('y', false));
    mock.timers.tick(0); // the flush at setImmediate: the call is sent
    assert.ok(settle !== null, 'the call was sent');
    return { settle: settle as unknown as { resolve: (reply: unknown) => void; reject: (err: Error) => void }, heard };
  }
  const flushed = () => new Promise<void>((r) => queueMicrotask(r)).then(() => new Promise<void>((r) => queueMicrotask(r)));

  test('answered in time: delivered, and late is never called', async () => {
    const { settle, heard } = setUp();
    settle.resolve(['ok', 1]);
    await flushed();
    mock.timers.tick(1000);
    assert.deepEqual(heard, ['x resolved ok', 'y resolved 1']);
  });

  test('the deadline passes, then the reply comes: refused at the deadline, then late gets its own reply', async () => {
    const { settle, heard } = setUp();
    mock.timers.tick(100);
    assert.deepEqual(heard, ['x rejected unavailable', 'y rejected unavailable']);
    settle.resolve(['ok', 1]);
    await flushed();
    assert.deepEqual(heard.slice(2), ['x late ok']);
  });

  test('the deadline passes, then the connection is lost: late hears undefined, once', async () => {
    const { settle, heard } = setUp();
    mock.timers.tick(100);
    settle.reject(new Error('socket closed'));
    await flushed();
    assert.deepEqual(heard, ['x rejected unavailable', 'y rejected unavailable', 'x late undefined']);
  });

  test('the connection is lost before the deadline: refused, late hears undefined, and the deadline adds nothing', async () => {
    const { settle, heard } = setUp();
    settle.reject(new Error('socket closed'));
    await flushed();
    mock.timers.tick(1000);
    assert.deepEqual(heard, ['x rejected unavailable', 'y rejected unavailable', 'x late undefined']);
  });
});
