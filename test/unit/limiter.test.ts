import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DAY_MS } from '../../src/clock.js';
import { MemoryLimiter } from '../../src/limiter/memory.js';
import type { AccountLimits, Decision, KeyLimits, Ticket } from '../../src/limiter/types.js';
import { SlidingWindow, WINDOW_MS } from '../../src/limiter/window.js';
import { FakeClock, rng } from '../helpers/fake-clock.js';

const account = (over: Partial<AccountLimits> = {}): AccountLimits => ({
  id: 'acct', rpm: null, concurrency: null, dailyCapMicro: null, prepaid: false, ...over,
});
const NO_KEY_LIMITS: KeyLimits = { id: 'key', rpm: null, concurrency: null };

function ticket(d: Decision): Ticket {
  assert.equal(d.ok, true, `expected admission, got ${JSON.stringify(d)}`);
  return d as Ticket;
}

function rejected(d: { ok: boolean }, reason: string): void {
  assert.equal(d.ok, false);
  assert.equal((d as unknown as { reason: string }).reason, reason);
}

describe('SlidingWindow', () => {
  test('admits up to the limit, then waits exactly until the oldest admission leaves', () => {
    const w = new SlidingWindow();
    w.record(1000); w.record(2000); w.record(3000);
    assert.equal(w.waitMs(3000, 4), 0);
    assert.equal(w.waitMs(3000, 3), 1000 + WINDOW_MS - 3000);
    assert.equal(w.waitMs(1000 + WINDOW_MS - 1, 3), 1);
    assert.equal(w.waitMs(1000 + WINDOW_MS, 3), 0);
  });

  test('limit 0 never admits', () => {
    assert.equal(new SlidingWindow().waitMs(0, 0), WINDOW_MS);
  });

  test('a lowered limit waits until enough of the oldest admissions have left; a raised one admits the difference', () => {
    const w = new SlidingWindow();
    for (const t of [1, 2, 3, 4]) w.record(t);
    assert.equal(w.waitMs(10, 2), 3 + WINDOW_MS - 10, 'two must leave: the wait ends when the third oldest does');
    assert.equal(w.waitMs(10, 6), 0);
    w.record(5); w.record(6);
    assert.equal(w.waitMs(10, 6), 1 + WINDOW_MS - 10);
  });

  test('admissions in one millisecond share one pair; the wait counts them all', () => {
    const w = new SlidingWindow();
    for (let i = 0; i < 5; i++) w.record(100);
    w.record(200);
    assert.equal(w.pairs, 2);
    assert.equal(w.count(300), 6);
    assert.equal(w.waitMs(300, 6), 100 + WINDOW_MS - 300);
    assert.equal(w.waitMs(300, 2), 100 + WINDOW_MS - 300, 'five must leave: all of them leave at 100 + 60 s');
    assert.equal(w.waitMs(300, 1), 200 + WINDOW_MS - 300, 'all six must leave');
    assert.equal(w.waitMs(100 + WINDOW_MS, 2), 0);
  });

  test('memory follows use, not the limit: at most one pair per millisecond, shrinking when the window empties', () => {
    const w = new SlidingWindow();
    const empty = w.bytes;
    for (let i = 0; i < 100_000; i++) w.record(5000); // a billion-rpm plan's burst in one millisecond
    assert.equal(w.pairs, 1);
    assert.equal(w.bytes, empty);
    for (let t = 5001; t < 5000 + WINDOW_MS; t++) w.record(t);
    assert.equal(w.pairs, WINDOW_MS);
    assert.ok(w.bytes <= 65_536 * 12, `${w.bytes} bytes`);
    assert.equal(w.count(5000 + WINDOW_MS), WINDOW_MS - 1);
    assert.equal(w.count(5000 + 2 * WINDOW_MS), 0);
    assert.equal(w.bytes, empty, 'the ring shrinks back as it empties');
  });

  test('a clock that steps back keeps the order (the admission leaves a little later, never sooner)', () => {
    const w = new SlidingWindow();
    w.record(10_000);
    w.record(9_000);
    assert.equal(w.pairs, 1);
    assert.equal(w.waitMs(10_000, 2), 10_000 + WINDOW_MS - 10_000);
  });

  test('idle once the newest admission has left the window', () => {
    const w = new SlidingWindow();
    assert.equal(w.idle(0), true);
    w.record(100);
    assert.equal(w.idle(100 + WINDOW_MS - 1), false);
    assert.equal(w.idle(100 + WINDOW_MS), true);
  });
});

