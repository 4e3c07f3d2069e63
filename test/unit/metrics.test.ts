import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Metrics } from '../../src/metrics.js';

describe('metrics: spend', () => {
  test('is summed in micro-dollars and shown in dollars (found in review: summed as dollars, it drifted)', () => {
    const metrics = new Metrics({ inFlight: () => 0, limiterUp: () => true, ledgerUp: () => true, draining: () => false, logDropped: () => 0 });
    for (let i = 0; i < 10; i++) metrics.charge('m', 1, 1, 100_000);
    assert.match(metrics.render(), /^mg_spend_usd_total\{model="m"\} 1$/m);
  });
});
