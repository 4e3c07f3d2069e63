import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createGateway, type EmbeddedGateway } from '../../src/create.js';
import { Logger } from '../../src/log.js';
import { chatBody, postJson, testConfig } from '../helpers/gateway.js';
import { dropSchema, freshSchema, noPostgres, PG_URL, sql } from '../helpers/postgres.js';

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
    for (const v of views) {
      v.page2 = (await get(`${instances[1]!.url}/v1/billing/history?limit=3&after=${(v.history as { next_cursor: string }).next_cursor}`, 'sk-alice')).body;
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
});
