import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { AdminStore } from '../../src/admin/state.js';
import { validateConfig } from '../../src/config/validate.js';
import { FileLedger } from '../../src/ledger/file.js';
import { Logger } from '../../src/log.js';
import { startGateway, testConfig, type Running } from '../helpers/gateway.js';

const ADMIN = 'admin-secret-1';
const quiet = new Logger(() => {});

function api(gw: Running, key: string | null) {
  return async (method: string, path: string, body?: unknown) => {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (key !== null) headers.authorization = `Bearer ${key}`;
    const res = await fetch(`${gw.url}${path}`, { method, headers, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
    const text = await res.text();
    return { status: res.status, body: text === '' ? null : (JSON.parse(text) as Record<string, any>) };
  };
}

describe('admin API', () => {
  test('without MODEL_GATEWAY_ADMIN_KEY every /admin/ path is 404', async () => {
    const gw = await startGateway();
    try {
      assert.equal((await api(gw, ADMIN)('GET', '/admin/v1/keys')).status, 404);
    } finally {
      await gw.close();
    }
  });

  test('admin key required: none or wrong 401, an ordinary key 403', async () => {
    const gw = await startGateway(testConfig(), { adminKey: ADMIN });
    try {
      assert.equal((await api(gw, null)('GET', '/admin/v1/keys')).status, 401);
      assert.equal((await api(gw, 'nope')('GET', '/admin/v1/keys')).status, 401);
      const ordinary = await api(gw, 'sk-alice')('GET', '/admin/v1/keys');
      assert.equal(ordinary.status, 403);
      assert.equal(ordinary.body!.error.code, 'permission_denied');
      assert.equal((await api(gw, ADMIN)('GET', '/admin/v1/keys')).status, 200);
    } finally {
      await gw.close();
    }
  });

  test('keys: create (plaintext once), list without secrets, patch, delete — each live at once, durable across a restart', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-admin-'));
    const store = () => new AdminStore(join(dir, 'admin-state.json'));
    const gw = await startGateway(testConfig(), { adminKey: ADMIN, adminStore: store() });
    const admin = api(gw, ADMIN);
    let plaintext = '';
    try {
      const created = await admin('POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_new', models: ['echo-1'], rpm: 50 });
      assert.equal(created.status, 201);
      plaintext = created.body!.key;
      assert.match(plaintext, /^sk-mg-/);
      assert.deepEqual({ ...created.body, key: undefined, created_at: undefined }, {
        id: 'key_new', account: 'acct_bob', models: ['echo-1'], rpm: 50, concurrency: null, disabled: false, key: undefined, created_at: undefined,
      });
      const models = await api(gw, plaintext)('GET', '/v1/models');
      assert.equal(models.status, 200);
      assert.deepEqual(models.body!.data.map((m: { id: string }) => m.id), ['echo-1']);

      const list = await admin('GET', '/admin/v1/keys');
      assert.deepEqual(list.body!.data.map((k: { id: string }) => k.id), ['key_alice', 'key_alice_narrow', 'key_bob', 'key_new', 'key_off']);
      assert.ok(!JSON.stringify(list.body).match(/sha256|sk-/), 'no secrets, no hashes');

      assert.equal((await admin('POST', '/admin/v1/keys', { account: 'acct_bob', id: 'key_new' })).status, 400);
      const unknownAccount = await admin('POST', '/admin/v1/keys', { account: 'acct_nobody' });
      assert.equal(unknownAccount.status, 400);
      assert.equal(unknownAccount.body!.error.param, 'account');
      const unknownField = await admin('POST', '/admin/v1/keys', { account: 'acct_bob', colour: 'red' });
      assert.equal(unknownField.body!.error.param, 'colour');

      const patched = await admin('PATCH', '/admin/v1/keys/key_alice', { models: ['paid-1'] });
      assert.equal(patched.status, 200);
      assert.deepEqual(patched.body!.models, ['paid-1']);
      assert.deepEqual((await api(gw, 'sk-alice')('GET', '/v1/models')).body!.data.map((m: { id: string }) => m.id), ['paid-1']);
      assert.equal((await admin('PATCH', '/admin/v1/keys/key_bob', { disabled: true })).status, 200);
      assert.equal((await api(gw, 'sk-bob')('GET', '/v1/models')).status, 401, 'a disabled key stops at once');
      assert.equal((await admin('PATCH', '/admin/v1/keys/ghost', { disabled: true })).status, 404);
      assert.equal((await admin('DELETE', '/admin/v1/keys/key_alice_narrow')).status, 204);
      assert.equal((await api(gw, 'sk-alice-narrow')('GET', '/v1/models')).status, 401, 'a deleted key stops at once');
      assert.equal((await admin('DELETE', '/admin/v1/keys/key_alice_narrow')).status, 404);

      // A SIGHUP-style reload of the file config does not undo admin changes.
      const file = validateConfig(testConfig(), { baseDir: '/', env: {} });
      assert.ok(file.ok);
      assert.deepEqual(await gw.gateway.reload(file.config), []);
      assert.equal((await api(gw, 'sk-bob')('GET', '/v1/models')).status, 401);
      assert.equal((await api(gw, plaintext)('GET', '/v1/models')).status, 200);
    } finally {
      await gw.close();
    }
    const again = await startGateway(testConfig(), { adminKey: ADMIN, adminStore: store() });
    try {
      assert.equal((await api(again, plaintext)('GET', '/v1/models')).status, 200, 'survives a restart');
      assert.equal((await api(again, 'sk-bob')('GET', '/v1/models')).status, 401);
      assert.equal((await api(again, 'sk-alice-narrow')('GET', '/v1/models')).status, 401);
    } finally {
      await again.close();
    }
  });

  test('a key deleted while its request\'s body is still arriving: the call is refused 401, never admitted (found in review: the key looked up at the headers was used)', async () => {
    const gw = await startGateway(testConfig(), { adminKey: ADMIN });
    const { connect } = await import('node:net');
    const { port } = new URL(gw.url);
    const s = connect(Number(port), '127.0.0.1');
    try {
      await new Promise((r) => s.once('connect', r));
      let text = '';
      s.on('data', (d: Buffer) => { text += d.toString(); });
      const body = JSON.stringify({ model: 'echo-1', messages: [{ role: 'user', content: 'hi' }] });
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-alice\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body.slice(0, 10)}`);
      await new Promise((r) => setTimeout(r, 50));
      assert.equal((await api(gw, ADMIN)('DELETE', '/admin/v1/keys/key_alice')).status, 204);
      s.end(body.slice(10));
      await new Promise((r) => s.once('close', r));
      assert.match(text, /^HTTP\/1\.1 401 /);
      assert.match(text, /"code":"invalid_api_key"/);
    } finally {
      s.destroy();
      await gw.close();
    }
  });

  test('a credit whose account a reload removes while its body is still arriving: 404, not a 500 (found in review)', async () => {
    const withX = (extra: boolean) => testConfig(extra ? { accounts: { ...(testConfig().accounts as object), acct_x: { plan: 'pro', balanceUsd: 1 } } } : {});
    const gw = await startGateway(withX(true), { adminKey: ADMIN });
    const { connect } = await import('node:net');
    const s = connect(Number(new URL(gw.url).port), '127.0.0.1');
    try {
      await new Promise((r) => s.once('connect', r));
      let text = '';
      s.on('data', (d: Buffer) => { text += d.toString(); });
      const body = JSON.stringify({ amountUsd: 5 });
      s.write(`POST /admin/v1/accounts/acct_x/credits HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body.slice(0, 5)}`);
      await new Promise((r) => setTimeout(r, 50));
      const file = validateConfig(withX(false), { baseDir: '/', env: {} });
      assert.ok(file.ok);
      assert.deepEqual(await gw.gateway.reload(file.config), []);
      s.end(body.slice(5));
      await new Promise((r) => s.once('close', r));
      assert.match(text, /^HTTP\/1\.1 404 /);
    } finally {
      s.destroy();
      await gw.close();
    }
  });

  test('plans and accounts: created or replaced, applied to the next request with counters kept; admin calls are not counted', async () => {
    const gw = await startGateway(testConfig(), { adminKey: ADMIN });
    const admin = api(gw, ADMIN);
    try {
      const plan = await admin('PUT', '/admin/v1/plans/tight', { rpm: 2, concurrency: 1 });
      assert.deepEqual(plan.body, { name: 'tight', rpm: 2, concurrency: 1, dailyCapUsd: null });
      assert.equal((await admin('PUT', '/admin/v1/plans/bad', { rpm: -1, concurrency: 1 })).body!.error.param, 'rpm');
      assert.equal((await admin('PUT', '/admin/v1/plans/bad', { concurrency: 1 })).body!.error.param, 'rpm');
      const alice = api(gw, 'sk-alice');
      assert.equal((await alice('GET', '/v1/models')).status, 200); // counted under the old plan
      const moved = await admin('PUT', '/admin/v1/accounts/acct_alice', { plan: 'tight' });
      assert.equal(moved.status, 200);
      assert.equal(moved.body!.plan, 'tight');
      assert.equal((await alice('GET', '/v1/models')).status, 200);
      for (let i = 0; i < 3; i++) assert.equal((await admin('GET', '/admin/v1/accounts/acct_alice')).status, 200);
      assert.equal((await alice('GET', '/v1/models')).status, 429, 'rpm 2, the earlier request still counts');
      assert.equal((await admin('PUT', '/admin/v1/accounts/acct_x', { plan: 'gold' })).body!.error.param, 'plan');
      assert.equal((await admin('GET', '/admin/v1/accounts/acct_nobody')).status, 404);
      // An account put back as GET shows it keeps its plan's limits: null is "not set", only
      // "unlimited" lifts one (found in review: the round trip lifted all three).
      const read = (await admin('GET', '/admin/v1/accounts/acct_alice')).body!;
      assert.deepEqual([read.rpm, read.concurrency, read.dailyCapUsd], [null, null, null]);
      const back = await admin('PUT', '/admin/v1/accounts/acct_alice', { plan: read.plan, rpm: null, concurrency: null, dailyCapUsd: null });
      assert.deepEqual([back.body!.rpm, back.body!.concurrency, back.body!.dailyCapUsd], [null, null, null]);
      assert.equal((await alice('GET', '/v1/models')).status, 429, 'still the plan\'s rpm 2');
      const lifted = await admin('PUT', '/admin/v1/accounts/acct_alice', { plan: 'tight', rpm: 'unlimited' });
      assert.equal(lifted.body!.rpm, 'unlimited');
      assert.equal((await alice('GET', '/v1/models')).status, 200);
    } finally {
      await gw.close();
    }
  });

  test('credits: a prepaid account gets a credit entry; postpaid or non-positive amounts are 400', async () => {
    const ledger = await FileLedger.open(mkdtempSync(join(tmpdir(), 'mg-credit-')), { logger: quiet });
    const gw = await startGateway(testConfig(), { adminKey: ADMIN, ledger });
    const admin = api(gw, ADMIN);
    try {
      const created = await admin('PUT', '/admin/v1/accounts/acct_new', { plan: 'pro', prepaid: true });
      assert.equal(created.status, 200);
      assert.deepEqual(created.body, {
        id: 'acct_new', plan: 'pro', rpm: null, concurrency: null, dailyCapUsd: null, prepaid: true, balance: 0, daily_spend: 0, in_flight: 0,
      });
      const credit = await admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: '12.5', note: 'invoice 7' });
      assert.equal(credit.status, 201);
      assert.equal(credit.body!.type, 'credit');
      assert.equal(credit.body!.amount, 12.5);
      assert.equal(credit.body!.balance_after, 12.5);
      assert.equal(credit.body!.note, 'invoice 7');
      const key = await admin('POST', '/admin/v1/keys', { account: 'acct_new' });
      const history = await api(gw, key.body!.key)('GET', '/v1/billing/history');
      assert.equal(history.body!.data[0].id, credit.body!.id);
      assert.equal((await admin('GET', '/admin/v1/accounts/acct_new')).body!.balance, 12.5);
      // Credits at once: each shows the balance after it, one after the other (found in review: they all showed 13.5).
      const together = await Promise.all([1, 2, 3].map((usd) => admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: usd })));
      assert.deepEqual(together.map((r) => r.status), [201, 201, 201]);
      assert.deepEqual(together.map((r) => r.body!.balance_after).sort((a, b) => a - b), [13.5, 15.5, 18.5]);
      assert.equal((await admin('GET', '/admin/v1/accounts/acct_new')).body!.balance, 18.5);
      assert.equal((await admin('POST', '/admin/v1/accounts/acct_bob/credits', { amountUsd: 1 })).status, 400);
      assert.equal((await admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: 0 })).status, 400);
      assert.match((await admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: 1e10 })).body!.error.message, /"amountUsd" is too large/);
      // A wrong method on an account or its credits is 405 with the methods of that path (found in review: 404s).
      for (const [method, path, allow] of [
        ['GET', '/admin/v1/accounts/acct_new/credits', 'POST'], ['PUT', '/admin/v1/accounts/acct_new/credits', 'POST'],
        ['POST', '/admin/v1/accounts/acct_new', 'GET, PUT'], ['DELETE', '/admin/v1/accounts/acct_new', 'GET, PUT'],
      ] as const) {
        const res = await fetch(`${gw.url}${path}`, { method, headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' }, body: method === 'GET' ? undefined : '{}' });
        assert.deepEqual([res.status, res.headers.get('allow')], [405, allow], `${method} ${path}`);
        await res.text();
      }
      assert.equal((await admin('POST', '/admin/v1/accounts/acct_nobody/credits', { amountUsd: 1 })).status, 404);
      for (const note of ['nul\u0000byte', 'line\nbreak', 'x'.repeat(1001), 7]) {
        assert.equal((await admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: 1, note })).status, 400, JSON.stringify(note));
      }
      assert.equal((await admin('POST', '/admin/v1/accounts/acct_none/credits', { amountUsd: 1 })).status, 404);
      // Each amount is a safe integer of micro-dollars, their sum is not: the second is refused
      // (the books would hold a balance the next start refuses to restore).
      assert.equal((await admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: 9_000_000_000 })).status, 201);
      const over = await admin('POST', '/admin/v1/accounts/acct_new/credits', { amountUsd: 9_000_000_000 });
      assert.equal(over.status, 400);
      assert.equal(over.body!.error.param, 'amountUsd');
      assert.equal((await admin('GET', '/admin/v1/accounts/acct_new')).body!.balance, 9_000_000_018.5);
      // Replacing the account keeps it prepaid and keeps its balance.
      await admin('PUT', '/admin/v1/accounts/acct_new', { plan: 'free', prepaid: false });
      assert.equal((await admin('GET', '/admin/v1/accounts/acct_new')).body!.prepaid, true);
    } finally {
      await gw.close();
      await ledger.close();
    }
  });
});
