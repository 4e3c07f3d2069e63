import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { validateConfig } from '../../src/config/validate.js';
import { FileLedger } from '../../src/ledger/file.js';
import { MemoryLedger } from '../../src/ledger/memory.js';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { RedisLimiter } from '../../src/limiter/redis.js';
import type { Limiter } from '../../src/limiter/types.js';
import { Logger } from '../../src/log.js';
import { chatBody, postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * Found: an admin credit went to the limiter before the ledger, so a failed write left a
 * spendable credit that no history records, and a retry credited twice. A postpaid account
 * made prepaid started at minus its past spend in the memory store (after a restart) but at
 * its credit in Redis. Now: durable first, then live; `Idempotency-Key` makes a repeat answer
 * the same entry; a prepaid balance is credits less the charges made while prepaid.
 */

const ADMIN = 'admin-secret-credits';
const quiet = new Logger(() => {});

const config = (prepaid: boolean) => testConfig({
  plans: { p: { rpm: 1000, concurrency: 10 } },
  accounts: { acct_c: { plan: 'p', ...(prepaid ? { balanceUsd: 5 } : {}) }, acct_d: { plan: 'p', balanceUsd: 0 } },
  keys: { k_c: { account: 'acct_c', key: 'sk-c' } },
  models: { paid: { provider: 'mock', price: { inputPerMillion: 1000, outputPerMillion: 1000 } } },
  providers: { mock: { protocol: 'mock' } },
});

function admin(gw: Running) {
  return async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${gw.url}${path}`, {
      method, headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json', ...headers },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await res.text();
    return { status: res.status, body: text === '' ? null : (JSON.parse(text) as Record<string, any>) };
  };
}

const balanceOf = async (gw: Running) => (await admin(gw)('GET', '/admin/v1/accounts/acct_c')).body!.balance as number;

/** A ledger whose disk is full. */
class FullDisk extends MemoryLedger {
  full = false;
  override append(entry: LedgerEntry): void {
    if (this.full) throw new Error('ENOSPC: no space left on device');
    super.append(entry);
  }
}

/** A ledger that records an entry but loses its answer once (a connection cut after the commit). */
class LostAnswer extends MemoryLedger {
  loseNext = false;
  override append(entry: LedgerEntry): void {
    super.append(entry);
    if (this.loseNext) {
      this.loseNext = false;
      throw new Error('connection terminated unexpectedly');
    }
  }
}

describe('regression: admin credits were live before durable, and not idempotent', () => {
  test('a credit the ledger cannot record is refused (503) and credits nothing', async () => {
    const ledger = new FullDisk();
    const gw = await startGateway(config(true), { adminKey: ADMIN, ledger });
    try {
      assert.equal(await balanceOf(gw), 5);
      ledger.full = true;
      const refused = await admin(gw)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd: 10 });
      assert.equal(refused.status, 503);
      assert.equal(refused.body!.error.code, 'ledger_unavailable');
      assert.equal(await balanceOf(gw), 5, 'nothing spendable without a record');
      ledger.full = false;
      assert.equal((await admin(gw)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd: 10 })).status, 201);
      assert.equal(await balanceOf(gw), 15);
    } finally {
      await gw.close();
    }
  });

  test('Idempotency-Key: a repeat, sequential or concurrent, answers the same entry and credits once', async () => {
    const gw = await startGateway(config(true), { adminKey: ADMIN });
    try {
      const post = (key: string, amountUsd = 2) =>
        admin(gw)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd, note: 'top-up' }, { 'idempotency-key': key });
      const first = await post('topup-1');
      assert.equal(first.status, 201);
      const again = await post('topup-1');
      assert.equal(again.status, 201);
      assert.deepEqual(again.body, first.body);
      assert.equal(await balanceOf(gw), 7);
      const together = await Promise.all([post('topup-2'), post('topup-2'), post('topup-2')]);
      assert.deepEqual(together.map((r) => r.status), [201, 201, 201]);
      assert.equal(new Set(together.map((r) => r.body!.id)).size, 1);
      assert.equal(await balanceOf(gw), 9);
      const different = await post('topup-2', 3);
      assert.equal(different.status, 400, 'the same key for another amount');
      assert.equal(different.body!.error.param, 'Idempotency-Key');
      assert.equal((await admin(gw)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd: 1 }, { 'idempotency-key': 'bad key' })).status, 400);
      assert.equal(await balanceOf(gw), 9);
    } finally {
      await gw.close();
    }
  });

  test('a credit the ledger recorded though its answer was lost (a 503): the repeat with its Idempotency-Key makes it live, once, also after a restart (found in review: with the memory store it stayed unspendable until a restart)', async () => {
    const ledger = new LostAnswer();
    const gw = await startGateway(config(true), { adminKey: ADMIN, ledger });
    const post = (g: Running) => admin(g)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd: 10 }, { 'idempotency-key': 'lost-1' });
    try {
      ledger.loseNext = true;
      assert.equal((await post(gw)).status, 503);
      assert.equal(await balanceOf(gw), 5, 'not live: the gateway cannot know it was recorded');
      const again = await post(gw);
      assert.equal(again.status, 201);
      assert.equal(await balanceOf(gw), 15, 'the repeat found it recorded, and made it live');
      assert.equal((await post(gw)).status, 201);
      assert.equal(await balanceOf(gw), 15, 'once');
      // Another account's credit under the same key is its own (found in review: it was taken as applied).
      const other = await admin(gw)('POST', '/admin/v1/accounts/acct_d/credits', { amountUsd: 3 }, { 'idempotency-key': 'lost-1' });
      assert.equal(other.status, 201);
      assert.equal((await admin(gw)('GET', '/admin/v1/accounts/acct_d')).body!.balance, 3);
    } finally {
      await gw.close();
    }
    const restarted = await startGateway(config(true), { adminKey: ADMIN, ledger });
    try {
      assert.equal(await balanceOf(restarted), 15, 'restored from the ledger');
      assert.equal((await post(restarted)).status, 201);
      assert.equal(await balanceOf(restarted), 15, 'a repeat after the restart applies nothing more');
    } finally {
      await restarted.close();
    }
  });

  test('a repeat after a restart still credits once (the ledger remembers the key)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-credits-'));
    const first = await FileLedger.open(dir, { logger: quiet });
    let gw = await startGateway(config(true), { adminKey: ADMIN, ledger: first });
    const post = (g: Running) => admin(g)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd: 4 }, { 'idempotency-key': 'invoice-42' });
    const made = await post(gw);
    assert.equal(made.status, 201);
    await gw.close();
    await first.close();
    const second = await FileLedger.open(dir, { logger: quiet });
    gw = await startGateway(config(true), { adminKey: ADMIN, ledger: second });
    try {
      const repeat = await post(gw);
      assert.equal(repeat.status, 201);
      assert.equal(repeat.body!.id, made.body!.id);
      assert.equal(await balanceOf(gw), 9);
    } finally {
      await gw.close();
      await second.close();
    }
  });

  test('a postpaid account made prepaid starts at its credit, and keeps it across a restart (memory store)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-prepaid-'));
    const first = await FileLedger.open(dir, { logger: quiet });
    let gw = await startGateway(config(false), { adminKey: ADMIN, ledger: first });
    const spend = await postJson(`${gw.url}/v1/chat/completions`, 'sk-c', chatBody('paid', 'x'.repeat(400)));
    assert.equal(spend.status, 200);
    await spend.text();
    assert.equal(await balanceOf(gw), null);
    assert.deepEqual(await gw.gateway.reload(validated(config(true))), []);
    assert.equal(await balanceOf(gw), 5, 'its past (postpaid) spend is not taken from its new balance');
    await gw.close();
    await first.close();
    const second = await FileLedger.open(dir, { logger: quiet });
    gw = await startGateway(config(true), { adminKey: ADMIN, ledger: second });
    try {
      assert.equal(await balanceOf(gw), 5, 'the same after a restart');
    } finally {
      await gw.close();
      await second.close();
    }
  });
});

if (hasRedis) {
  describe('regression: admin credits with Redis', () => {
    const server = new RedisServer();
    const limiters: Limiter[] = [];
    const redis = () => {
      const lim = new RedisLimiter({ url: server.url, prefix: `cr${limiters.length}:`, timeoutMs: 1000 });
      limiters.push(lim);
      return lim;
    };
    before(async () => { await server.start(); });
    after(async () => {
      for (const lim of limiters) await lim.close();
      await server.stop();
    });

    test('Idempotency-Key credits once; a postpaid account made prepaid starts at its credit (the same rule as memory)', async () => {
      const limiter = redis();
      await (limiter as RedisLimiter).whenReady(3000);
      const gw = await startGateway(config(false), { adminKey: ADMIN, limiter });
      try {
        const spend = await postJson(`${gw.url}/v1/chat/completions`, 'sk-c', chatBody('paid', 'x'.repeat(400)));
        assert.equal(spend.status, 200);
        await spend.text();
        assert.deepEqual(await gw.gateway.reload(validated(config(true))), []);
        for (let i = 0; i < 50 && (await balanceOf(gw)) !== 5; i++) await new Promise((r) => setTimeout(r, 20));
        assert.equal(await balanceOf(gw), 5);
        const post = () => admin(gw)('POST', '/admin/v1/accounts/acct_c/credits', { amountUsd: 1 }, { 'idempotency-key': 'r-1' });
        const [a, b] = [await post(), await post()];
        assert.equal(b.body!.id, a.body!.id);
        assert.equal(await balanceOf(gw), 6);
      } finally {
        await gw.close();
      }
    });
  });
} else {
  test('regression: admin credits with Redis', (t) => t.skip('redis-server is not installed'));
}

/** The gateway's reload takes a validated config. */
function validated(raw: Record<string, unknown>) {
  const r = validateConfig(raw, { baseDir: process.cwd(), env: {} });
  if (!r.ok) throw new Error(r.errors.join('; '));
  return r.config;
}
