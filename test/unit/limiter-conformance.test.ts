import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { systemClock } from '../../src/clock.js';
import { MemoryLimiter } from '../../src/limiter/memory.js';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits, Decision, InstantDecision, KeyLimits, Limiter, Ticket } from '../../src/limiter/types.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/** Polls a store until `check` holds: a release is one more round trip on a remote store. */
async function waitFor(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error('timed out');
}

/**
 * One suite, every store: the same limiter behaviour against the in-memory store and Redis.
 * Time-travel cases (windows expiring, UTC midnight) live in limiter.test.ts on a fake clock.
 */
function conformance(name: string, make: () => Promise<Limiter>, teardown: () => Promise<void>) {
  describe(`limiter conformance: ${name}`, () => {
    let lim: Limiter;
    before(async () => { lim = await make(); });
    after(async () => {
      await lim.close();
      await teardown();
    });

    const fresh = (over: Partial<AccountLimits> = {}): AccountLimits => ({
      id: `acct_${randomBytes(4).toString('hex')}`, rpm: null, concurrency: null, dailyCapMicro: null, prepaid: false, ...over,
    });
    const noKey: KeyLimits = { id: 'k0', rpm: null, concurrency: null };
    const admit = async (a: AccountLimits, k: KeyLimits = noKey, idem: string | null = null, est: number | null = null) =>
      (await lim.admit(a, k, idem, est)) as Decision;
    const instant = async (a: AccountLimits, k: KeyLimits = noKey, idem: string | null = null) =>
      (await lim.admitInstant(a, k, idem)) as InstantDecision;
    const reason = (d: { ok: boolean }) => (d.ok ? 'ok' : (d as unknown as { reason: string }).reason);

    test('RPM: exactly rpm admissions, then a wait of about a minute; rejections consume nothing', async () => {
      const a = fresh({ rpm: 5 });
      for (let i = 0; i < 5; i++) assert.equal(reason(await instant(a)), 'ok');
      for (let i = 0; i < 3; i++) {
        const d = await instant(a);
        assert.equal(reason(d), 'rate_limit_exceeded');
        const wait = (d as unknown as { retryAfterMs: number }).retryAfterMs;
        assert.ok(wait > 55_000 && wait <= 60_000, `wait ${wait}`);
      }
      // A higher limit admits exactly the difference: the rejections above took nothing.
      const b = { ...a, rpm: 7 };
      assert.equal(reason(await instant(b)), 'ok');
      assert.equal(reason(await instant(b)), 'ok');
      assert.equal(reason(await instant(b)), 'rate_limit_exceeded');
    });

    test('RPM: a burst sharing milliseconds is counted exactly; a raised limit admits the difference, a lowered one waits', async () => {
      const a = fresh({ rpm: 150 });
      // Sent together: Redis runs them back to back, many in the same millisecond.
      const burst = await Promise.all(Array.from({ length: 200 }, () => lim.admitInstant(a, noKey, null)));
      assert.equal(burst.filter((d) => d.ok).length, 150);
      const more = await Promise.all(Array.from({ length: 50 }, () => lim.admitInstant({ ...a, rpm: 180 }, noKey, null)));
      assert.equal(more.filter((d) => d.ok).length, 30);
      const lowered = await instant({ ...a, rpm: 100 });
      assert.equal(reason(lowered), 'rate_limit_exceeded');
      const wait = (lowered as unknown as { retryAfterMs: number }).retryAfterMs;
      assert.ok(wait > 55_000 && wait <= 60_000, `wait ${wait}`);
    });

    test('concurrency: held until settled and released, per account and per key', async () => {
      const a = fresh({ concurrency: 2 });
      const k: KeyLimits = { id: 'k1', rpm: null, concurrency: 1 };
      const t1 = await admit(a, k);
      assert.equal(reason(t1), 'ok');
      assert.equal(reason(await admit(a, k)), 'concurrency_limit_exceeded');
      const t2 = await admit(a);
      assert.equal(reason(t2), 'ok');
      const d = await admit(a);
      assert.equal(reason(d), 'concurrency_limit_exceeded');
      assert.equal((d as unknown as { retryAfterMs: number }).retryAfterMs, 1000);
      assert.equal(reason(await instant(a)), 'concurrency_limit_exceeded');
      assert.equal((await lim.snapshot(a)).inFlight, 2);
      await lim.settle(t1 as Ticket, 0);
      lim.release(t1 as Ticket);
      lim.release(t1 as Ticket);
      await lim.settle(t2 as Ticket, 0);
      lim.release(t2 as Ticket);
      await waitFor(async () => (await lim.snapshot(a)).inFlight === 0);
      assert.equal(reason(await admit(a, k)), 'ok');
    });

    test('idempotency: per account, held while executing, free afterwards', async () => {
      const a = fresh();
      const b = fresh();
      const t = await admit(a, noKey, 'idem-1');
      assert.equal(reason(await admit(a, noKey, 'idem-1')), 'idempotency_conflict');
      assert.equal(reason(await instant(a, noKey, 'idem-1')), 'idempotency_conflict');
      assert.equal(reason(await admit(b, noKey, 'idem-1')), 'ok');
      await lim.settle(t as Ticket, 0);
      lim.release(t as Ticket);
      await new Promise((r) => setTimeout(r, 20));
      assert.equal(reason(await admit(a, noKey, 'idem-1')), 'ok');
    });

    test('daily cap and balance: reservations count, settlement charges, contract order', async () => {
      const a = fresh({ dailyCapMicro: 1000, prepaid: true, rpm: 100, concurrency: 100 });
      assert.equal(reason(await admit(a, noKey, null, 10)), 'insufficient_balance');
      assert.equal(await lim.creditOnce(a.id, 500), 500);
      assert.equal(await lim.creditOnce(a.id, 500), null, 'the initial credit is given once');
      assert.equal(await lim.credit(a.id, 100, 'c1'), 600);
      const t1 = (await admit(a, noKey, 'x', 400)) as Ticket;
      assert.equal(reason(t1), 'ok');
      assert.equal(reason(await admit(a, noKey, 'x', 10)), 'idempotency_conflict', 'idempotency answers before money');
      const t2 = (await admit(a, noKey, null, 200)) as Ticket;
      assert.equal(reason(t2), 'ok'); // balance 600 - 400 reserved > 0
      assert.equal(reason(await admit(a, noKey, null, 10)), 'insufficient_balance'); // 600 - 600 reserved = 0
      assert.equal((await lim.settle(t1, 450)).balanceAfterMicro, 150);
      lim.release(t1);
      const snap = await lim.snapshot(a);
      assert.deepEqual([snap.balanceMicro, snap.spentTodayMicro, snap.reservedMicro], [150, 450, 200]);
      await lim.settle(t2, 600);
      lim.release(t2);
      assert.equal((await lim.snapshot(a)).balanceMicro, -450);
      await lim.credit(a.id, 10_000, 'c2');
      const capped = await admit(a, noKey, null, 1);
      assert.equal(reason(capped), 'daily_cap_exceeded');
      assert.equal((capped as unknown as { resetsAtMs: number }).resetsAtMs % 86_400_000, 0);
      assert.equal(reason(await admit(a, noKey, null, null)), 'ok', 'free calls are not capped');
    });

    test('settling is not releasing: the slot and the Idempotency-Key stay held until release', async () => {
      const a = fresh({ concurrency: 1, dailyCapMicro: 1000 });
      const k: KeyLimits = { id: 'k-settle', rpm: null, concurrency: 1 };
      const t = (await admit(a, k, 'idem-s', 100)) as Ticket;
      assert.equal(reason(t), 'ok');
      await lim.settle(t, 60);
      // The answer's final bytes are still on their way: a retry of the same call must wait.
      assert.equal(reason(await admit(a, k, 'idem-s', 1)), 'idempotency_conflict');
      assert.equal(reason(await admit(a, k, null, 1)), 'concurrency_limit_exceeded');
      const snap = await lim.snapshot(a);
      assert.deepEqual([snap.inFlight, snap.spentTodayMicro, snap.reservedMicro], [1, 60, 0]);
      lim.release(t);
      lim.release(t);
      await waitFor(async () => (await lim.snapshot(a)).inFlight === 0);
      const again = (await admit(a, k, 'idem-s', 1)) as Ticket;
      assert.equal(reason(again), 'ok');
      await lim.settle(again, 0);
      lim.release(again);
      assert.equal((await lim.settle(t, 999)).balanceAfterMicro, null, 'a second settle charges nothing');
      await waitFor(async () => (await lim.snapshot(a)).inFlight === 0);
      assert.equal((await lim.snapshot(a)).spentTodayMicro, 60);
    });

    test('releasing without settling: the reservation returns and nothing is charged', async () => {
      const a = fresh({ concurrency: 1, dailyCapMicro: 1000, prepaid: true });
      await lim.creditOnce(a.id, 500);
      const t = (await admit(a, noKey, 'idem-r', 400)) as Ticket;
      assert.equal(reason(t), 'ok');
      assert.equal((await lim.snapshot(a)).reservedMicro, 400);
      lim.release(t);
      await waitFor(async () => (await lim.snapshot(a)).inFlight === 0);
      const snap = await lim.snapshot(a);
      assert.deepEqual([snap.reservedMicro, snap.spentTodayMicro, snap.balanceMicro], [0, 0, 500]);
      assert.equal((await lim.settle(t, 300)).balanceAfterMicro, null, 'settling a released ticket charges nothing');
      assert.equal((await lim.snapshot(a)).balanceMicro, 500);
    });

    test('a raise after a count: checked as an admission (others only), refused unchanged, given back whole on every path', async () => {
      const a = fresh({ dailyCapMicro: 1000 });
      const t1 = (await admit(a, noKey, null, 100)) as Ticket;
      const t2 = (await admit(a, noKey, null, 100)) as Ticket;
      const t3 = (await admit(a, noKey, null, 100)) as Ticket;
      assert.equal(await lim.raise(t1, a, 50), null, 'not above its reservation: nothing');
      assert.equal(await lim.raise(t1, a, 900), null, 'others 200 < 1000');
      assert.equal((await lim.snapshot(a)).reservedMicro, 1100);
      assert.equal(reason(await admit(a, noKey, null, 1)), 'daily_cap_exceeded', 'the raised reservation counts for the next admission');
      const refused = await lim.raise(t2, a, 300);
      assert.equal(refused?.reason, 'daily_cap_exceeded', 'others 1000: the cap is reached');
      assert.equal((await lim.snapshot(a)).reservedMicro, 1100, 'a refused raise changes nothing');
      // Released while its raise is on its way: what Redis reserved goes back, whatever came first.
      const raising = lim.raise(t3, { ...a, dailyCapMicro: null }, 5000);
      lim.release(t3);
      assert.equal(await raising, null);
      lim.release(t2);
      await lim.settle(t1, 700);
      assert.equal(await lim.raise(t1, a, 2000), null, 'settled: nothing');
      lim.release(t1);
      await waitFor(async () => (await lim.snapshot(a)).inFlight === 0);
      const snap = await lim.snapshot(a);
      assert.deepEqual([snap.reservedMicro, snap.spentTodayMicro], [0, 700]);
      // A prepaid balance: the others' reservations against it.
      const p = fresh({ prepaid: true });
      await lim.creditOnce(p.id, 500);
      const q1 = (await admit(p, noKey, null, 100)) as Ticket;
      const q2 = (await admit(p, noKey, null, 100)) as Ticket;
      assert.equal(await lim.raise(q1, p, 500), null, 'others 100 < 500');
      assert.equal((await lim.raise(q2, p, 200))?.reason, 'insufficient_balance');
      await lim.settle(q1, 450);
      await lim.settle(q2, 0);
      lim.release(q1);
      lim.release(q2);
      await waitFor(async () => (await lim.snapshot(p)).inFlight === 0);
      assert.deepEqual([(await lim.snapshot(p)).reservedMicro, (await lim.snapshot(p)).balanceMicro], [0, 50]);
      for (const bad of [-1, 1.5, 2 ** 53, NaN]) await assert.rejects(async () => lim.raise(q1, p, bad), RangeError, `estimate ${bad}`);
    });

    test('hostile amounts are faults at the door, and take nothing', async () => {
      const a = fresh({ concurrency: 1, rpm: 1 });
      for (const bad of [-1, 1.5, 2 ** 53, 1e308, Infinity, NaN, '5' as unknown as number]) {
        await assert.rejects(async () => lim.admit(a, noKey, 'idem-h', bad), RangeError, `estimate ${String(bad)}`);
        await assert.rejects(async () => lim.credit(a.id, bad, 'c'), RangeError, `credit ${String(bad)}`);
      }
      await assert.rejects(async () => lim.credit(a.id, 0, 'c'), RangeError, 'a credit of 0');
      for (const bad of [{ rpm: 1.5 }, { concurrency: -1 }, { dailyCapMicro: 1e308 }, { rpm: NaN }]) {
        await assert.rejects(async () => lim.admit({ ...a, ...bad }, noKey, null, null), RangeError, JSON.stringify(bad));
      }
      const t = (await admit(a, noKey, 'idem-h', 5)) as Ticket;
      assert.equal(reason(t), 'ok', 'the RPM count, the slot and the key were all still free');
      for (const bad of [-1, 0.5, 2 ** 53, NaN]) await assert.rejects(async () => lim.settle(t, bad), RangeError, `cost ${bad}`);
      await lim.settle(t, 5);
      lim.release(t);
      await waitFor(async () => (await lim.snapshot(a)).inFlight === 0);
      assert.equal((await lim.snapshot(a)).spentTodayMicro, 5);
    });

    test('per-key RPM counts in addition to the account, the longest wait wins', async () => {
      const a = fresh({ rpm: 3 });
      const k: KeyLimits = { id: 'k2', rpm: 1, concurrency: null };
      assert.equal(reason(await instant(a, k)), 'ok');
      assert.equal(reason(await instant(a, k)), 'rate_limit_exceeded');
      assert.equal(reason(await instant(a)), 'ok');
      assert.equal(reason(await instant(a)), 'ok');
      assert.equal(reason(await instant(a)), 'rate_limit_exceeded');
    });

    test('snapshot of a postpaid account has no balance', async () => {
      const snap = await lim.snapshot(fresh());
      assert.equal(snap.balanceMicro, null);
      assert.ok(snap.resetsAtMs > Date.now());
    });
  });
}

conformance('memory', async () => new MemoryLimiter(systemClock), async () => {});

if (hasRedis) {
  const server = new RedisServer();
  conformance('redis', async () => {
    await server.start();
    const lim = new RedisLimiter({ url: server.url, prefix: 'test:', timeoutMs: 500 });
    await lim.whenReady(3000);
    return lim;
  }, () => server.stop());
} else {
  test('limiter conformance: redis', (t) => t.skip('redis-server is not installed'));
}
