import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { Socket } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { GatewayError } from '../../src/errors.js';
import { RedisLimiter, type LedgerMoney } from '../../src/limiter/redis.js';
import { BATCH } from '../../src/limiter/redis-scripts.js';
import type { AccountLimits, Decision, KeyLimits, Ticket } from '../../src/limiter/types.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

type RedisClient = ReturnType<typeof createClient>;

/**
 * The Redis limiter batches the admissions, settlements and releases of one account made in one
 * turn of the event loop into one script call: decisions stay exact, ops keep their order, a bad
 * op fails alone, and a Redis that stops answering fails every op of the batch closed.
 */
describe('Redis limiter: one script call per account and turn', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  const limiters: RedisLimiter[] = [];
  let lim: RedisLimiter;
  const make = async (options: Partial<ConstructorParameters<typeof RedisLimiter>[0]> = {}) => {
    const l = new RedisLimiter({ url: server.url, prefix: `b${randomBytes(3).toString('hex')}:`, timeoutMs: 500, ...options });
    limiters.push(l);
    await l.whenReady(3000);
    return l;
  };
  before(async () => {
    await server.start();
    lim = await make();
  });
  after(async () => {
    for (const l of limiters) await l.close();
    await server.stop();
  });

  /** A plain client of the test's own, for raw commands; quit at the end. */
  const withClient = async (use: (client: RedisClient) => Promise<void>) => {
    const client: RedisClient = createClient({ url: server.url });
    await client.connect();
    try {
      await use(client);
    } finally {
      await client.quit();
    }
  };
  const cli = (...args: string[]) => spawnSync('redis-cli', ['-p', String(server.port), ...args], { encoding: 'utf8' }).stdout.trim();
  /** BATCH calls since the last reset (FCALL; the other scripts are EVALSHA). */
  const batchCalls = () => Number(/cmdstat_fcall:calls=(\d+)/.exec(cli('info', 'commandstats'))?.[1] ?? 0);
  const fresh = (over: Partial<AccountLimits> = {}): AccountLimits => ({
    id: `acct_${randomBytes(4).toString('hex')}`, rpm: null, concurrency: null, dailyCapMicro: null, prepaid: false, ...over,
  });
  const noKey: KeyLimits = { id: 'k0', rpm: null, concurrency: null };
  const reason = (d: { ok: boolean }) => (d.ok ? 'ok' : (d as unknown as { reason: string }).reason);

  test('many admissions of one account in one turn: one call, exactly rpm admitted', async () => {
    const a = fresh({ rpm: 20 });
    await lim.snapshot(a); // the script loaded, the connection warm
    cli('config', 'resetstat');
    const decisions = await Promise.all(Array.from({ length: 50 }, () => lim.admitInstant(a, noKey, null)));
    assert.equal(decisions.filter((d) => d.ok).length, 20);
    assert.equal(decisions.slice(0, 20).every((d) => d.ok), true, 'the first 20 made, in order');
    assert.equal(batchCalls(), 1, 'one script call for the 50');
    const next = await lim.admitInstant(a, noKey, null);
    assert.equal(reason(next), 'rate_limit_exceeded', 'the batch recorded its 20 admissions');
  });

  test('a turn\'s batch is written in that turn: before an immediate queued after it, not after the next poll phase', async () => {
    const a = fresh({ rpm: 5 });
    await lim.snapshot(a);
    // What the limiter's sockets were handed, and when: node-redis writes its queued commands
    // at a setImmediate of its own.
    const written: string[] = [];
    const write = Socket.prototype.write;
    Socket.prototype.write = function (this: Socket, chunk: unknown, ...rest: unknown[]) {
      if (String(chunk).includes('FCALL')) written.push('batch');
      return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest);
    } as typeof write;
    try {
      const seen = await new Promise<string[]>((resolve, reject) => {
        setTimeout(() => { // a callback of the loop, as a request's parse is
          lim.admitInstant(a, noKey, null).catch(reject);
          setImmediate(() => resolve([...written]));
        }, 0);
      });
      assert.deepEqual(seen, ['batch'], 'the batch was on the socket when the turn ended');
    } finally {
      Socket.prototype.write = write;
    }
  });

  test('a Redis that lost its scripts and functions (SCRIPT FLUSH, FUNCTION FLUSH, a restart) gets them again with the call: nothing fails', async () => {
    const a = fresh({ rpm: 2, prepaid: true, dailyCapMicro: 1000 });
    await lim.creditOnce(a.id, 500);
    const lost = () => {
      cli('script', 'flush');
      cli('function', 'flush');
    };
    lost();
    cli('config', 'resetstat');
    const [d1, d2, d3] = await Promise.all([lim.admit(a, noKey, null, 10), lim.admit(a, noKey, null, 10), lim.admit(a, noKey, null, 10)]);
    assert.deepEqual([d1, d2, d3].map(reason), ['ok', 'ok', 'rate_limit_exceeded']);
    assert.match(cli('info', 'commandstats'), /cmdstat_function\|load:calls=1,/, 'the library loaded once');
    assert.match(cli('function', 'list'), /mg_batch_[0-9a-f]{16}/);
    lost();
    assert.equal((await lim.settle(d1 as Ticket, 7)).balanceAfterMicro, 493);
    lost();
    const snap = await lim.snapshot(a);
    assert.deepEqual([snap.balanceMicro, snap.spentTodayMicro, snap.reservedMicro, snap.inFlight], [493, 7, 10, 2]);
    await lim.admitInstant(fresh(), noKey, null); // the library back, for the tests that count calls
  });

  for (const [refused, acl, tried] of [
    // Its library refused: FCALL never tried.
    ['FUNCTION (as before 7.0)', ['-fcall', '-function'], /cmdstat_function\|load:calls=0,.*rejected_calls=1,/],
    // Its library loaded, FCALL refused once: scripts from then on.
    ['FCALL only', ['-fcall'], /cmdstat_fcall:calls=0,.*rejected_calls=1,/],
  ] as const) {
    test(`a Redis that refuses ${refused} to the limiter's user: the batch runs as a script, decisions the same`, async () => {
      cli('acl', 'setuser', 'nofunctions', 'reset', 'on', '>pw', '~*', '&*', '+@all', ...acl);
      cli('config', 'resetstat');
      const noFn = await make({ url: `redis://nofunctions:pw@127.0.0.1:${server.port}` });
      try {
        const a = fresh({ rpm: 3, concurrency: 2 });
        const first = await Promise.all([noFn.admit(a, noKey, null, null), noFn.admit(a, noKey, null, null), noFn.admit(a, noKey, null, null)]);
        assert.deepEqual(first.map(reason), ['ok', 'ok', 'concurrency_limit_exceeded']);
        noFn.release(first[0] as Ticket);
        assert.deepEqual([await noFn.admit(a, noKey, null, null), await noFn.admit(a, noKey, null, null)].map(reason), ['ok', 'rate_limit_exceeded']);
        const stats = cli('info', 'commandstats');
        assert.match(stats, tried, 'FCALL tried at most once, and refused');
        if (acl.length === 2) assert.doesNotMatch(stats, /cmdstat_fcall/, 'FCALL never tried');
        assert.match(stats, /cmdstat_evalsha:calls=[1-9]/, 'scripts instead');
      } finally {
        await noFn.close(); // before its user goes
        cli('acl', 'deluser', 'nofunctions');
      }
    });
  }

  test('a call of the BATCH function starts from nothing: what one call kept in Lua (a reservation made in it) is not seen by the next', async () => {
    await withClient(async (client) => {
      const name = /mg_batch_[0-9a-f]{16}/.exec(cli('function', 'list'))![0];
      const p = `fn${randomBytes(3).toString('hex')}{a}`;
      const keys = [`${p}:wt`, `${p}:wn`, `${p}:s`, `${p}:m`, `${p}:r`, `${p}:x`];
      const fcall = (...args: string[]) => client.sendCommand(['FCALL', name, String(keys.length), ...keys, '0', '30000', ...args]);
      assert.deepEqual(await fcall('a', 'u1', '-1,-1,-1,-1,-1', '7', '00'), ['ok']);
      // Released saying 0 (its settlement gave it back): a reservation made in this same call
      // would be taken back; one made in an earlier call stays, with its lease.
      assert.deepEqual(await fcall('r', 'u1', '0'), [1]);
      assert.equal(await client.hGet(`${p}:m`, 'resv'), '7');
      assert.equal(await client.hGet(`${p}:r`, 'u1'), '7');
    });
  });

  test('a turn with more than 256 ops of one account: split into calls of 256, still in order, still exact', async () => {
    const a = fresh({ rpm: 300 });
    await lim.snapshot(a);
    cli('config', 'resetstat');
    const decisions = await Promise.all(Array.from({ length: 600 }, () => lim.admitInstant(a, noKey, null)));
    assert.equal(batchCalls(), 3, '256 + 256 + 88');
    assert.equal(decisions.filter((d) => d.ok).length, 300);
    assert.equal(decisions.slice(0, 300).every((d) => d.ok), true, 'the first 300 made, in order across the calls');
  });

  test('two accounts in one turn: one call each, each counted on its own', async () => {
    const a = fresh({ rpm: 3 });
    const b = fresh({ rpm: 5, concurrency: 2 });
    cli('config', 'resetstat');
    const calls: Promise<Decision>[] = [];
    for (let i = 0; i < 10; i++) calls.push(lim.admit(a, noKey, null, null) as Promise<Decision>, lim.admit(b, noKey, null, null) as Promise<Decision>);
    const decisions = await Promise.all(calls);
    const of = (acct: AccountLimits) => decisions.filter((_, i) => (i % 2 === 0 ? a : b) === acct).map(reason);
    assert.deepEqual(of(a), ['ok', 'ok', 'ok', ...Array(7).fill('rate_limit_exceeded')]);
    assert.deepEqual(of(b), ['ok', 'ok', ...Array(8).fill('concurrency_limit_exceeded')]);
    assert.equal(batchCalls(), 2);
    assert.equal((await lim.snapshot(b)).inFlight, 2);
    for (const d of decisions) if (d.ok) lim.release(d);
    assert.equal((await lim.snapshot(b)).inFlight, 0, 'the releases were sent before the snapshot');
  });

  test('ops of one account keep their order in a batch: a release frees the slot and key for an admission after it, not before', async () => {
    const a = fresh({ concurrency: 1 });
    const t1 = (await lim.admit(a, noKey, 'idem-o', null)) as Ticket;
    assert.equal(reason(t1), 'ok');
    // Admission first, then the release: the admission still finds the slot and key taken.
    const early = lim.admit(a, noKey, 'idem-o', null);
    lim.release(t1);
    assert.equal(reason(await early), 'idempotency_conflict');
    const t2 = (await lim.admit(a, noKey, 'idem-o', null)) as Ticket;
    assert.equal(reason(t2), 'ok');
    // Release first, then the admission, in one turn: it gets the slot and the key.
    lim.release(t2);
    const t3 = await lim.admit(a, noKey, 'idem-o', null);
    assert.equal(reason(t3), 'ok');
    lim.release(t3 as Ticket);
  });

  test('settle then release in one batch: charged once, the reservation gone, the balance right', async () => {
    const a = fresh({ prepaid: true, dailyCapMicro: 10_000, concurrency: 10 });
    await lim.creditOnce(a.id, 1000);
    const tickets = await Promise.all([lim.admit(a, noKey, null, 300), lim.admit(a, noKey, null, 200)]) as Ticket[];
    assert.deepEqual(tickets.map(reason), ['ok', 'ok']);
    assert.equal((await lim.snapshot(a)).reservedMicro, 500);
    cli('config', 'resetstat');
    const settled = [lim.settle(tickets[0]!, 250), lim.settle(tickets[1]!, 100)];
    lim.release(tickets[0]!);
    lim.release(tickets[1]!);
    const balances = (await Promise.all(settled)).map((s) => s.balanceAfterMicro);
    assert.deepEqual(balances, [750, 650], 'each settlement answers the balance after it, in order');
    assert.equal(batchCalls(), 1);
    const snap = await lim.snapshot(a);
    assert.deepEqual([snap.balanceMicro, snap.spentTodayMicro, snap.reservedMicro, snap.inFlight], [650, 350, 0, 0]);
  });

  test('the batch script checks each op on its own: a bad op answers its error, writes nothing, and the others run', async () => {
    await withClient(async (client) => {
      const p = `raw${randomBytes(3).toString('hex')}{a}`;
      const keys = [`${p}:wt`, `${p}:wn`, `${p}:s`, `${p}:m`, `${p}:r`, `${p}:x`];
      const idem = `${p}:i:x`;
      // An admission with an Idempotency-Key ('ai': its key follows): rpm, concurrency, key rpm,
      // key concurrency, cap; the estimate; flags prepaid and instant.
      const admit = (id: string, rpm: string) => ['ai', id, `${rpm},10,-1,-1,1000`, '5', '00'];
      // Alone, a bad admission writes nothing at all.
      assert.deepEqual(await client.eval(BATCH, { keys: [...keys, idem], arguments: ['0', '30000', ...admit('t0', '1.5')] }),
        [['error', 'ERR model-gateway: invalid argument limits']]);
      assert.deepEqual(await client.keys(`${p}*`), []);
      const reply = await client.eval(BATCH, {
        keys: [...keys, idem, idem, idem, idem],
        arguments: ['0', '30000', ...admit('t1', '10'), ...admit('t2', '1e9999'), ...admit('t3', '10'),
          's', 't1', '-4', '0', '5', 's', 't1', '4', '0', '-5', 's', 't1', '4', '0', '5', 'ri', 't1', '0'],
    });
    assert.deepEqual(reply, [
      'ok',
      ['error', 'ERR model-gateway: invalid argument limits'],
      ['idempotency_conflict', 0, 0], // t1 holds the key: t2 took nothing, t3 ran after t1
      ['error', 'ERR model-gateway: invalid argument cost'],
      ['error', 'ERR model-gateway: invalid argument est'],
      0,
      1,
    ]);
    assert.equal(await client.zCard(`${p}:s`), 0, 't1 released');
    assert.equal(await client.hGet(`${p}:m`, 'spent'), '4');
    assert.equal(await client.hGet(`${p}:m`, 'resv'), '0');
    assert.equal(await client.hGet(`${p}:wn`, 'n'), '1', 'one admission counted: the bad one and the conflict took nothing');
    await assert.rejects(client.eval(BATCH, { keys, arguments: ['2', '30000'] }), /invalid argument flag/);
    });
  });

  test('\'restore\' in a batch: the money is rebuilt from the ledger once, the reservations of calls in flight kept, then each op that answered \'restore\' runs again', async () => {
    let reads = 0;
    const money = async (): Promise<LedgerMoney> => {
      reads++;
      return { balanceMicro: 1000, day: Math.floor(Date.now() / 86_400_000), spentMicro: 40, credited: true, creditIds: [] };
    };
    const l = await make({ money });
    const a = fresh({ prepaid: true, dailyCapMicro: 100_000, concurrency: 10 });
    const tickets = (await Promise.all([l.admit(a, noKey, null, 100), l.admit(a, noKey, null, 100), l.admit(a, noKey, null, 100)])) as Ticket[];
    assert.deepEqual(tickets.map(reason), ['ok', 'ok', 'ok']);
    assert.equal(reads, 1, 'read from the ledger once');
    let snap = await l.snapshot(a);
    assert.deepEqual([snap.balanceMicro, snap.spentTodayMicro, snap.reservedMicro], [1000, 40, 300]);
    // Redis loses the money again: the settlements of one turn rebuild it, once, and are charged.
    cli('del', `${(l as unknown as { prefix: string }).prefix}{${a.id}}:m`);
    const settled = await Promise.all(tickets.map((t) => l.settle(t, 10)));
    for (const t of tickets) l.release(t);
    assert.equal(reads, 2);
    assert.deepEqual(settled.map((s) => s.balanceAfterMicro), [990, 980, 970]);
    snap = await l.snapshot(a);
    assert.deepEqual([snap.balanceMicro, snap.spentTodayMicro, snap.reservedMicro, snap.inFlight], [970, 70, 0, 0],
      'the reservations rebuilt with the money, and given back once');
  });

  test('a reservation is given back once: a settlement after its lease ran out (and an admission expired it) takes nothing back again', async () => {
    await withClient(async (client) => {
      const p = `once${randomBytes(3).toString('hex')}{a}`;
      const keys = [`${p}:wt`, `${p}:wn`, `${p}:s`, `${p}:m`, `${p}:r`, `${p}:x`];
      const admit = (id: string, lease: string) => client.eval(BATCH, { keys, arguments: ['0', lease, 'a', id, '-1,-1,-1,-1,-1', '5', '00'] });
      assert.deepEqual(await admit('t1', '1'), ['ok']); // a lease of 1 ms: t1's instance "died"
      const redisMs = async () => { const [s, us] = (await client.sendCommand(['TIME'])) as [string, string]; return Number(s) * 1000 + Math.floor(Number(us) / 1000); };
      const until = (await redisMs()) + 3;
      while ((await redisMs()) < until) { /* Redis's own clock moves past t1's lease */ }
      assert.deepEqual(await admit('t2', '30000'), ['ok']); // expires t1's lease: its 5 go back
      assert.equal(await client.hGet(`${p}:m`, 'resv'), '5', 't2 alone holds a reservation');
      // Both carry t1's 5, as when the settlement's answer was lost and the release cannot know it was applied.
      assert.deepEqual(await client.eval(BATCH, { keys, arguments: ['0', '30000', 's', 't1', '4', '0', '5', 'r', 't1', '5'] }), [0, 1]);
      assert.equal(await client.hGet(`${p}:m`, 'resv'), '5', 't1\'s reservation was not given back a second time');
      assert.equal(await client.hGet(`${p}:m`, 'spent'), '4', 'the late settlement is still charged');
      assert.deepEqual(await client.eval(BATCH, { keys, arguments: ['0', '30000', 'r', 't2', '5'] }), [1]);
      assert.equal(await client.hGet(`${p}:m`, 'resv'), '0', 'an unsettled release gives its reservation back');
    });
  });

  test('a reservation goes back with one HDEL: the settlement carries it, and a release after a settlement that answered looks for nothing; a release whose settlement is still out waits for it', async () => {
    const calls = (command: string) => Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(cli('info', 'commandstats'))?.[1] ?? 0);
    const a = fresh({ prepaid: true, dailyCapMicro: 1_000_000, concurrency: 10 });
    await lim.credit(a.id, 1000, `c_${randomBytes(3).toString('hex')}`);
    const [t1, t2] = (await Promise.all([lim.admit(a, noKey, null, 100), lim.admit(a, noKey, null, 70)])) as Ticket[];
    cli('config', 'resetstat');
    assert.equal((await lim.settle(t1!, 30)).balanceAfterMicro, 970);
    lim.release(t1!);
    // t2: the release in the same turn as the settlement, before its answer (a client gone): it is sent after the answer.
    const settling = lim.settle(t2!, 20);
    lim.release(t2!);
    assert.equal((await settling).balanceAfterMicro, 950);
    const snap = await lim.snapshot(a);
    assert.deepEqual([snap.balanceMicro, snap.spentTodayMicro, snap.reservedMicro, snap.inFlight], [950, 50, 0, 0]);
    assert.equal(calls('hget'), 0, 'no reservation looked up');
    assert.equal(calls('hdel'), 2, 't1 settled (1), t1 released after the answer (0), t2 settled (1) and released after its answer (0)');
  });

  test('RPM after a limit lowered far below the window: an honest wait of a minute, found without reading the window; near the limit, exact from its oldest members only', async () => {
    const calls = (command: string) => Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(cli('info', 'commandstats'))?.[1] ?? 0);
    const a = fresh({ rpm: 1000 });
    // 400 admissions in 40 calls, over several milliseconds.
    for (let i = 0; i < 40; i++) await Promise.all(Array.from({ length: 10 }, () => lim.admitInstant(a, noKey, null)));
    cli('config', 'resetstat');
    const cut = await lim.admitInstant({ ...a, rpm: 10 }, noKey, null);
    assert.equal(reason(cut as Decision), 'rate_limit_exceeded');
    assert.equal((cut as unknown as { retryAfterMs: number }).retryAfterMs, 60_000);
    assert.equal(calls('zrange') + calls('hmget'), 0, 'the window\'s members were not read (only its total)');
    // 400 - 350 + 1 = 51 to leave: the oldest 51 members at most, in one read.
    const near = await lim.admitInstant({ ...a, rpm: 350 }, noKey, null);
    const wait = (near as unknown as { retryAfterMs: number }).retryAfterMs;
    assert.ok(wait > 55_000 && wait < 60_000, `wait ${wait}`);
    assert.deepEqual([calls('zrange'), calls('hmget')], [1, 1]);
  });

  test('leases and reservations of one call are written once at its end: counted for the concurrency checks before, taken back by a release in the same call, and the key\'s set given its time to live', async () => {
    await withClient(async (client) => {
      const p = `pend${randomBytes(3).toString('hex')}{a}`;
      const keys = [`${p}:wt`, `${p}:wn`, `${p}:s`, `${p}:m`, `${p}:r`, `${p}:x`];
      const ks = [`${p}:kwt`, `${p}:kwn`, `${p}:ks`];
      // Account concurrency 3, key concurrency 2, an estimate of 7 each: the third keyed admission
      // is refused on the key's count, t4 (no key) fits the account's, t5 is over it; then t1
      // is released in the same call, and t6 takes its place.
      const admitK = (id: string) => ['ak', id, '-1,3,-1,2,-1', '7', '00'];
      const admit = (id: string) => ['a', id, '-1,3,-1,-1,-1', '7', '00'];
      const reply = await client.eval(BATCH, {
        keys: [...keys, ...ks, ...ks, ...ks, `${p}:ks`, ...ks],
        arguments: ['0', '30000', ...admitK('t1'), ...admitK('t2'), ...admitK('t3'), ...admit('t4'), ...admit('t5'), 'rk', 't1', '7', ...admitK('t6')],
    });
    assert.deepEqual(reply, ['ok', 'ok', ['concurrency_limit_exceeded', 1000, 0], 'ok', ['concurrency_limit_exceeded', 1000, 0], 1, 'ok']);
    assert.deepEqual((await client.zRange(`${p}:s`, 0, -1)).sort(), ['t2', 't4', 't6']);
    assert.deepEqual((await client.zRange(`${p}:ks`, 0, -1)).sort(), ['t2', 't6']);
    const ttl = await client.pTTL(`${p}:ks`);
    assert.ok(ttl > 50_000 && ttl <= 60_000, `the key's set lives twice the lease (PTTL ${ttl})`);
    assert.deepEqual(await client.hGetAll(`${p}:r`), { t2: '7', t4: '7', t6: '7' }, 't1\'s reservation never written');
    assert.equal(await client.hGet(`${p}:m`, 'resv'), '21');
    // An id taken twice in one call is refused; a release that says 0 (its settlement answered)
    // still takes back a reservation made in the same call.
    const again = await client.eval(BATCH, {
      keys, arguments: ['0', '30000', 'a', 'u1', '-1,-1,-1,-1,-1', '7', '00', 'a', 'u1', '-1,-1,-1,-1,-1', '7', '00', 'r', 'u1', '0'],
    });
    assert.deepEqual(again, ['ok', ['error', 'ERR model-gateway: invalid argument id'], 1]);
    assert.equal(await client.hGet(`${p}:m`, 'resv'), '21', 'u1\'s 7 came back, once');
    assert.equal(Number(await client.hExists(`${p}:r`, 'u1')), 0);
    });
  });

  test('a hostile amount fails its own call at the door and leaves the batch alone', async () => {
    const a = fresh({ rpm: 2 });
    const good = lim.admit(a, noKey, null, 5);
    const bad = lim.admit(a, noKey, null, 1.5);
    const good2 = lim.admit(a, noKey, null, 5);
    await assert.rejects(bad, RangeError);
    assert.deepEqual([reason(await good), reason(await good2)], ['ok', 'ok']);
    lim.release((await good) as Ticket);
    lim.release((await good2) as Ticket);
  });
});

