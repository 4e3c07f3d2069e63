import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { createClient } from 'redis';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { AccountLimits, Ticket } from '../../src/limiter/types.js';
import { until } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Found in review: an instance that cannot reach Redis for a whole lease while its call runs
 * loses the call's lease to the next admission anywhere (which takes it back, with its
 * reservation, as a crashed instance's). Its renewals then only extended what was still there,
 * so the running call was never counted again: a second call took its slot, the same
 * Idempotency-Key ran twice from then on, and the cap did not see its reservation. A renewal
 * now takes a lapsed lease again.
 */
const server = new RedisServer();
let a: RedisLimiter;
let b: RedisLimiter;
before(async () => {
  if (!hasRedis) return;
  await server.start();
  a = new RedisLimiter({ url: server.url, prefix: 'lapse:', timeoutMs: 200, leaseMs: 300 });
  b = new RedisLimiter({ url: server.url, prefix: 'lapse:', timeoutMs: 200, leaseMs: 300 });
  await Promise.all([a.whenReady(3000), b.whenReady(3000)]);
});
after(async () => {
  if (!hasRedis) return;
  await a.close();
  await b.close();
  await server.stop();
});

/** Instance A stops renewing (it cannot reach Redis) until the returned function is called. */
function cutOff(): () => void {
  const paused = a as unknown as { renewAll: () => void };
  const renewAll = paused.renewAll;
  paused.renewAll = () => {};
  return () => { paused.renewAll = renewAll; };
}

test('regression: a lease that lapsed while its call runs is taken again by its next renewal (slot, reservation, Idempotency-Key)', { skip: hasRedis ? false : 'redis-server is not installed' }, async () => {
  const account: AccountLimits = { id: 'acct_l', rpm: null, concurrency: 2, dailyCapMicro: 1_000_000, prepaid: false };
  const key = { id: 'k', rpm: null, concurrency: null };
  const reconnect = cutOff(); // instance A cannot reach Redis for a while
  const first = await a.admit(account, key, 'idem-1', 600);
  assert.ok(first.ok);
  // A's lease runs out; the next admission anywhere (or a look at the account) takes it back.
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'A\'s lease taken back');
  const second = await b.admit(account, key, 'idem-2', 100);
  assert.ok(second.ok);
  reconnect(); // A is back: its call still runs
  await until(async () => (await b.snapshot(account)).inFlight === 2, 5000, 'A\'s call counted again');
  const s = await b.snapshot(account);
  assert.equal(s.reservedMicro, 700, 'both reservations');
  const third = await b.admit(account, key, null, 0);
  assert.ok(!third.ok && third.reason === 'concurrency_limit_exceeded', 'the slot A\'s call holds is not given to another');
  const again = await b.admit({ ...account, concurrency: 3 }, key, 'idem-1', 0);
  assert.ok(!again.ok && again.reason === 'idempotency_conflict', 'A\'s Idempotency-Key is held again');

  a.release(first);
  b.release(second);
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'both released');
  assert.equal((await b.snapshot(account)).reservedMicro, 0);
});

