import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createGateway, type EmbeddedGateway } from '../../src/create.js';
import { Logger } from '../../src/log.js';
import { chatBody, postJson, testConfig, until } from '../helpers/gateway.js';
import { dropSchema, freshSchema, noPostgres, PG_URL, sql } from '../helpers/postgres.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';
import { spawnSync } from 'node:child_process';

const ADMIN = 'admin-fleet-secret';

describe('a fleet on one PostgreSQL ledger', { skip: noPostgres }, () => {
  const schema = freshSchema();
  const instances: Array<{ gw: EmbeddedGateway; url: string }> = [];
  const config = testConfig({
    ledger: { store: 'postgres', url: PG_URL, schema },
    accounts: { acct_alice: { plan: 'pro', balanceUsd: 10 }, acct_bob: { plan: 'free' } },
  });

  before(async () => {
    for (let i = 0; i < 2; i++) {
      const gw = await createGateway(config, { logger: new Logger(() => {}), adminKey: ADMIN });
      instances.push({ gw, url: await gw.listen(0, '127.0.0.1') });
    }
  });
  after(async () => {
    await Promise.all(instances.map((i) => i.gw.close()));
    dropSchema(schema);
  });

  const get = async (url: string, key: string) => {
    const res = await fetch(url, { headers: { authorization: `Bearer ${key}` } });
    return { status: res.status, body: await res.json() as Record<string, unknown> };
  };
  const admin = (url: string, method: string, path: string, body?: unknown) => fetch(`${url}${path}`, {
    method, headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' }, ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });

  test('usage and billing history are the same on every instance, as soon as each answer is received', async () => {
    for (let i = 0; i < 10; i++) {
      const { url } = instances[i % 2]!;
      const res = await postJson(`${url}/v1/chat/completions`, 'sk-alice', chatBody(i % 3 === 0 ? 'echo-1' : 'paid-1', `call ${i} `.repeat(i + 1)));
      assert.equal(res.status, 200);
      await res.arrayBuffer();
      // Each answer's charge is committed before its last bytes: the other instance sees it at once.
      const other = instances[(i + 1) % 2]!.url;
      const history = await get(`${other}/v1/billing/history?limit=100`, 'sk-alice');
      const charges = (history.body.data as Array<{ type: string }>).filter((e) => e.type === 'charge');
      assert.equal(charges.length, [...Array(i + 1).keys()].filter((j) => j % 3 !== 0).length, `after call ${i}`);
    }
    const views = await Promise.all(instances.map(async ({ url }) => ({
      usage: (await get(`${url}/v1/usage?group_by=model`, 'sk-alice')).body,
      byKey: (await get(`${url}/v1/usage?group_by=key`, 'sk-alice')).body,
      history: (await get(`${url}/v1/billing/history?limit=3`, 'sk-alice')).body,
      page2: null as unknown,
    })));
    for (const [i, v] of views.entries()) {
      v.page2 = (await get(`${instances[i]!.url}/v1/billing/history?limit=3&after=${(v.history as { next_cursor: string }).next_cursor}`, 'sk-alice')).body;
    }
    assert.deepEqual(views[0], views[1]);
    const rows = (views[0]!.usage as { data: Array<{ model: string; requests: number }> }).data;
    assert.deepEqual(rows.map((r) => [r.model, r.requests]), [['echo-1', 4], ['paid-1', 6]]);
    assert.equal(sql(`SELECT count(*) FROM "${schema}".entries WHERE type <> 'credit'`), '10', 'one row per call');
    assert.equal(sql(`SELECT count(*) FROM "${schema}".entries WHERE type = 'credit'`), '1', 'the initial credit once, for the fleet');
  });

  test('an admin change on one instance acts on the other within 1 s; changes made at once on both are all kept', async () => {
    const [one, two] = instances;
    const created = await admin(one!.url, 'POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_fleet' });
    assert.equal(created.status, 201);
    const { key } = await created.json() as { key: string };
    const started = Date.now();
    let status = 0;
    while (Date.now() - started < 1000) {
      status = (await get(`${two!.url}/v1/models`, key)).status;
      if (status === 200) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(status, 200, 'the key made on instance one works on instance two within 1 s');

    const made = await Promise.all([
      admin(one!.url, 'POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_a' }),
      admin(two!.url, 'POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_b' }),
      admin(one!.url, 'PUT', '/admin/v1/accounts/acct_new', { plan: 'pro' }),
      admin(two!.url, 'POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_c' }),
    ]);
    assert.deepEqual(made.map((r) => r.status), [201, 201, 200, 201]);
    for (const { url } of instances) {
      const deadline = Date.now() + 1000;
      let ids: string[] = [];
      while (Date.now() < deadline) {
        ids = ((await (await admin(url, 'GET', '/admin/v1/keys')).json()) as { data: Array<{ id: string }> }).data.map((k) => k.id);
        if (['key_a', 'key_b', 'key_c'].every((id) => ids.includes(id))) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.ok(['key_a', 'key_b', 'key_c', 'key_fleet'].every((id) => ids.includes(id)), `${url}: ${ids.join(',')}`);
      assert.equal((await admin(url, 'GET', '/admin/v1/accounts/acct_new')).status, 200);
    }
  });

  test('a listener whose connection is cut reconnects and reads the whole state again: a change made while it was away is not lost', async () => {
    const [one, two] = instances;
    const listeners = () => Number(sql(`SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN "${schema}_admin"'`).trim());
    assert.equal(listeners(), 2, 'one listening connection per instance');
    sql(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN "${schema}_admin"'`);
    await until(() => listeners() === 0, 2000, 'the listeners are gone (they come back after a second)');
    // Made while no instance listens: its NOTIFY reaches nobody.
    const created = await admin(one!.url, 'POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_while_away' });
    assert.equal(created.status, 201);
    const { key } = await created.json() as { key: string };
    await until(async () => (await get(`${two!.url}/v1/models`, key)).status === 200, 5000, 'instance two read the state again after reconnecting');
    await until(() => listeners() === 2, 5000, 'both listen again');
    // And a change after that is announced as before.
    const later = await admin(two!.url, 'POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_after' });
    const { key: laterKey } = await later.json() as { key: string };
    await until(async () => (await get(`${one!.url}/v1/models`, laterKey)).status === 200, 1000, 'a later change reaches instance one within 1 s');
  });

  test('a change whose NOTIFY never came is read by every instance at its next check of the listener (found in review: a missed NOTIFY, or a read after one that failed, left a deleted key working until the next change)', async () => {
    assert.equal((await get(`${instances[0]!.url}/v1/models`, 'sk-bob')).status, 200);
    // key_bob deleted by writing the state directly, with no NOTIFY: as if it was lost.
    const row = sql(`SELECT state FROM "${schema}".admin_state WHERE id = 1`).trim();
    const stored = (row === '' ? { version: 2, plans: [], accounts: [], keys: [], keyPatches: [], deletedKeys: [] } : JSON.parse(row)) as { deletedKeys: string[] };
    stored.deletedKeys.push('key_bob');
    const text = JSON.stringify(stored).replace(/'/g, "''");
    sql(`INSERT INTO "${schema}".admin_state AS a (id, version, state) VALUES (1, 1, '${text}')
      ON CONFLICT (id) DO UPDATE SET version = a.version + 1, state = excluded.state`);
    for (const { url } of instances) {
      await until(async () => (await get(`${url}/v1/models`, 'sk-bob')).status === 401, 5000, 'the key refused (checked every 2 s)');
    }
  });
});

