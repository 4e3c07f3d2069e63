import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { AdminStore, type AdminState } from '../../src/admin/state.js';
import { validateConfig } from '../../src/config/validate.js';
import { sha, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found: admin state lived in plain objects keyed by id, so `constructor` or `toString` "existed"
 * (DELETE answered 204 and the key kept working) and `__proto__` reached Object.prototype (500s,
 * or a PATCH assigned to it); key-id uniqueness was checked outside the change queue (of 20
 * simultaneous creates of one id, 9 to 20 answered 201, each with a different key, and only the
 * last worked); a SIGHUP reload bypassed the queue and could undo an admin change in flight.
 */

const ADMIN = 'admin-secret-races';

function admin(gw: Running) {
  return async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${gw.url}${path}`, {
      method, headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await res.text();
    return { status: res.status, body: text === '' ? null : (JSON.parse(text) as Record<string, any>) };
  };
}

const models = async (gw: Running, key: string) => (await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).status;

describe('regression: admin ids were object keys, and admin changes raced', () => {
  test('__proto__, constructor and toString are ordinary ids; nothing reaches Object.prototype', async () => {
    // As a config file is read: JSON.parse makes "__proto__" an own key like any other.
    const config = JSON.parse(JSON.stringify(testConfig()).replace('"keys":{', '"keys":{"__proto__":{"account":"acct_alice","key":"sk-proto"},')) as Record<string, unknown>;
    assert.ok(Object.hasOwn(config.keys as object, '__proto__'));
    const gw = await startGateway(config, { adminKey: ADMIN });
    try {
      const call = admin(gw);
      assert.equal((await call('DELETE', '/admin/v1/keys/constructor')).status, 404);
      assert.equal((await call('PATCH', '/admin/v1/keys/toString', { disabled: true })).status, 404);
      assert.equal((await call('PUT', '/admin/v1/plans/__proto__', { rpm: 10, concurrency: 2 })).status, 200);
      assert.equal((await call('PUT', '/admin/v1/accounts/__proto__', { plan: '__proto__' })).status, 200);
      const created = await call('POST', '/admin/v1/keys', { id: 'constructor', account: '__proto__' });
      assert.equal(created.status, 201);
      assert.equal(await models(gw, created.body!.key as string), 200);
      // The config file's key named __proto__: patched, then deleted, like any other.
      assert.equal(await models(gw, 'sk-proto'), 200);
      const patched = await call('PATCH', '/admin/v1/keys/__proto__', { rpm: 3 });
      assert.equal(patched.status, 200);
      assert.equal(patched.body!.rpm, 3);
      assert.equal(({} as Record<string, unknown>).rpm, undefined, 'Object.prototype untouched');
      assert.equal((await call('DELETE', '/admin/v1/keys/__proto__')).status, 204);
      assert.equal(await models(gw, 'sk-proto'), 401);
      assert.equal((await call('DELETE', '/admin/v1/keys/constructor')).status, 204);
      assert.equal(await models(gw, created.body!.key as string), 401);
      const ids = ((await call('GET', '/admin/v1/keys')).body!.data as Array<{ id: string }>).map((k) => k.id);
      assert.ok(!ids.includes('constructor') && !ids.includes('__proto__'));
    } finally {
      await gw.close();
    }
  });

  test('ids of plans, accounts and keys have no "/" (they are path segments), in the file and the admin API alike', async () => {
    const r = validateConfig({ ...testConfig(), plans: { 'a/b': { rpm: 1 } } }, { baseDir: '/', env: {} });
    assert.ok(!r.ok && r.errors.some((e) => e.startsWith('plans["a/b"]: id must be 1 to 128 characters')), JSON.stringify(r));
    const gw = await startGateway(testConfig(), { adminKey: ADMIN });
    try {
      const plan = await admin(gw)('PUT', '/admin/v1/plans/a%2Fb', { rpm: 1, concurrency: 1 });
      assert.equal(plan.status, 400);
      assert.equal(plan.body!.error.param, 'name');
      const key = await admin(gw)('POST', '/admin/v1/keys', { id: 'k/1', account: 'acct_alice' });
      assert.equal(key.status, 400);
      assert.equal(key.body!.error.param, 'id');
    } finally {
      await gw.close();
    }
  });

  test('20 simultaneous creates of one key id: exactly one succeeds, and its key works', async () => {
    // Kept in a file, as in production: each change waits for an fsync, which is when the others arrive.
    const adminStore = new AdminStore(join(mkdtempSync(join(tmpdir(), 'mg-admin-dup-')), 'admin-state.json'));
    const gw = await startGateway(testConfig(), { adminKey: ADMIN, adminStore });
    try {
      const answers = await Promise.all(Array.from({ length: 20 }, () => admin(gw)('POST', '/admin/v1/keys', { id: 'dup', account: 'acct_alice' })));
      const created = answers.filter((a) => a.status === 201);
      assert.equal(created.length, 1);
      assert.ok(answers.every((a) => a.status === 201 || (a.status === 400 && a.body!.error.param === 'id')));
      assert.equal(await models(gw, created[0]!.body!.key as string), 200);
    } finally {
      await gw.close();
    }
  });

  test('a reload while an admin change is being saved undoes neither', async () => {
    // An admin store whose save we hold until the reload has been asked for.
    let release!: () => void;
    const held = new Promise<void>((r) => { release = r; });
    class SlowStore extends AdminStore {
      saving = false;
      override async save(state: AdminState): Promise<void> {
        this.saving = true;
        await held;
        return super.save(state);
      }
    }
    const store = new SlowStore(null);
    const v1 = testConfig({ plans: { free: { rpm: 5, concurrency: 2, dailyCapUsd: 1 }, pro: { rpm: 1000, concurrency: 50 } } });
    const gw = await startGateway(v1, { adminKey: ADMIN, adminStore: store });
    try {
      const change = admin(gw)('PUT', '/admin/v1/plans/extra', { rpm: 9, concurrency: 9 });
      await until(() => store.saving, 5000, 'the change waiting on its save');
      const v2 = validateConfig(testConfig({ plans: { free: { rpm: 7, concurrency: 2, dailyCapUsd: 1 }, pro: { rpm: 1000, concurrency: 50 } } }), { baseDir: '/', env: {} });
      assert.ok(v2.ok);
      const reloaded = gw.gateway.reload(v2.config);
      release();
      assert.equal((await change).status, 200);
      assert.deepEqual(await reloaded, []);
      assert.equal(gw.gateway.config.plans.get('extra')?.rpm, 9, 'the admin change stays');
      assert.equal(gw.gateway.config.plans.get('free')?.rpm, 7, 'the reload stays');
    } finally {
      await gw.close();
    }
  });

  test('an admin state file of the earlier version (objects keyed by id) is read by its own keys, and saved as pairs', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-admin-v1-'));
    const path = join(dir, 'admin-state.json');
    const key = { id: 'constructor', account: 'acct_alice', sha256: sha('sk-v1'), models: null, rpm: null, concurrency: null, disabled: false, createdAt: 1 };
    writeFileSync(path, `{"version":1,"plans":{},"accounts":{},"keys":{"constructor":${JSON.stringify(key)}},"keyPatches":{"__proto__":{"rpm":2}},"deletedKeys":[]}`);
    const store = new AdminStore(path);
    assert.deepEqual([...store.state.keys.keys()], ['constructor']);
    assert.deepEqual(store.state.keyPatches.get('__proto__'), { rpm: 2 });
    assert.equal(store.state.plans.has('toString'), false);
    await store.save(store.state);
    const saved = JSON.parse(readFileSync(path, 'utf8')) as { version: number; keys: unknown };
    assert.equal(saved.version, 2);
    assert.deepEqual(saved.keys, [['constructor', key]]);
    assert.deepEqual([...new AdminStore(path).state.keyPatches], [['__proto__', { rpm: 2 }]]);
  });
});
