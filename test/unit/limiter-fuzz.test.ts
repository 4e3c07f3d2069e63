import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DAY_MS } from '../../src/clock.js';
import { MemoryLimiter } from '../../src/limiter/memory.js';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits, KeyLimits, Limiter, Ticket } from '../../src/limiter/types.js';
import { FakeClock, rng } from '../helpers/fake-clock.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * A seeded fuzz of the engine, the same against both stores: random admissions, settles,
 * releases, credits and limit changes, a fifth of them with hostile values (0, -1, 1.5,
 * 2^53 + 1, 1e308, NaN, Infinity, strings). After every step:
 * - money is safe integers; nothing is reserved below 0;
 * - a hostile value is a fault (RangeError) that changes nothing;
 * - in flight and reserved are exactly what the held tickets account for;
 * - spend plus reservations stay within the README's bound: the cap, plus the largest
 *   estimate admitted just below it, plus what settled calls cost beyond their estimates;
 *   a prepaid balance less reservations stays above minus the same amount;
 * and at the end, with everything released, nothing is held: no slot, no reservation, no key.
 */

const HOSTILE: unknown[] = [-1, 1.5, 2 ** 53 + 1, 1e308, NaN, Infinity, -Infinity, '100', null, undefined, {}];
const HOSTILE_LIMITS: unknown[] = [-1, 1.5, 2 ** 53 + 1, 1e308, NaN, Infinity, '10', undefined];

interface Held {
  ticket: Ticket;
  account: number;
  estimate: number;
  settled: boolean;
  idem: string | null;
}

interface Books {
  /**
   * The highest cap any billable call was admitted under today (Infinity once one was admitted
   * with no cap), or what yesterday's calls still reserve at midnight.
   */
  capMax: number;
  /** The largest estimate admitted today. */
  estimateMax: number;
  /** What settled calls cost beyond their estimates, today. */
  excess: number;
  /** The same, all time (a balance is not reset at midnight). */
  excessEver: number;
  estimateEver: number;
}

const isSafe = (v: number | null) => v === null || Number.isSafeInteger(v);

