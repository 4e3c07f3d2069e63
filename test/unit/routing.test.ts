import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { RoutingConfig } from '../../src/config/types.js';
import type { Deployment, ModelEntry } from '../../src/directory.js';
import type { ErrorCode } from '../../src/errors.js';
import { Metrics } from '../../src/metrics.js';
import type { Exchange } from '../../src/providers/types.js';
import { chooseDeployment, type Choosable } from '../../src/routing/choose.js';
import { MemoryCooldowns } from '../../src/routing/cooldowns.js';
import { RoutedCall, type ServedExchange } from '../../src/routing/routed-call.js';
import { FakeClock, rng } from '../helpers/fake-clock.js';

const d = (weight: number, fallback = false): Choosable => ({ weight, fallback });
const none = (n: number) => new Array<number>(n).fill(0);

describe('chooseDeployment', () => {
  test('weights: each non-fallback deployment gets its share (seeded, 40 000 draws, within 2 %)', () => {
    const deployments = [d(3), d(1), d(6), d(5, true)];
    const random = rng(7);
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < 40_000; i++) counts[chooseDeployment(deployments, 0, none(4), 0, random)]!++;
    assert.equal(counts[3], 0, 'a fallback is never chosen while a primary is available');
    for (const [i, share] of [[0, 0.3], [1, 0.1], [2, 0.6]] as const) {
      assert.ok(Math.abs(counts[i]! / 40_000 - share) < 0.02, `deployment ${i}: ${counts[i]} of 40000, expected ${share}`);
    }
  });

  test('property: the choice is never a tried deployment, and is -1 only when every one was tried', () => {
    const random = rng(11);
    for (let round = 0; round < 2000; round++) {
      const n = 1 + Math.floor(random() * 6);
      const deployments = Array.from({ length: n }, (_, i) => d(0.5 + random() * 10, i > 0 && random() < 0.4));
      const tried = Math.floor(random() * (1 << n));
      const now = 1000;
      const cooling = Array.from({ length: n }, () => (random() < 0.5 ? 0 : now + Math.floor(random() * 5000) - 1000));
      const i = chooseDeployment(deployments, tried, cooling, now, random);
      if (tried === (1 << n) - 1) assert.equal(i, -1);
      else {
        assert.ok(i >= 0 && i < n && (tried & (1 << i)) === 0, `round ${round}: chose ${i} with tried ${tried.toString(2)}`);
        const free = (j: number) => (tried & (1 << j)) === 0 && cooling[j]! <= now;
        const primaryFree = deployments.some((x, j) => free(j) && !x.fallback);
        if (primaryFree) assert.ok(free(i) && !deployments[i]!.fallback, 'a free primary first');
        else if (deployments.some((_, j) => free(j))) {
          assert.equal(i, deployments.findIndex((_, j) => free(j)), 'then the first free fallback, in order');
        } else {
          const soonest = Math.min(...cooling.filter((_, j) => (tried & (1 << j)) === 0));
          assert.equal(cooling[i], soonest, 'then the one whose cooldown ends first');
        }
      }
    }
  });

  test('cooling deployments are skipped; fallbacks come in config order; all cooling: the soonest to end', () => {
    const deployments = [d(1), d(1), d(1, true), d(1, true)];
    const now = 10_000;
    assert.equal(chooseDeployment(deployments, 0, [now + 5, 0, 0, 0], now, () => 0), 1);
    assert.equal(chooseDeployment(deployments, 0b0010, [now + 5, 0, 0, 0], now, () => 0), 2, 'primary tried, other cooling: the first fallback');
    assert.equal(chooseDeployment(deployments, 0b0110, [now + 5, 0, 0, 0], now, () => 0), 3);
    assert.equal(chooseDeployment(deployments, 0, [now + 500, now + 200, now + 900, now + 300], now, () => 0), 1);
    assert.equal(chooseDeployment(deployments, 0b1111, none(4), now, () => 0), -1);
    assert.equal(chooseDeployment(deployments, 0, [now, now - 1, 0, 0], now, () => 0.99), 1, 'a cooldown that ended is no cooldown');
  });
});