describe('Redis and PostgreSQL: money Redis lost is rebuilt from the ledger', { skip: noPostgres || (hasRedis ? false : 'redis-server is not installed') }, () => {
  const schema = freshSchema();
  const redis = new RedisServer();
  const started: EmbeddedGateway[] = [];
  let config: Record<string, unknown>;
  const instance = async () => {
    const gw = await createGateway(config, { logger: new Logger(() => {}), adminKey: ADMIN });
    started.push(gw);
    return gw.listen(0, '127.0.0.1');
  };
  const balance = async (url: string) => {
    const res = await fetch(`${url}/v1/balance`, { headers: { authorization: 'Bearer sk-alice' } });
    assert.equal(res.status, 200);
    const body = await res.json() as { balance: number; daily_spend: number };
    return [body.balance, body.daily_spend];
  };

  before(async () => {
    await redis.start();
    config = testConfig({
      limiter: { store: 'redis', url: redis.url, prefix: `${schema}:`, timeoutMs: 1000 },
      ledger: { store: 'postgres', url: PG_URL, schema },
      plans: { capped: { rpm: 100_000, concurrency: 10, dailyCapUsd: 0.01 } },
      accounts: { acct_alice: { plan: 'capped', balanceUsd: 5 }, acct_bob: { plan: 'capped' } },
      models: { 'paid-1': { provider: 'mock', price: { inputPerMillion: 10, outputPerMillion: 20 } } },
      keys: { key_alice: { account: 'acct_alice', key: 'sk-alice' } },
    });
  });
  after(async () => {
    await Promise.all(started.map((g) => g.close()));
    await redis.stop();
    dropSchema(schema);
  });

  test('after FLUSHALL every instance sees the same balance and daily spend, the cap still holds, and no initial credit is given twice', async () => {
    const one = await instance();
    const two = await instance();
    await until(async () => (await balance(one))[0] === 5, 3000, 'the initial credit (given at start, in the background)');
    let calls = 0;
    for (;;) {
      const res = await postJson(`${[one, two][calls % 2]}/v1/chat/completions`, 'sk-alice', chatBody('paid-1', 'spend some money '.repeat(20)));
      const text = await res.text();
      if (res.status === 402 && text.includes('daily_cap_exceeded')) break;
      assert.equal(res.status, 200, text);
      calls++;
    }
    assert.ok(calls >= 2, `${calls} calls before the daily cap`);
    const before = await balance(one);
    assert.ok(before[0]! < 5 && before[1]! > 0, `spent: ${before.join(', ')}`);

    assert.equal(spawnSync('redis-cli', ['-p', String(redis.port), 'FLUSHALL']).status, 0);
    assert.deepEqual(await balance(two), before, 'rebuilt from PostgreSQL');
    const refused = await postJson(`${one}/v1/chat/completions`, 'sk-alice', chatBody('paid-1', 'more'));
    assert.equal(refused.status, 402, 'the daily cap still holds');
    assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'daily_cap_exceeded');

    // Admin credits, one with an Idempotency-Key.
    const credit = (url: string, amountUsd: number, key?: string) => fetch(`${url}/admin/v1/accounts/acct_alice/credits`, {
      method: 'POST', body: JSON.stringify({ amountUsd }),
      headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }) },
    });
    assert.equal((await credit(one, 2, 'top-up-1')).status, 201);
    assert.equal((await credit(two, 1)).status, 201);
    const credited = await balance(one);
    assert.equal(Math.round((credited[0]! - before[0]!) * 1e6), 3_000_000);

    // An instance starting now offers every prepaid account its initial credit, and gives the
    // recent admin credits again: Redis knows from the ledger that all of them were applied.
    assert.equal(spawnSync('redis-cli', ['-p', String(redis.port), 'FLUSHALL']).status, 0);
    const three = await instance();
    assert.deepEqual(await balance(three), credited);
    assert.equal((await credit(three, 2, 'top-up-1')).status, 201, 'a repeat answers the same credit');
    assert.deepEqual(await balance(one), credited, 'and adds nothing');
    assert.equal(sql(`SELECT count(*) FROM "${schema}".entries WHERE type = 'credit' AND account_id = 'acct_alice'`), '3');
  });
});