describe('MemoryLimiter', () => {
  test('RPM: the (rpm+1)th request in 60 s is refused with the honest wait, and nothing is consumed', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    const a = account({ rpm: 3 });
    const start = clock.now();
    for (let i = 0; i < 3; i++) {
      assert.equal(lim.admitInstant(a, NO_KEY_LIMITS, null).ok, true);
      clock.advance(10_000);
    }
    const d = lim.admitInstant(a, NO_KEY_LIMITS, null);
    rejected(d, 'rate_limit_exceeded');
    assert.equal((d as { retryAfterMs: number }).retryAfterMs, start + WINDOW_MS - clock.now());
    clock.advance(start + WINDOW_MS - clock.now() - 1);
    rejected(lim.admitInstant(a, NO_KEY_LIMITS, null), 'rate_limit_exceeded');
    clock.advance(1);
    assert.equal(lim.admitInstant(a, NO_KEY_LIMITS, null).ok, true);
  });

  test('concurrency: slots are held until release, and a rejection holds nothing', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    const a = account({ concurrency: 2 });
    const t1 = ticket(lim.admit(a, NO_KEY_LIMITS, null, null));
    const t2 = ticket(lim.admit(a, NO_KEY_LIMITS, null, null));
    const d = lim.admit(a, NO_KEY_LIMITS, null, null);
    rejected(d, 'concurrency_limit_exceeded');
    assert.equal((d as { retryAfterMs: number }).retryAfterMs, 1000);
    rejected(lim.admitInstant(a, NO_KEY_LIMITS, null), 'concurrency_limit_exceeded');
    lim.release(t1);
    lim.release(t1); // releasing twice gives back one slot only
    ticket(lim.admit(a, NO_KEY_LIMITS, null, null));
    rejected(lim.admit(a, NO_KEY_LIMITS, null, null), 'concurrency_limit_exceeded');
    lim.release(t2);
    assert.equal(lim.snapshot(a).inFlight, 1);
  });

  test('per-key limits count in addition to the account limits; the longest RPM wait wins', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    const a = account({ rpm: 10, concurrency: 10 });
    const k1: KeyLimits = { id: 'k1', rpm: 2, concurrency: 1 };
    const k2: KeyLimits = { id: 'k2', rpm: null, concurrency: null };
    const t = ticket(lim.admit(a, k1, null, null));
    rejected(lim.admit(a, k1, null, null), 'concurrency_limit_exceeded');
    lim.release(t);
    clock.advance(1000);
    ticket(lim.admit(a, k1, null, null));
    clock.advance(1000);
    const d = lim.admitInstant(a, k1, null);
    rejected(d, 'rate_limit_exceeded');
    assert.equal((d as { retryAfterMs: number }).retryAfterMs, WINDOW_MS - 2000);
    // The other key of the account is not limited by k1's window.
    for (let i = 0; i < 8; i++) assert.equal(lim.admitInstant(a, k2, null).ok, true);
    rejected(lim.admitInstant(a, k2, null), 'rate_limit_exceeded');
  });

  test('idempotency keys are per account, held while executing, free again afterwards', () => {
    const lim = new MemoryLimiter(new FakeClock());
    const a = account();
    const b = account({ id: 'other' });
    const t = ticket(lim.admit(a, NO_KEY_LIMITS, 'idem-1', null));
    rejected(lim.admit(a, NO_KEY_LIMITS, 'idem-1', null), 'idempotency_conflict');
    rejected(lim.admitInstant(a, NO_KEY_LIMITS, 'idem-1'), 'idempotency_conflict');
    ticket(lim.admit(b, NO_KEY_LIMITS, 'idem-1', null)); // another account: no conflict
    ticket(lim.admit(a, NO_KEY_LIMITS, 'idem-2', null));
    lim.release(t);
    ticket(lim.admit(a, NO_KEY_LIMITS, 'idem-1', null));
  });

  test('checks run in the contract order: idempotency, cap, balance, RPM, concurrency', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    const a = account({ rpm: 1, concurrency: 1, dailyCapMicro: 100, prepaid: true });
    lim.credit('acct', 50, 'c1');
    const t = ticket(lim.admit(a, NO_KEY_LIMITS, 'x', 10));
    // Everything is exhausted now except money; the idempotency conflict answers first.
    rejected(lim.admit(a, NO_KEY_LIMITS, 'x', 10), 'idempotency_conflict');
    rejected(lim.admit(a, NO_KEY_LIMITS, 'y', 10), 'rate_limit_exceeded');
    clock.advance(WINDOW_MS);
    rejected(lim.admit(a, NO_KEY_LIMITS, 'y', 10), 'concurrency_limit_exceeded');
    lim.settle(t, 50); // balance 0, spend 50
    rejected(lim.admit(a, NO_KEY_LIMITS, 'y', 10), 'insufficient_balance');
    lim.credit('acct', 100, 'c2');
    lim.release(t);
    const t2 = ticket(lim.admit(a, NO_KEY_LIMITS, 'y', 10));
    lim.settle(t2, 50);
    lim.release(t2);
    rejected(lim.admit(a, NO_KEY_LIMITS, 'y', 10), 'daily_cap_exceeded');
  });

  test('daily cap: reserve then settle, "reached" not predicted, reset at 00:00 UTC', () => {
    const clock = new FakeClock(Date.UTC(2026, 0, 15, 23, 59, 0));
    const lim = new MemoryLimiter(clock);
    const a = account({ dailyCapMicro: 1000 });
    const t1 = ticket(lim.admit(a, NO_KEY_LIMITS, null, 600));
    const t2 = ticket(lim.admit(a, NO_KEY_LIMITS, null, 600)); // 600 < 1000: admitted, own estimate not added
    const d = lim.admit(a, NO_KEY_LIMITS, null, 1); // 1200 >= 1000
    rejected(d, 'daily_cap_exceeded');
    assert.equal((d as { resetsAtMs: number }).resetsAtMs, Date.UTC(2026, 0, 16));
    ticket(lim.admit(a, NO_KEY_LIMITS, null, null)); // free calls are not capped
    lim.settle(t1, 100);
    lim.release(t1);
    lim.release(t2); // released without settling: its reservation returns
    assert.deepEqual(lim.snapshot(a).spentTodayMicro, 100);
    assert.equal(lim.snapshot(a).reservedMicro, 0);
    const t3 = ticket(lim.admit(a, NO_KEY_LIMITS, null, 5));
    lim.settle(t3, 900);
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'daily_cap_exceeded');
    clock.advance(60_000); // 00:00 UTC
    ticket(lim.admit(a, NO_KEY_LIMITS, null, 1));
    assert.equal(lim.snapshot(a).spentTodayMicro, 0);
  });

  test('daily cap: a clock stepped back across 00:00 UTC keeps the later day and its spend (found in review: the spend was forgotten, twice)', () => {
    const clock = new FakeClock(Date.UTC(2026, 0, 16, 0, 0, 10));
    const lim = new MemoryLimiter(clock);
    const a = account({ dailyCapMicro: 1000 });
    const t = ticket(lim.admit(a, NO_KEY_LIMITS, null, 10));
    lim.settle(t, 1000);
    lim.release(t);
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'daily_cap_exceeded');
    clock.advance(-20_000); // 23:59:50 the day before
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'daily_cap_exceeded');
    assert.equal(lim.snapshot(a).spentTodayMicro, 1000);
    clock.advance(20_000); // the same instant of the later day again
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'daily_cap_exceeded');
    clock.advance(86_400_000); // the next day: a new cap
    ticket(lim.admit(a, NO_KEY_LIMITS, null, 1));
  });

  test('daily cap: a restart before the clock is back at the later day keeps that day\'s spend from the ledger (found in review: restored as none, it lifted the cap)', () => {
    const clock = new FakeClock(Date.UTC(2026, 0, 15, 23, 59, 50));
    const lim = new MemoryLimiter(clock);
    const a = account({ dailyCapMicro: 1000 });
    lim.restore(a.id, 0, Math.floor(clock.now() / DAY_MS) + 1, 1000, true);
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'daily_cap_exceeded');
    assert.equal(lim.snapshot(a).spentTodayMicro, 1000);
  });

  test('prepaid balance: admitted while balance minus reservations is above zero', () => {
    const lim = new MemoryLimiter(new FakeClock());
    const a = account({ prepaid: true });
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'insufficient_balance');
    assert.equal(lim.credit('acct', 100, 'c1'), 100);
    const t1 = ticket(lim.admit(a, NO_KEY_LIMITS, null, 60));
    const t2 = ticket(lim.admit(a, NO_KEY_LIMITS, null, 60));
    rejected(lim.admit(a, NO_KEY_LIMITS, null, 1), 'insufficient_balance');
    assert.equal(lim.settle(t1, 70).balanceAfterMicro, 30);
    assert.equal(lim.settle(t1, 70).balanceAfterMicro, null); // settling twice charges once
    assert.equal(lim.settle(t2, 50).balanceAfterMicro, -20); // overshoot bounded by cost - estimate
    assert.equal(lim.snapshot(a).balanceMicro, -20);
    assert.equal(lim.snapshot(account()).balanceMicro, null);
  });

  test('a changed limit applies to the next request and keeps the counters', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    for (let i = 0; i < 5; i++) assert.equal(lim.admitInstant(account({ rpm: 10 }), NO_KEY_LIMITS, null).ok, true);
    rejected(lim.admitInstant(account({ rpm: 5 }), NO_KEY_LIMITS, null), 'rate_limit_exceeded');
    assert.equal(lim.admitInstant(account({ rpm: 6 }), NO_KEY_LIMITS, null).ok, true);
    assert.equal(lim.admitInstant(account({ rpm: null }), NO_KEY_LIMITS, null).ok, true);
  });

  test('idle state is swept without timers, in bounded steps', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    for (let i = 0; i < 100; i++) {
      lim.admitInstant(account({ id: `a${i}`, rpm: 10 }), { id: `k${i}`, rpm: 5, concurrency: null }, null);
    }
    assert.equal(lim.sizes().accounts, 100);
    assert.equal(lim.sizes().keys, 100);
    const held = ticket(lim.admit(account({ id: 'busy', rpm: 10 }), NO_KEY_LIMITS, null, null));
    clock.advance(WINDOW_MS + 1);
    for (let i = 0; i < 400; i++) lim.admitInstant(account({ id: 'busy', rpm: 1000 }), NO_KEY_LIMITS, null);
    assert.equal(lim.sizes().accounts, 1, 'only the account with a request in flight remains');
    assert.equal(lim.sizes().keys, 0);
    lim.release(held);
    clock.advance(WINDOW_MS + 1);
    for (let i = 0; i < 64; i++) lim.admitInstant(account({ id: 'late' }), NO_KEY_LIMITS, null);
    assert.ok(lim.sizes().accounts <= 1);
  });
});

