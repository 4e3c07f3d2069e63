import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { chatBody, testConfig, until } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';
import { spawnListening, type Spawned } from '../helpers/spawn.js';

const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');

type Instance = Spawned;

function startInstance(configFile: string): Promise<Instance> {
  return spawnListening(process.execPath, [MAIN, '--config', configFile, '--port', '0']);
}

function call(base: string, key: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'x-api-key': key, 'content-type': 'application/json', ...headers }, body: JSON.stringify(body),
  }).then(async (r) => ({ status: r.status, retryAfter: r.headers.get('retry-after'), text: await r.text() }));
}

const count = (statuses: number[], s: number) => statuses.filter((x) => x === s).length;

describe('three gateway instances sharing one Redis', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const redis = new RedisServer();
  const dir = mkdtempSync(join(tmpdir(), 'mg-redis-'));
  const configFile = join(dir, 'config.json');
  let instances: Instance[] = [];
  const prefix = `t${Date.now()}:`;
  const config = (rpm: number) => testConfig({
    limiter: { store: 'redis', url: 'REDIS_URL', timeoutMs: 200, leaseMs: 1000, prefix },
    plans: {
      burst: { rpm, concurrency: 1000 },
      narrow: { rpm: 100_000, concurrency: 4 },
      capped: { rpm: 100_000, concurrency: 100, dailyCapUsd: 0.0001 },
    },
    accounts: { acct_r: { plan: 'burst' }, acct_c: { plan: 'narrow' }, acct_m: { plan: 'capped', balanceUsd: 1 } },
    keys: {
      key_r: { account: 'acct_r', key: 'sk-r' }, key_c: { account: 'acct_c', key: 'sk-c' }, key_m: { account: 'acct_m', key: 'sk-m' },
    },
    providers: { mock: { protocol: 'mock' }, slow: { protocol: 'mock', latencyMs: 600 } },
  });
  const write = (rpm: number) => writeFileSync(configFile, JSON.stringify(config(rpm)).replace('REDIS_URL', redis.url));

  before(async () => {
    await redis.start();
    write(30);
    instances = await Promise.all([0, 1, 2].map(() => startInstance(configFile)));
  });
  after(async () => {
    for (const i of instances) i.child.kill('SIGKILL');
    await Promise.all(instances.map((i) => i.exited));
    await redis.stop();
  });

  test('RPM is exact across instances: a simultaneous burst admits exactly rpm', async () => {
    const results = await Promise.all(instances.flatMap((i) =>
      Array.from({ length: 20 }, () => fetch(`${i.url}/v1/models`, { headers: { 'x-api-key': 'sk-r' } }).then(async (r) => { await r.text(); return r.status; }))));
    assert.equal(count(results, 200), 30);
    assert.equal(count(results, 429), 30);
  });

  test('a plan change (SIGHUP on every instance) applies to the next request and keeps the counters', async () => {
    write(35);
    const reloads = (i: Instance) => i.stdout().split('"msg":"config reloaded"').length;
    const before = instances.map(reloads);
    for (const i of instances) i.child.kill('SIGHUP');
    await until(() => instances.every((i, n) => reloads(i) > before[n]!), 5000, 'every instance reloaded');
    const results = await Promise.all(instances.flatMap((i) =>
      Array.from({ length: 4 }, () => fetch(`${i.url}/v1/models`, { headers: { 'x-api-key': 'sk-r' } }).then(async (r) => { await r.text(); return r.status; }))));
    assert.equal(count(results, 200), 5);
  });

  test('concurrency and idempotency are global', async () => {
    const burst = await Promise.all(instances.flatMap((i) => Array.from({ length: 3 }, () => call(i.url, 'sk-c', chatBody('slow-1')))));
    assert.equal(count(burst.map((r) => r.status), 200), 4);
    assert.equal(count(burst.map((r) => r.status), 429), 5);
    const dup = await Promise.all(instances.map((i) => call(i.url, 'sk-c', chatBody('slow-1'), { 'idempotency-key': 'global-1' })));
    assert.deepEqual(dup.map((r) => r.status).sort(), [200, 409, 409]);
  });

  test('the daily cap and the prepaid balance are global', async () => {
    const statuses: number[] = [];
    for (let n = 0; n < 6; n++) statuses.push((await call(instances[n % 3]!.url, 'sk-m', chatBody('paid-1', 'x'.repeat(40)))).status);
    assert.deepEqual(statuses, [200, 200, 200, 200, 402, 402]);
    const balances = await Promise.all(instances.map((i) =>
      fetch(`${i.url}/v1/balance`, { headers: { 'x-api-key': 'sk-m' } }).then((r) => r.json() as Promise<Record<string, number>>)));
    for (const b of balances) {
      assert.equal(b.balance, 1 - 0.00012, 'credited once, charged four times, the same everywhere');
      assert.equal(b.daily_spend, 0.00012);
    }
  });

  test('a gateway killed with slots in hand: its leases return by themselves', async () => {
    const victim = await startInstance(configFile);
    // These die with the victim; their failure is expected.
    const held = Array.from({ length: 4 }, () => call(victim.url, 'sk-c', chatBody('slow-1')).catch(() => null));
    const inFlight = async () => Number(/mg_in_flight_requests (\d+)/.exec(await (await fetch(`${victim.url}/metrics`)).text())?.[1]);
    await until(async () => (await inFlight()) === 4, 5000, 'the victim holding four slots');
    victim.child.kill('SIGKILL');
    await victim.exited;
    await Promise.allSettled(held);
    const during = await call(instances[0]!.url, 'sk-c', chatBody('echo-1'));
    assert.equal(during.status, 429, 'the dead instance still holds the slots');
    let status = 0;
    const started = Date.now();
    while (status !== 200 && Date.now() - started < 5000) {
      await new Promise((r) => setTimeout(r, 100));
      status = (await call(instances[0]!.url, 'sk-c', chatBody('echo-1'))).status;
    }
    assert.equal(status, 200);
    assert.ok(Date.now() - started < 2500, 'back within about one lease');
  });

  test('Redis away: 503 limiter_unavailable fast, probes answer, not ready; back by itself', async () => {
    const base = instances[1]!.url;
    redis.pause();
    try {
      const started = Date.now();
      const res = await fetch(`${base}/v1/models`, { headers: { 'x-api-key': 'sk-c' } });
      assert.equal(res.status, 503);
      assert.ok(Date.now() - started < 1000, 'no hang');
      const body = (await res.json()) as { error: { code: string } };
      assert.equal(body.error.code, 'limiter_unavailable');
      assert.ok(Number(res.headers.get('retry-after')) >= 1);
      assert.equal((await fetch(`${base}/healthz`)).status, 200);
    } finally {
      redis.resume();
    }
    await redis.stop();
    let ready = await fetch(`${base}/readyz`);
    for (let i = 0; i < 40 && ready.status === 200; i++) {
      await new Promise((r) => setTimeout(r, 50));
      ready = await fetch(`${base}/readyz`);
    }
    assert.equal(ready.status, 503);
    assert.deepEqual(await ready.json(), { status: 'not_ready', reason: 'limiter_unavailable' });
    assert.equal((await fetch(`${base}/v1/models`, { headers: { 'x-api-key': 'sk-c' } })).status, 503);
    await redis.start();
    let status = 0;
    for (let i = 0; i < 60 && status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 100));
      status = (await fetch(`${base}/v1/models`, { headers: { 'x-api-key': 'sk-c' } })).status;
    }
    assert.equal(status, 200);
    assert.equal((await fetch(`${base}/readyz`)).status, 200);
  });
});
