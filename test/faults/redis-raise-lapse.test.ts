import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits, Ticket } from '../../src/limiter/types.js';
import { until } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Found in review of the raise after a count: a ticket whose lease ran out (its instance could
 * not reach Redis for a whole lease) has no reservation in Redis, and its raise answered 'ok'
 * without the cap check; its next renewal then took the raised amount again, past a cap that
 * other calls held. The raise of such a ticket is now checked as any other (with nothing of its
 * own reserved), and a raised ticket's lapse and renewal give back exactly what they took.
 */
const server = new RedisServer();
let a: RedisLimiter;
let b: RedisLimiter;
const skip = hasRedis ? false : 'redis-server is not installed';
before(async () => {
  if (!hasRedis) return;
  await server.start();
  a = new RedisLimiter({ url: server.url, prefix: 'raise:', timeoutMs: 200, leaseMs: 300 });
  b = new RedisLimiter({ url: server.url, prefix: 'raise:', timeoutMs: 200, leaseMs: 300 });
  await Promise.all([a.whenReady(3000), b.whenReady(3000)]);
});
after(async () => {
  if (!hasRedis) return;
  await a.close();
  await b.close();
  await server.stop();
});

const key = { id: 'k', rpm: null, concurrency: null };
/** Instance A stops renewing (it cannot reach Redis) until the returned function is called. */
function cutOff(): () => void {
  const paused = a as unknown as { renewAll: () => void };
  const renewAll = paused.renewAll;
  paused.renewAll = () => {};
  return () => { paused.renewAll = renewAll; };
}

test('a raised ticket whose lease lapses and is taken again gives back exactly what it took', { skip }, async () => {
  const account: AccountLimits = { id: 'acct_1', rpm: null, concurrency: null, dailyCapMicro: 10_000, prepaid: false };
  const t = (await a.admit(account, key, null, 100)) as Ticket;
  assert.equal(await a.raise(t, account, 900), null);
  const reconnect = cutOff();
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'the lease lapsed');
  assert.equal((await b.snapshot(account)).reservedMicro, 0);
  reconnect();
  await until(async () => (await b.snapshot(account)).inFlight === 1, 5000, 'the lease taken again');
  assert.equal((await b.snapshot(account)).reservedMicro, 900, 'the raised amount, taken again');
  await a.settle(t, 500);
  a.release(t);
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'released');
  const snap = await b.snapshot(account);
  assert.deepEqual([snap.reservedMicro, snap.spentTodayMicro], [0, 500]);
});

test('the raise of a ticket whose lease lapsed is checked against the cap the others hold', { skip }, async () => {
  const account: AccountLimits = { id: 'acct_2', rpm: null, concurrency: null, dailyCapMicro: 1000, prepaid: false };
  const t1 = (await a.admit(account, key, null, 100)) as Ticket;
  const reconnect = cutOff();
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'the lease lapsed');
  const t2 = (await b.admit(account, key, null, 100)) as Ticket;
  assert.equal(await b.raise(t2, account, 1000), null);
  assert.equal((await a.raise(t1, account, 900))?.reason, 'daily_cap_exceeded', 'the others hold the cap');
  reconnect();
  await until(async () => (await b.snapshot(account)).inFlight === 2, 5000, 'the lease taken again');
  assert.equal((await b.snapshot(account)).reservedMicro, 1100, 'its own admission\'s reservation, not the refused raise');
  a.release(t1);
  b.release(t2);
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'released');
  assert.equal((await b.snapshot(account)).reservedMicro, 0);
});