test('a renewal answered NOSCRIPT is not sent again: it could reach Redis after its ticket\'s release, made meanwhile, and take the lease again (found in review of the fix: the released slot, reservation and key came back)', { skip: hasRedis ? false : 'redis-server is not installed' }, async () => {
  const account: AccountLimits = { id: 'acct_late', rpm: null, concurrency: 1, dailyCapMicro: 1_000_000, prepaid: false };
  const key = { id: 'k', rpm: null, concurrency: null };
  const t = await a.admit(account, key, 'idem-late', 600);
  assert.ok(t.ok);
  const client = createClient({ url: server.url });
  await client.connect();
  try {
    await client.scriptFlush(); // a restart empties the script cache; BATCH, a function, stays
  } finally {
    await client.quit();
  }
  // What the limiter sends: a renewal answered NOSCRIPT must not go again as EVAL, which
  // would reach Redis after the release below (sent as FCALL meanwhile) and take the lease again.
  const client2 = (a as unknown as { client: { sendCommand: (words: string[]) => Promise<unknown> } }).client;
  const send = client2.sendCommand.bind(client2);
  const sent: string[] = [];
  let answered: Promise<unknown> | null = null;
  client2.sendCommand = (words: string[]) => {
    sent.push(words[0] === 'SCRIPT' ? `SCRIPT ${words[1]}` : words[0]!);
    const reply = send(words);
    if (words[0] === 'EVALSHA' && answered === null) answered = reply.catch(() => {});
    return reply;
  };
  try {
    (a as unknown as { renewAll: () => void }).renewAll();
    a.release(t);
    await until(() => answered !== null, 1000, 'the renewal sent');
    await answered;
    await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'released');
    await until(() => sent.includes('SCRIPT LOAD'), 1000, 'the script loaded for the next renewal');
  } finally {
    client2.sendCommand = send;
  }
  assert.ok(!sent.includes('EVAL'), `not sent again: ${sent.join(' ')}`);
  const s = await b.snapshot(account);
  assert.deepEqual([s.inFlight, s.reservedMicro], [0, 0]);
  const again = await b.admit(account, key, 'idem-late', 0);
  assert.ok(again.ok, 'the slot and the key are free');
  b.release(again);
});

test('with a shared ledger, after Redis lost its data, a renewal reads the account\'s money back and takes its running call again, though nothing billable comes (found in review: its slot and key stayed free to others)', { skip: hasRedis ? false : 'redis-server is not installed' }, async () => {
  const money = async () => ({ balanceMicro: 0, day: Math.floor(Date.now() / 86_400_000), spentMicro: 0, credited: true, creditIds: [] });
  const shared = new RedisLimiter({ url: server.url, prefix: 'lapse-pg:', timeoutMs: 200, leaseMs: 300, money });
  const client = createClient({ url: server.url });
  await client.connect();
  try {
    await shared.whenReady(3000);
    const account: AccountLimits = { id: 'acct_free', rpm: null, concurrency: 1, dailyCapMicro: null, prepaid: false };
    const t = await shared.admit(account, { id: 'k', rpm: null, concurrency: null }, 'idem-free', null);
    assert.ok(t.ok);
    const id = (t as unknown as { id: string }).id;
    await client.flushAll(); // Redis loses its data
    const p = 'lapse-pg:{acct_free}';
    await until(async () => (await client.zCard(`${p}:s`)) === 1 && (await client.get(`${p}:i:idem-free`)) === id, 5000, 'the call taken again, its key with it');
    assert.equal(await client.hGet(`${p}:m`, 'src'), '1', 'the money read back from the ledger');
    shared.release(t);
  } finally {
    await client.quit();
    await shared.close();
  }
});

/*
 * Found in review of the raise after a count: a ticket whose lease ran out has no reservation in
 * Redis, and its raise answered 'ok' without the cap check; its next renewal then took the raised
 * amount again, past a cap that other calls held. The raise of such a ticket is now checked as
 * any other (with nothing of its own reserved), and a raised ticket's lapse and renewal give
 * back exactly what they took.
 */
const raiseKey = { id: 'k', rpm: null, concurrency: null };

test('a raised ticket whose lease lapses and is taken again gives back exactly what it took', { skip: hasRedis ? false : 'redis-server is not installed' }, async () => {
  const account: AccountLimits = { id: 'acct_raise_1', rpm: null, concurrency: null, dailyCapMicro: 10_000, prepaid: false };
  const t = (await a.admit(account, raiseKey, null, 100)) as Ticket;
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

test('the raise of a ticket whose lease lapsed is checked against the cap the others hold', { skip: hasRedis ? false : 'redis-server is not installed' }, async () => {
  const account: AccountLimits = { id: 'acct_raise_2', rpm: null, concurrency: null, dailyCapMicro: 1000, prepaid: false };
  const t1 = (await a.admit(account, raiseKey, null, 100)) as Ticket;
  const reconnect = cutOff();
  await until(async () => (await b.snapshot(account)).inFlight === 0, 5000, 'the lease lapsed');
  const t2 = (await b.admit(account, raiseKey, null, 100)) as Ticket;
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