describe('MemoryLimiter admin credits', () => {
  test('each applied once per account and id while the ledger remembers its key (7 days from the credit), restored ones included; a key used again later is a new credit (found in review)', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock);
    const t0 = clock.now();
    // Restored at a start 6 days after credit K was made: the balance holds K.
    clock.advance(6 * DAY_MS);
    lim.restore('a', 5_000_000, Math.floor(clock.now() / DAY_MS), 0, true, [['k:K', t0]]);
    assert.equal(lim.credit('a', 5_000_000, 'k:K'), 5_000_000, 'within 7 days of K: already applied');
    assert.equal(lim.credit('b', 1_000_000, 'k:K'), 1_000_000, 'another account\'s K is its own');
    assert.equal(lim.credit('b', 1_000_000, 'k:K'), 1_000_000, 'once');
    // Day 8: the ledger has forgotten K (7 days after the credit, not after the restart); K again is a new credit.
    clock.advance(2 * DAY_MS);
    assert.equal(lim.credit('a', 2_000_000, 'k:K'), 7_000_000);
    assert.equal(lim.credit('a', 2_000_000, 'k:K'), 7_000_000, 'and that one once');
    assert.equal(lim.credit('a', 1, 'e:txn_new', 'k:K'), 7_000_000, 'applied under its former name');
  });
});