describe('MemoryCooldowns', () => {
  test('a cooldown lasts its time; a later, longer one extends it; a shorter one keeps the longer', () => {
    const clock = new FakeClock();
    const cooldowns = new MemoryCooldowns(clock);
    assert.equal(cooldowns.until('m/a'), 0);
    assert.equal(cooldowns.active, 0);
    cooldowns.start('m/a', 5000);
    const first = clock.now() + 5000;
    assert.equal(cooldowns.until('m/a'), first);
    clock.advance(1000);
    cooldowns.start('m/a', 1000); // ends before the first: kept
    assert.equal(cooldowns.until('m/a'), first);
    cooldowns.start('m/a', 30_000); // ends after: extends
    assert.equal(cooldowns.until('m/a'), clock.now() + 30_000);
    assert.equal(cooldowns.until('m/b'), 0, 'one deployment cooling says nothing of another');
    clock.advance(30_000);
    assert.equal(cooldowns.until('m/a'), 0, 'expired');
    assert.equal(cooldowns.active, 0, 'and forgotten');
    cooldowns.start('m/c', 1000);
    cooldowns.start('other/d', 2000);
    assert.equal(cooldowns.active, 2);
    clock.advance(2000);
    assert.equal(cooldowns.active, 0, 'none left once the last one ends, even those never looked up again');
  });
});

/** A billed call as the routed one sees it: records what reaches the client. */
class FakeBilled implements ServedExchange {
  readonly endpoint = 'chat' as const;
  readonly body = {};
  readonly text = '{}';
  readonly stream = false;
  readonly requestId = 'req_1';
  readonly tenant = 'acct_1';
  readonly res = { headersSent: false } as never;
  readonly inputTokens = 1;
  readonly maxOutputTokens = 1;
  readonly maxAttempts = 3;
  aborted = false;
  delivered = false;
  failedWith: ErrorCode | null = null;
  constructor(public model: ModelEntry) {}
  serve(model: ModelEntry): void { this.model = model; }
  fail(code: ErrorCode): void { this.failedWith = code; }
  failWith(): void { this.failedWith = 'upstream_error'; }
  noteDelivered(delivered: boolean): void { this.delivered = delivered; }
  upstreamFailed(): void {}
  onAbort(): void {}
  head(): void {}
  clientEvent(event: string): string { return event; }
  write(): boolean { return true; }
  whenDrained(): void {}
  end(): void {}
  noteOutput(): void {}
  noteUsage(): void {}
  noteInputCount(_tokens: number, then: () => void): void { then(); }
  noteSent(): void {}
  noteUnreportedInput(): void {}
  observeUpstream(): void {}
  header(): undefined { return undefined; }
  settle(_u: unknown, then: () => void): void { then(); }
  cut(): void {}
  crash(): void {}
}

function deploymentsOf(...specs: Array<[provider: string, weight: number, fallback?: boolean]>): Deployment[] {
  return specs.map(([provider, weight, fallback = false]) => ({
    model: { id: 'm', baseId: 'm', provider: { id: provider } } as unknown as ModelEntry, weight, fallback, key: `m/${provider}`,
  }));
}

