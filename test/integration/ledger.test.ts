import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { FileLedger } from '../../src/ledger/file.js';
import { Logger } from '../../src/log.js';
import { rng } from '../helpers/fake-clock.js';
import { chatBody, chatReceivedWhole, postJson, startGateway, testConfig } from '../helpers/gateway.js';
import { spawnListening } from '../helpers/spawn.js';

const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');
const quiet = new Logger(() => {});
const get = async (url: string, key: string) => {
  const res = await fetch(url, { headers: { 'x-api-key': key } });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> & { data: Array<Record<string, unknown>> } };
};

const prepaid = () => testConfig({
  accounts: { acct_bob: { plan: 'pro', balanceUsd: 1 } },
  keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' }, key_bob2: { account: 'acct_bob', key: 'sk-bob2' } },
});

describe('account endpoints', () => {
  test('/v1/usage groups by day, model and key; bad parameters are 400', async () => {
    const gw = await startGateway(prepaid());
    try {
      for (const [key, model] of [['sk-bob', 'paid-1'], ['sk-bob', 'echo-1'], ['sk-bob2', 'paid-1']] as const) {
        await (await postJson(`${gw.url}/v1/chat/completions`, key, chatBody(model, 'x'.repeat(40)))).text();
      }
      const today = new Date().toISOString().slice(0, 10);
      const byDay = await get(`${gw.url}/v1/usage`, 'sk-bob');
      assert.deepEqual(byDay.body, { object: 'list', data: [
        { date: today, model: null, key_id: null, requests: 3, input_tokens: 30, output_tokens: 30, cost: 0.00006 },
      ] });
      const byModel = await get(`${gw.url}/v1/usage?group_by=model&start=${today}&end=${today}`, 'sk-bob');
      assert.deepEqual(byModel.body.data.map((r) => [r.model, r.requests, r.cost, r.date]), [['echo-1', 1, 0, null], ['paid-1', 2, 0.00006, null]]);
      const byKey = await get(`${gw.url}/v1/usage?group_by=key`, 'sk-bob');
      assert.deepEqual(byKey.body.data.map((r) => [r.key_id, r.requests]), [['key_bob', 2], ['key_bob2', 1]]);
      const empty = await get(`${gw.url}/v1/usage?start=2020-01-01&end=2020-01-31`, 'sk-bob');
      assert.deepEqual(empty.body.data, []);
      for (const query of ['start=2026-02-30', 'end=yesterday', 'start=2026-03-02&end=2026-03-01', 'group_by=hour',
        'start=2020-01-01&end=2024-01-01']) {
        const bad = await get(`${gw.url}/v1/usage?${query}`, 'sk-bob');
        assert.equal(bad.status, 400, query);
        assert.equal((bad.body.error as Record<string, unknown>).code, 'invalid_request');
        assert.ok((bad.body.error as Record<string, unknown>).param, query);
      }
    } finally {
      await gw.close();
    }
  });

  test('/v1/billing/history: credits and charges newest first, cursor pages, limit checked', async () => {
    const gw = await startGateway(prepaid());
    try {
      for (let i = 0; i < 3; i++) await (await postJson(`${gw.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', 'x'.repeat(40)))).text();
      const page = await get(`${gw.url}/v1/billing/history?limit=2`, 'sk-bob');
      assert.equal(page.body.object, 'list');
      assert.equal(page.body.has_more, true);
      const [newest] = page.body.data;
      assert.deepEqual(Object.keys(newest!).sort(), ['amount', 'balance_after', 'created_at', 'deployment', 'estimated', 'id', 'model', 'request_id', 'type']);
      assert.equal(newest!.type, 'charge');
      assert.equal(newest!.deployment, 'mock', 'the provider that served the call');
      assert.equal(newest!.amount, -0.00003);
      assert.equal(newest!.balance_after, 0.99991);
      assert.equal(newest!.model, 'paid-1');
      const next = await get(`${gw.url}/v1/billing/history?limit=2&after=${page.body.next_cursor}`, 'sk-bob');
      assert.deepEqual(next.body.data.map((e) => e.type), ['charge', 'credit']);
      assert.equal(next.body.has_more, false);
      assert.equal(next.body.next_cursor, null);
      assert.equal(next.body.data[1]!.amount, 1);
      for (const query of ['limit=0', 'limit=101', 'limit=ten', 'after=nonsense']) {
        assert.equal((await get(`${gw.url}/v1/billing/history?${query}`, 'sk-bob')).status, 400, query);
      }
    } finally {
      await gw.close();
    }
  });

  test('a restart on the file ledger keeps balances and the daily cap, and credits balanceUsd only once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-restart-'));
    const config = testConfig({
      plans: { capped: { rpm: 1000, concurrency: 10, dailyCapUsd: 0.0001 } },
      accounts: { acct_bob: { plan: 'capped', balanceUsd: 1 } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
    });
    const first = await startGateway(config, { ledger: await FileLedger.open(dir, { logger: quiet }) });
    for (let i = 0; i < 4; i++) await (await postJson(`${first.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1', 'x'.repeat(40)))).text();
    const before = (await get(`${first.url}/v1/balance`, 'sk-bob')).body;
    await first.close();
    await first.gateway.ledger.close();

    const second = await startGateway(config, { ledger: await FileLedger.open(dir, { logger: quiet }) });
    try {
      assert.deepEqual((await get(`${second.url}/v1/balance`, 'sk-bob')).body, before);
      assert.equal(before.daily_spend, 0.00012);
      const capped = await postJson(`${second.url}/v1/chat/completions`, 'sk-bob', chatBody('paid-1'));
      assert.equal(capped.status, 402, 'the cap holds across the restart');
      const history = (await get(`${second.url}/v1/billing/history?limit=100`, 'sk-bob')).body.data;
      assert.equal(history.filter((e) => e.type === 'credit').length, 1);
    } finally {
      await second.close();
      await second.gateway.ledger.close();
    }
  });
});

describe('crash safety', () => {
  test('kill -9 during billable load: every answer the client received whole is charged, once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-crash-'));
    const configFile = join(dir, 'config.json');
    writeFileSync(configFile, JSON.stringify(testConfig({
      ledger: { store: 'file', dir: join(dir, 'ledger') },
      plans: { p: { rpm: 1_000_000, concurrency: 1000 } },
      accounts: { acct_bob: { plan: 'p', balanceUsd: 100 } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
      providers: { mock: { protocol: 'mock', tokensPerSecond: 2000 }, slow: { protocol: 'mock' } },
    })));
    const r = rng(42);
    const completed = new Set<string>();
    for (let round = 0; round < 3; round++) {
      const { child, url, exited } = await spawnListening(process.execPath, [MAIN, '--config', configFile, '--port', '0']);
      let stop = false;
      const worker = async () => {
        while (!stop) {
          const id = await chatReceivedWhole(url, 'sk-bob', 'paid-1', r);
          if (id !== null) completed.add(id);
        }
      };
      const workers = Array.from({ length: 8 }, worker);
      await new Promise((resolve) => setTimeout(resolve, 300 + r() * 500));
      child.kill('SIGKILL');
      await exited;
      stop = true;
      await Promise.all(workers);
    }
    assert.ok(completed.size > 20, `only ${completed.size} requests completed`);

    const ledger = await FileLedger.open(join(dir, 'ledger'), { logger: quiet });
    const charges = new Map<string, number>();
    let total = 0;
    let after: string | null = null;
    for (;;) {
      const page = await ledger.history('acct_bob', 100, after);
      for (const e of page.entries) {
        if (e.type !== 'charge') continue;
        charges.set(e.requestId!, (charges.get(e.requestId!) ?? 0) + 1);
        total += e.amountMicro;
      }
      if (!page.hasMore) break;
      after = page.nextCursor;
    }
    for (const id of completed) assert.equal(charges.get(id), 1, `request ${id} answered whole but charged ${charges.get(id) ?? 0} times`);
    for (const [id, count] of charges) assert.equal(count, 1, `request ${id} charged ${count} times`);
    assert.equal(ledger.totals().get('acct_bob')!.balanceMicro, 100_000_000 + total, 'the balance is the credit minus the charges');
    await ledger.close();
  });
});