describe('limiter properties (random schedules on a fake clock)', () => {
  test('no rolling 60 s window ever admits more than rpm (account and key)', () => {
    for (let seed = 1; seed <= 30; seed++) {
      const r = rng(seed);
      const clock = new FakeClock();
      const lim = new MemoryLimiter(clock);
      const rpm = 1 + Math.floor(r() * 20);
      const keyRpm = 1 + Math.floor(r() * 20);
      const accountTimes: number[] = [];
      const keyTimes: number[] = [];
      for (let i = 0; i < 2000; i++) {
        clock.advance(Math.floor(r() * r() * 8000));
        const useKey = r() < 0.5;
        const key: KeyLimits = useKey ? { id: 'k', rpm: keyRpm, concurrency: null } : NO_KEY_LIMITS;
        if (lim.admitInstant(account({ rpm }), key, null).ok) {
          accountTimes.push(clock.now());
          if (useKey) keyTimes.push(clock.now());
        }
      }
      assertWindowHolds(accountTimes, rpm, `seed ${seed} account`);
      assertWindowHolds(keyTimes, keyRpm, `seed ${seed} key`);
    }
  });

  test('a lone client that waits Retry-After (whole seconds, rounded up) is admitted', () => {
    for (let seed = 1; seed <= 30; seed++) {
      const r = rng(seed);
      const clock = new FakeClock();
      const lim = new MemoryLimiter(clock);
      const a = account({ rpm: 1 + Math.floor(r() * 10) });
      for (let i = 0; i < 300; i++) {
        const d = lim.admitInstant(a, NO_KEY_LIMITS, null);
        if (d.ok) clock.advance(Math.floor(r() * 3000));
        else {
          const seconds = Math.max(1, Math.ceil(d.retryAfterMs / 1000));
          clock.advance(seconds * 1000);
          assert.equal(lim.admitInstant(a, NO_KEY_LIMITS, null).ok, true, `seed ${seed}: admitted after Retry-After`);
        }
      }
    }
  });

  test('in flight never exceeds concurrency and returns to zero', () => {
    for (let seed = 1; seed <= 30; seed++) {
      const r = rng(seed);
      const clock = new FakeClock();
      const lim = new MemoryLimiter(clock);
      const a = account({ concurrency: 1 + Math.floor(r() * 5) });
      const key: KeyLimits = { id: 'k', rpm: null, concurrency: 1 + Math.floor(r() * 5) };
      const held: Ticket[] = [];
      for (let i = 0; i < 1000; i++) {
        if (r() < 0.55) {
          const d = lim.admit(a, r() < 0.5 ? key : NO_KEY_LIMITS, null, null);
          if (d.ok) held.push(d);
        } else if (held.length > 0) {
          lim.release(held.splice(Math.floor(r() * held.length), 1)[0]!);
        }
        assert.ok(lim.snapshot(a).inFlight <= a.concurrency!, `seed ${seed}`);
        assert.equal(lim.snapshot(a).inFlight, held.length);
      }
      for (const t of held) lim.release(t);
      assert.equal(lim.snapshot(a).inFlight, 0);
    }
  });

  test('committed plus reserved spend is below the cap at every billable admission', () => {
    for (let seed = 1; seed <= 30; seed++) {
      const r = rng(seed);
      const clock = new FakeClock();
      const lim = new MemoryLimiter(clock);
      const cap = 1000 + Math.floor(r() * 10_000);
      const a = account({ dailyCapMicro: cap });
      const held: Array<{ t: Ticket; estimate: number }> = [];
      let committed = 0;
      for (let i = 0; i < 1000; i++) {
        if (r() < 0.6) {
          const estimate = 1 + Math.floor(r() * 500);
          const before = lim.snapshot(a);
          const d = lim.admit(a, NO_KEY_LIMITS, null, estimate);
          if (d.ok) {
            assert.ok(before.spentTodayMicro + before.reservedMicro < cap, `seed ${seed}: admitted at or over the cap`);
            held.push({ t: d, estimate });
          } else {
            assert.ok(before.spentTodayMicro + before.reservedMicro >= cap, `seed ${seed}: refused below the cap`);
          }
        } else if (held.length > 0) {
          const { t, estimate } = held.splice(Math.floor(r() * held.length), 1)[0]!;
          const cost = Math.floor(r() * estimate * 1.2);
          lim.settle(t, cost);
          lim.release(t);
          committed += cost;
        }
        assert.equal(lim.snapshot(a).spentTodayMicro, committed);
      }
      clock.advance(DAY_MS);
      assert.equal(lim.snapshot(a).spentTodayMicro, 0);
    }
  });
});