describe('RoutedCall (fake clock, fake providers)', () => {
  const routing: RoutingConfig = { maxAttempts: 3, cooldownMs: 5000 };
  const setup = (deployments: Deployment[], provider: (name: string, ex: Exchange) => void, config = routing) => {
    const clock = new FakeClock();
    const cooldowns = new MemoryCooldowns(clock);
    const metrics = new Metrics({ inFlight: () => 0, limiterUp: () => true, ledgerUp: () => true, draining: () => false, logDropped: () => 0 });
    const billed = new FakeBilled(deployments[0]!.model);
    const tried: string[] = [];
    const host = { clock, cooldowns, metrics, random: rng(3) };
    const start = () => new RoutedCall(billed, deployments, 0, config, host, (dep, _i, ex) => {
      tried.push(dep.model.provider.id);
      assert.equal(ex.maxAttempts, 1, 'a deployment gets one attempt: the next is another deployment');
      provider(dep.model.provider.id, ex);
    }).start();
    return { clock, cooldowns, metrics, billed, tried, start };
  };

  test('each failover trigger moves the call on and cools the deployment down; a 400 does not', () => {
    for (const kind of ['connection', 'timeout', '408', '429', '503', '529', '5xx']) {
      const r = setup(deploymentsOf(['a', 1], ['b', 1, true]), (name, ex) => {
        if (name === 'a') {
          ex.upstreamFailed(kind, null);
          ex.fail('upstream_error');
        }
      });
      r.start();
      assert.deepEqual(r.tried, ['a', 'b'], kind);
      assert.equal(r.billed.failedWith, null, `${kind}: the client sees b's answer, not a's failure`);
      assert.equal(r.billed.model.provider.id, 'b');
      assert.equal(r.cooldowns.until('m/a'), r.clock.now() + 5000, kind);
    }
    const r = setup(deploymentsOf(['a', 1], ['b', 1, true]), (_name, ex) => {
      ex.upstreamFailed('4xx', null);
      ex.failWith('upstream_400', { status: 400, type: 'invalid_request_error' } as never, 'bad');
    });
    r.start();
    assert.deepEqual(r.tried, ['a'], 'a 4xx is the client\'s');
    assert.equal(r.billed.failedWith, 'upstream_error');
    assert.equal(r.cooldowns.until('m/a'), 0, 'and starts no cooldown');
  });

  test('maxAttempts bounds the attempts; the last failure reaches the client; every failed deployment cools down', () => {
    const r = setup(deploymentsOf(['a', 1], ['b', 1], ['c', 1, true], ['d', 1, true]), (_name, ex) => {
      ex.upstreamFailed('503', null);
      ex.fail('upstream_overloaded');
    });
    r.start();
    assert.equal(r.tried.length, 3);
    assert.deepEqual(r.tried.slice(2), ['c'], 'fallbacks after the primaries, in order');
    assert.equal(r.billed.failedWith, 'upstream_overloaded');
    for (const p of r.tried) assert.ok(r.cooldowns.until(`m/${p}`) > r.clock.now(), `${p} cooling`);
    assert.equal(r.cooldowns.until('m/d'), 0);
    const text = r.metrics.render();
    assert.match(text, /^mg_failovers_total\{provider="a"\} 1$/m, 'each primary failed over once');
    assert.match(text, /^mg_failovers_total\{provider="b"\} 1$/m);
    assert.doesNotMatch(text, /mg_failovers_total\{provider="c"\}/, 'the last attempt has nowhere to fail over to');
    assert.match(text, /mg_cooldowns_total\{provider="c"\} 1/);
  });

  test('a Retry-After longer than cooldownMs sets the cooldown; a later call skips the deployment until it ends', () => {
    let fail = true;
    const r = setup(deploymentsOf(['a', 1000], ['b', 1]), (name, ex) => {
      if (name === 'a' && fail) {
        ex.upstreamFailed('429', 20_000);
        ex.fail('upstream_rate_limited');
      }
    });
    r.start();
    assert.equal(r.cooldowns.until('m/a'), r.clock.now() + 20_000);
    fail = false;
    r.tried.length = 0;
    r.start();
    assert.deepEqual(r.tried, ['b'], 'weight 1000 to 1, but a is cooling down');
    r.clock.advance(20_000);
    r.tried.length = 0;
    for (let i = 0; i < 20; i++) r.start();
    assert.ok(r.tried.filter((p) => p === 'a').length >= 18, 'the cooldown ended: a takes its share again');
  });

  test('no failover once the answer has begun, or when the client has gone', () => {
    const r = setup(deploymentsOf(['a', 1], ['b', 1]), (_name, ex) => {
      (r.billed.res as { headersSent: boolean }).headersSent = true;
      ex.upstreamFailed('5xx', null);
      ex.fail('upstream_error');
    });
    r.start();
    assert.equal(r.tried.length, 1);
    assert.equal(r.billed.failedWith, 'upstream_error');
    const gone = setup(deploymentsOf(['a', 1], ['b', 1]), (_name, ex) => {
      gone.billed.aborted = true;
      ex.upstreamFailed('connection', null);
      ex.fail('upstream_error');
    });
    gone.start();
    assert.equal(gone.tried.length, 1);
  });

  test('a provider that had the request keeps the call billable after a failover (it may bill the gateway)', () => {
    // The first attempt times out after the provider had the request; the second is refused.
    const r = setup(deploymentsOf(['a', 1], ['b', 1]), (_name, ex) => {
      if (r.tried.length === 1) {
        ex.noteDelivered(true);
        ex.upstreamFailed('timeout', null);
        ex.fail('upstream_timeout');
      } else {
        ex.noteDelivered(false);
        ex.upstreamFailed('connection', null);
        ex.fail('upstream_error');
      }
    });
    r.start();
    assert.equal(r.tried.length, 2);
    assert.equal(r.billed.delivered, true, 'the refusal on the second does not make the first free');
  });
});
