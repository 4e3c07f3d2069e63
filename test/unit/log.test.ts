import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import { Logger } from '../../src/log.js';

test('access log lines: the time is the exact ISO instant within and across seconds; the path stays right as it changes', () => {
  mock.timers.enable({ apis: ['Date'], now: Date.UTC(2026, 10, 22, 23, 59, 58, 990) });
  try {
    const lines: string[] = [];
    const logger = new Logger((text) => lines.push(...text.trimEnd().split('\n')));
    const instants: number[] = [];
    // Steps of 1, 9, 90, 900 ms cross the 10 ms, 100 ms and second boundaries, and midnight.
    for (const step of [0, 1, 9, 90, 900, 1, 9, 90, 900, 0, 5]) {
      mock.timers.tick(step);
      instants.push(Date.now());
      logger.access('req_1', 'POST', step === 9 ? '/v1/models' : '/v1/chat/"x"', 200, 1.2345, null);
    }
    logger.flush();
    assert.equal(lines.length, instants.length);
    lines.forEach((line, i) => {
      const parsed = JSON.parse(line) as Record<string, unknown>;
      assert.equal(parsed.time, new Date(instants[i]!).toISOString());
      assert.equal(parsed.path, i === 2 || i === 6 ? '/v1/models' : '/v1/chat/"x"'); // the path changes and changes back
      assert.equal(parsed.ms, 1.235);
      assert.equal(parsed.account_id, null);
    });
  } finally {
    mock.timers.reset();
  }
});