/** Every window (t - 60 s, t] ending at an admission holds at most `limit` admissions. */
function assertWindowHolds(times: number[], limit: number, label: string): void {
  let lo = 0;
  for (let hi = 0; hi < times.length; hi++) {
    while (times[lo]! <= times[hi]! - WINDOW_MS) lo++;
    assert.ok(hi - lo + 1 <= limit, `${label}: ${hi - lo + 1} admissions in 60 s, limit ${limit}`);
  }
}

describe('memory returns after idle accounts\' windows pass', () => {
  test('10,000 accounts and keys: all state dropped by the background sweep once their windows are over', () => {
    const clock = new FakeClock();
    const lim = new MemoryLimiter(clock, 60_000);
    try {
      for (let i = 0; i < 10_000; i++) {
        const a = account({ id: `a${i}`, rpm: 60, concurrency: 5, dailyCapMicro: 1000 });
        const t = ticket(lim.admit(a, { id: `k${i}`, rpm: 10, concurrency: null }, `idem-${i}`, 10));
        lim.settle(t, 0);
        lim.release(t);
      }
      assert.ok(lim.sizes().accounts > 9000);
      clock.advance(30_000);
      lim.sweepIdle(100_000);
      assert.ok(lim.sizes().accounts > 9000, 'windows not over yet: state kept');
      clock.advance(WINDOW_MS);
      lim.sweepIdle(4096);
      lim.sweepIdle(4096);
      lim.sweepIdle(4096);
      assert.deepEqual(lim.sizes(), { accounts: 0, keys: 0, money: 0, idempotency: 0 });
    } finally {
      lim.close();
    }
  });
});