describe('Redis limiter: a Redis that stops answering mid-batch', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  let lim: RedisLimiter;
  before(async () => {
    await server.start();
    lim = new RedisLimiter({ url: server.url, prefix: 'frozen:', timeoutMs: 200, leaseMs: 1000 });
    await lim.whenReady(3000);
  });
  after(async () => {
    server.resume();
    await lim.close();
    await server.stop();
  });

  test('every op of the batch is a 503 at the deadline; slots taken meanwhile return with their leases', async () => {
    const a: AccountLimits = { id: 'acct_f', rpm: null, concurrency: 3, dailyCapMicro: null, prepaid: false };
    const key: KeyLimits = { id: 'k', rpm: null, concurrency: null };
    const held = (await lim.admit(a, key, null, null)) as Ticket;
    assert.equal(held.ok, true);
    server.pause();
    let resumed = false;
    try {
      const started = Date.now();
      const ops = [lim.admit(a, key, null, null), lim.admitInstant(a, key, 'idem-f'), lim.settle(held, 0), lim.admit(a, key, null, null)];
      const outcomes = await Promise.allSettled(ops);
      const elapsed = Date.now() - started;
      for (const o of outcomes) {
        assert.equal(o.status, 'rejected');
        assert.ok((o as PromiseRejectedResult).reason instanceof GatewayError);
        assert.equal(((o as PromiseRejectedResult).reason as GatewayError).code, 'limiter_unavailable');
      }
      assert.ok(elapsed >= 150 && elapsed < 1000, `failed at the deadline (${elapsed} ms)`);
      lim.release(held);
      server.resume();
      resumed = true;
    } finally {
      if (!resumed) server.resume();
    }
    // Redis ran what it had received once it woke: those slots return with their leases (1 s).
    const until = Date.now() + 5000;
    let inFlight = -1;
    while (Date.now() < until) {
      try {
        inFlight = (await lim.snapshot(a)).inFlight;
        if (inFlight === 0) break;
      } catch {
        // reconnecting
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(inFlight, 0, 'no slot leaked');
    const again = await Promise.all([lim.admit(a, key, null, null), lim.admit(a, key, null, null), lim.admit(a, key, null, null), lim.admit(a, key, null, null)]);
    assert.deepEqual(again.map((d) => d.ok), [true, true, true, false], 'the full concurrency is back');
    for (const d of again) if (d.ok) lim.release(d);
  });
});