function fuzz(name: string, seeds: number, steps: number, make: () => Promise<{ lim: Limiter; clock: FakeClock | null }>) {
  test(`engine fuzz: ${name} (${seeds} seeds x ${steps} steps)`, async () => {
    for (let seed = 1; seed <= seeds; seed++) {
      const r = rng(seed * 7919);
      const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
      const { lim, clock } = await make();
      try {
        const prefix = `f${seed}_${Math.floor(r() * 1e9).toString(36)}`;
        const limitOf = () => (r() < 0.3 ? null : Math.floor(r() * 8));
        const accounts: AccountLimits[] = Array.from({ length: 3 }, (_, i) => ({
          id: `${prefix}_a${i}`, rpm: r() < 0.5 ? null : 20 + Math.floor(r() * 200), concurrency: limitOf(),
          dailyCapMicro: r() < 0.3 ? null : 1000 + Math.floor(r() * 20_000), prepaid: i === 0,
        }));
        const key: KeyLimits = { id: `${prefix}_k`, rpm: null, concurrency: r() < 0.5 ? null : 3 };
        const books: Books[] = accounts.map(() => ({ capMax: 0, estimateMax: 0, excess: 0, excessEver: 0, estimateEver: 0 }));
        let day = Math.floor((clock?.now() ?? Date.now()) / DAY_MS);
        const held: Held[] = [];
        const idems = new Set<string>();
        await lim.creditOnce(accounts[0]!.id, 5000);

        const snap = (i: number) => lim.snapshot(accounts[i]!);
        const label = (step: number, what: string) => `${name} seed ${seed} step ${step}: ${what}`;

        for (let step = 0; step < steps; step++) {
          const i = Math.floor(r() * accounts.length);
          const a = accounts[i]!;
          const hostile = r() < 0.2;
          const before = await snap(i);
          const roll = r();
          let what = '';
          if (roll < 0.4) {
            // An admission, billable or not.
            const estimate = hostile ? pick(HOSTILE) : r() < 0.2 ? null : Math.floor(r() * 3000);
            const idem = r() < 0.3 ? `idem-${Math.floor(r() * 4)}` : null;
            what = `admit(estimate ${String(estimate)}, idem ${idem})`;
            if (hostile && estimate !== null) {
              await assert.rejects(async () => lim.admit(a, key, idem, estimate as number), RangeError, label(step, what));
            } else {
              const est = estimate as number | null;
              const d = await lim.admit(a, key, idem, est);
              if (d.ok) {
                if (est !== null && a.dailyCapMicro !== null) {
                  assert.ok(before.spentTodayMicro + before.reservedMicro < a.dailyCapMicro, label(step, `${what} admitted at or over the cap`));
                }
                if (est !== null && a.prepaid) assert.ok(before.balanceMicro! - before.reservedMicro > 0, label(step, `${what} admitted without balance`));
                held.push({ ticket: d, account: i, estimate: est ?? 0, settled: false, idem: idem === null ? null : `${i}\n${idem}` });
                if (idem !== null) idems.add(`${i}\n${idem}`);
                if (est !== null) {
                  const b = books[i]!;
                  b.capMax = Math.max(b.capMax, a.dailyCapMicro ?? Infinity);
                  b.estimateMax = Math.max(b.estimateMax, est);
                  b.estimateEver = Math.max(b.estimateEver, est);
                }
              }
            }
          } else if (roll < 0.6 && held.length > 0) {
            // A settlement, with a cost around the estimate (real usage can exceed it).
            const h = held[Math.floor(r() * held.length)]!;
            const cost = hostile ? pick(HOSTILE) : Math.floor(r() * (h.estimate + 10) * 1.3);
            what = `settle(cost ${String(cost)}, estimate ${h.estimate})`;
            if (hostile) {
              await assert.rejects(async () => lim.settle(h.ticket, cost as number), RangeError, label(step, what));
            } else {
              await lim.settle(h.ticket, cost as number);
              if (!h.settled) {
                const over = Math.max(0, (cost as number) - h.estimate);
                books[h.account]!.excess += over;
                books[h.account]!.excessEver += over;
              }
              h.settled = true;
            }
          } else if (roll < 0.8 && held.length > 0) {
            const h = held.splice(Math.floor(r() * held.length), 1)[0]!;
            what = 'release';
            lim.release(h.ticket);
          } else if (roll < 0.9) {
            // A limit change (SIGHUP, admin API): counters are kept.
            const field = pick(['rpm', 'concurrency', 'dailyCapMicro'] as const);
            const value = hostile ? pick(HOSTILE_LIMITS) : limitOf() === null ? null : Math.floor(r() * 30_000);
            what = `limit ${field} = ${String(value)}`;
            const next = { ...a, [field]: value };
            if (hostile) {
              await assert.rejects(async () => lim.admit(next, key, null, 1), RangeError, label(step, what));
            } else {
              accounts[i] = next;
            }
          } else if (roll < 0.95) {
            const amount = hostile ? pick([...HOSTILE, 0]) : 1 + Math.floor(r() * 500);
            what = `credit ${String(amount)}`;
            if (hostile) await assert.rejects(async () => lim.credit(a.id, amount as number, `c${step}`), RangeError, label(step, what));
            else await lim.credit(a.id, amount as number, `c${seed}-${step}`);
          } else if (clock !== null) {
            what = 'time passes';
            clock.advance(Math.floor(r() * r() * 3 * 3_600_000));
          }

          const now = Math.floor((clock?.now() ?? Date.now()) / DAY_MS);
          if (now !== day) {
            // Midnight: spend starts again from 0; yesterday's calls still in flight keep their reservations.
            day = now;
            for (const b of books) {
              b.excess = 0;
              b.estimateMax = 0;
              b.capMax = 0;
            }
            for (const h of held) if (!h.settled) books[h.account]!.capMax += h.estimate;
          }
          for (let j = 0; j < accounts.length; j++) {
            const s = await snap(j);
            const mine = held.filter((h) => h.account === j);
            const where = label(step, `${what}; account ${j} ${JSON.stringify(s)}`);
            assert.ok(isSafe(s.balanceMicro) && isSafe(s.spentTodayMicro) && isSafe(s.reservedMicro), `${where}: not a safe integer`);
            assert.ok(s.reservedMicro >= 0 && s.spentTodayMicro >= 0, `${where}: negative`);
            assert.equal(s.inFlight, mine.length, `${where}: in flight`);
            assert.equal(s.reservedMicro, mine.filter((h) => !h.settled).reduce((sum, h) => sum + h.estimate, 0), `${where}: reserved`);
            const b = books[j]!;
            assert.ok(s.spentTodayMicro + s.reservedMicro <= b.capMax + b.estimateMax + b.excess, `${where}: over the stated bound`);
            if (accounts[j]!.prepaid) {
              assert.ok(s.balanceMicro! - s.reservedMicro >= -(b.estimateEver + b.excessEver), `${where}: balance below the stated bound`);
            }
          }
        }

        // Everything released: nothing is held, and every Idempotency-Key used is free again.
        for (const h of held) lim.release(h.ticket);
        for (let j = 0; j < accounts.length; j++) {
          const s = await snap(j);
          assert.equal(s.inFlight, 0, `${name} seed ${seed}: in flight after release`);
          assert.equal(s.reservedMicro, 0, `${name} seed ${seed}: reserved after release`);
        }
        for (const slot of idems) {
          const [j, idem] = slot.split('\n') as [string, string];
          const free = { ...accounts[Number(j)]!, rpm: null, concurrency: null };
          const d = await lim.admit(free, { id: 'free', rpm: null, concurrency: null }, idem, null);
          assert.equal(d.ok, true, `${name} seed ${seed}: ${idem} still held`);
          lim.release(d as Ticket);
        }
      } finally {
        await lim.close();
      }
    }
  });
}

describe('the limiter engine under hostile input', () => {
  fuzz('memory', 40, 400, async () => {
    const clock = new FakeClock(Date.UTC(2026, 0, 15, 20));
    return { lim: new MemoryLimiter(clock), clock };
  });

  if (hasRedis) {
    const server = new RedisServer();
    before(async () => { await server.start(); });
    after(() => server.stop());
    fuzz('redis', 4, 250, async () => {
      const lim = new RedisLimiter({ url: server.url, prefix: 'fuzz:', timeoutMs: 2000 });
      await lim.whenReady(3000);
      return { lim, clock: null };
    });
  } else {
    test('engine fuzz: redis', (t) => t.skip('redis-server is not installed'));
  }
});
