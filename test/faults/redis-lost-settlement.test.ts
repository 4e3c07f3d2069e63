import assert from 'node:assert/strict';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits, Ticket } from '../../src/limiter/types.js';
import { until } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * A settlement whose outcome the gateway does not learn: the request never reaches Redis, its
 * answer is lost with the connection, it comes after the deadline, or Redis is away when the
 * call settles. Each time the charge must count in Redis's money exactly once (the spend and
 * the prepaid balance), and the call's slot must wait for it and then be given back. Before,
 * a settlement that did not answer in time was dropped: the call was free for the cap and the
 * balance.
 *
 * The limiter reaches Redis through a TCP relay of the test's own, which can drop the next
 * request or the next answer and cut the connection, or refuse connections for a while.
 */
describe('fault: a settlement whose outcome is lost counts exactly once', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  let relay: Server;
  let cut: 'request' | 'answer' | null = null;
  let away = false;
  const open = new Set<Socket>();
  let limiter: RedisLimiter;
  before(async () => {
    await server.start();
    relay = createServer((client: Socket) => {
      if (away) return client.destroy();
      const upstream = connect(server.port, '127.0.0.1');
      open.add(client);
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('data', (d) => {
        if (cut !== 'request') return upstream.write(d);
        cut = null;
        close();
      });
      upstream.on('data', (d) => {
        if (cut !== 'answer') return client.write(d);
        cut = null;
        close();
      });
      for (const s of [client, upstream]) {
        s.on('close', () => {
          open.delete(client);
          close();
        });
        s.on('error', close);
      }
    });
    await new Promise<void>((resolve) => relay.listen(0, '127.0.0.1', resolve));
    const port = (relay.address() as { port: number }).port;
    // Leases of 1.5 s are renewed every 500 ms: a settlement sent again too soon, or twice, would show.
    limiter = new RedisLimiter({ url: `redis://127.0.0.1:${port}`, prefix: 'lost:', timeoutMs: 200, leaseMs: 1500 });
    await limiter.whenReady(3000);
  });
  after(async () => {
    server.resume();
    away = false;
    await limiter.close();
    relay.close();
    await server.stop();
  });

  const COST = 700;
  const account = (id: string): AccountLimits => ({ id, rpm: null, concurrency: 5, dailyCapMicro: 1_000_000, prepaid: true });
  const key = { id: 'k', rpm: null, concurrency: null };

  async function snapshot(id: string) {
    for (;;) {
      try {
        return await limiter.snapshot(account(id));
      } catch {
        await new Promise((r) => setTimeout(r, 20)); // the connection not back yet
      }
    }
  }

  /** A call admitted with a reservation of 5,000 on an account holding 10,000. */
  async function admitted(id: string): Promise<Ticket> {
    await limiter.credit(id, 10_000, `c-${id}`);
    const t = await limiter.admit(account(id), key, null, 5_000);
    assert.ok(t.ok);
    return t;
  }

  /** The charge counted once, nothing left reserved, and the slot given back after it. */
  async function chargedOnce(id: string, t: Ticket): Promise<void> {
    limiter.release(t);
    await until(async () => (await snapshot(id)).inFlight === 0, 5000, 'the slot given back');
    // Two more renewals: a settlement sent again after it was confirmed would charge again.
    await new Promise((r) => setTimeout(r, 1100));
    const s = await snapshot(id);
    assert.equal(s.spentTodayMicro, COST, 'spent once');
    assert.equal(s.balanceMicro, 10_000 - COST, 'taken from the balance once');
    assert.equal(s.reservedMicro, 0, 'nothing left reserved');
  }

  test('the settlement never reached Redis (connection cut under it): sent again, counted once', async () => {
    const t = await admitted('acct_req');
    cut = 'request';
    await assert.rejects(limiter.settle(t, COST), /limiter/);
    await chargedOnce('acct_req', t);
  });

  test('Redis ran the settlement but its answer was lost: sent again, not counted twice', async () => {
    const t = await admitted('acct_ans');
    cut = 'answer';
    await assert.rejects(limiter.settle(t, COST), /limiter/);
    await chargedOnce('acct_ans', t);
  });

  test('the answer came after the deadline: counted once', async () => {
    const t = await admitted('acct_late');
    server.pause();
    try {
      await assert.rejects(limiter.settle(t, COST), /limiter/);
    } finally {
      server.resume();
    }
    await chargedOnce('acct_late', t);
  });

  test('Redis away when the call settles and is released: both sent, in order, when it is back', async () => {
    const t = await admitted('acct_away');
    away = true;
    for (const s of open) s.destroy();
    try {
      await until(() => !limiter.ready(), 3000, 'the limiter sees Redis away');
      await assert.rejects(limiter.settle(t, COST), /limiter/);
      limiter.release(t);
    } finally {
      away = false;
    }
    await chargedOnce('acct_away', t);
  });
});
