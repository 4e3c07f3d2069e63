import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { startGateway, testConfig } from '../helpers/gateway.js';

/**
 * Found: an RPM window was a Float64Array of `rpm` slots, allocated at the first request:
 * rpm 1e9 (allowed by the config) was 8 GB per account, and the admin API had no bound at
 * all (a RangeError, answered 500 for every call of that plan). Now a window's memory follows
 * the admissions in it, and limits above 1e9 are refused.
 */

const ADMIN = 'admin-secret-rpm';

async function call(url: string, method: string, path: string, key: string, body?: unknown) {
  const res = await fetch(`${url}${path}`, {
    method, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  return { status: res.status, body: text === '' ? null : (JSON.parse(text) as Record<string, any>) };
}

describe('regression: RPM windows were allocated by the limit, not by use', () => {
  test('a plan with rpm 1e9 costs what its admissions cost; above 1e9 is refused', async () => {
    const gw = await startGateway(testConfig({
      plans: { huge: { rpm: 1_000_000_000, concurrency: 'unlimited' } },
      accounts: { acct_h: { plan: 'huge' } },
      keys: { k_h: { account: 'acct_h', key: 'sk-huge', rpm: 1_000_000_000 } },
    }), { adminKey: ADMIN });
    try {
      const before = process.memoryUsage().arrayBuffers;
      for (let i = 0; i < 20; i++) assert.equal((await call(gw.url, 'GET', '/v1/models', 'sk-huge')).status, 200);
      // The admin API's plans and accounts get the same bound as the config file.
      const tooBig = await call(gw.url, 'PUT', '/admin/v1/plans/bigger', ADMIN, { rpm: 1e12, concurrency: 10 });
      assert.equal(tooBig.status, 400);
      assert.equal(tooBig.body!.error.param, 'rpm');
      assert.equal((await call(gw.url, 'PUT', '/admin/v1/plans/big', ADMIN, { rpm: 1e9, concurrency: 1e9 })).status, 200);
      assert.equal((await call(gw.url, 'PUT', '/admin/v1/accounts/acct_b', ADMIN, { plan: 'big' })).status, 200);
      const key = await call(gw.url, 'POST', '/admin/v1/keys', ADMIN, { account: 'acct_b' });
      assert.equal(key.status, 201);
      for (let i = 0; i < 20; i++) assert.equal((await call(gw.url, 'GET', '/v1/models', key.body!.key as string)).status, 200);
      const grown = process.memoryUsage().arrayBuffers - before;
      assert.ok(grown < 1_000_000, `array buffers grew by ${grown} bytes for 40 admissions`);
    } finally {
      await gw.close();
    }
  });
});
