import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { systemClock } from '../../src/clock.js';
import { MemoryLimiter } from '../../src/limiter/memory.js';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits, Decision, InstantDecision, KeyLimits, Limiter, Ticket } from '../../src/limiter/types.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

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
      await new Promise((r) => setTimeout(r, 20));
      assert.equal((await lim.snapshot(a)).inFlight, 0);
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
