import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { Socket } from 'node:net';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createGateway, type EmbeddedGateway } from '../../src/create.js';
import { creditEntry } from '../../src/billing/entries.js';
import { Logger } from '../../src/log.js';
import { rng } from '../helpers/fake-clock.js';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { chatBody, chatReceivedWhole, postJson, testConfig, until } from '../helpers/gateway.js';
import { dropSchema, freshSchema, noPostgres, noPrivateCluster, PG_URL, PostgresServer, sql } from '../helpers/postgres.js';
import { spawnListening } from '../helpers/spawn.js';

const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');

describe('PostgreSQL away: 503 before going upstream, then back by itself', { skip: noPrivateCluster }, () => {
  const pg = new PostgresServer();
  const provider = new FakeUpstream();
  let gw: EmbeddedGateway;
  let url: string;
  before(async () => {
    await pg.start();
    const base = await provider.start();
    provider.fallback = (_req, res) => json(res, 200, openaiCompletion('ok'));
    gw = await createGateway(testConfig({
      ledger: { store: 'postgres', url: pg.url },
      accounts: { acct_alice: { plan: 'pro', balanceUsd: 10 }, acct_bob: { plan: 'free' } }, // alice prepaid: admin credits apply
      models: { 'paid-1': { provider: 'up', price: { inputPerMillion: 1, outputPerMillion: 2 } }, 'echo-1': { provider: 'up', price: 'free' } },
      providers: { up: { protocol: 'openai', baseUrl: `${base}/v1` } },
    }), { logger: new Logger(() => {}), adminKey: 'admin-pg-outage' });
    url = await gw.listen(0, '127.0.0.1');
  });
  after(async () => {
    await gw.close();
    await provider.close();
    await pg.remove();
  });

  const call = () => postJson(`${url}/v1/chat/completions`, 'sk-alice', chatBody('paid-1'));
  const ready = async () => (await fetch(`${url}/readyz`)).status === 200;

  test('calls are refused with ledger_unavailable and Retry-After while it is away; /v1/models keeps working; nothing is lost', async () => {
    let res = await call();
    assert.equal(res.status, 200);
    await res.arrayBuffer();

    pg.stop();
    await until(async () => !(await ready()), 5000, '/readyz to say the ledger is away');
    const body = await (await fetch(`${url}/readyz`)).json() as Record<string, unknown>;
    assert.match(JSON.stringify(body), /ledger_unavailable/);
    const hits = provider.hits;
    res = await call();
    assert.equal(res.status, 503);
    assert.ok(Number(res.headers.get('retry-after')) >= 1);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'ledger_unavailable');
    assert.equal(provider.hits, hits, 'nothing was sent upstream');
    const models = await fetch(`${url}/v1/models`, { headers: { authorization: 'Bearer sk-alice' } });
    assert.equal(models.status, 200);
    await models.arrayBuffer();
    // An admin credit refused while it is away is not written later: the admin was told it failed.
    const credit = await fetch(`${url}/admin/v1/accounts/acct_alice/credits`, {
      method: 'POST', headers: { authorization: 'Bearer admin-pg-outage', 'content-type': 'application/json' }, body: JSON.stringify({ amountUsd: 7.77 }),
    });
    assert.equal(credit.status, 503);
    await credit.arrayBuffer();
    // The initial credit of an account (a reload added it): the limiter gave it already, so its
    // entry waits for the database like a call's.
    const initial = creditEntry({
      accountId: 'acct_alice', amountMicro: 4_440_000, balanceAfterMicro: 4_440_000, at: Date.now(), requestId: null,
      note: 'initial balance from config', idempotencyKey: null,
    });
    await assert.rejects(Promise.resolve(gw.gateway.ledger.append(initial)), (err: Error) => (err as { code?: string }).code === 'ledger_unavailable');

    await pg.start();
    await until(ready, 10_000, 'the ledger to come back by itself');
    res = await call();
    assert.equal(res.status, 200);
    await res.arrayBuffer();
    assert.equal(sql('SELECT count(*) FROM model_gateway.entries WHERE type = \'charge\'', pg.url), '2', 'both answered calls are recorded, once');
    assert.equal(sql('SELECT count(*) FROM model_gateway.entries WHERE amount_micro = 7770000', pg.url), '0', 'the refused credit was not written once the database came back');
    await until(async () => sql(`SELECT count(*) FROM model_gateway.entries WHERE id = '${initial.id}'`, pg.url) === '1', 5000, 'the initial credit written once it came back');
  });
});

describe('kill -9 of one of two instances on one PostgreSQL ledger, under load', { skip: noPostgres }, () => {
  const schema = freshSchema();
  after(() => dropSchema(schema));

  test('every answer received whole is charged once; nothing is charged twice', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-pg-crash-'));
    const configFile = join(dir, 'config.json');
    writeFileSync(configFile, JSON.stringify(testConfig({
      ledger: { store: 'postgres', url: PG_URL, schema },
      plans: { p: { rpm: 1_000_000, concurrency: 1000 } },
      accounts: { acct_bob: { plan: 'p' } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' } },
      providers: { mock: { protocol: 'mock', tokensPerSecond: 2000 }, slow: { protocol: 'mock' } },
    })));
    const start = () => spawnListening(process.execPath, [MAIN, '--config', configFile, '--port', '0']);
    const r = rng(9);
    const completed = new Set<string>();
    const survivor = await start();
    try {
      for (let round = 0; round < 2; round++) {
        const victim = await start();
        let stop = false;
        const worker = async (i: number) => {
          const url = i % 2 === 0 ? victim.url : survivor.url;
          while (!stop) {
            const id = await chatReceivedWhole(url, 'sk-bob', 'paid-1', r);
            if (id !== null) completed.add(id);
          }
        };
        const workers = Array.from({ length: 8 }, (_, i) => worker(i));
        await new Promise((resolve) => setTimeout(resolve, 400 + r() * 400));
        victim.child.kill('SIGKILL');
        await victim.exited;
        stop = true;
        await Promise.all(workers);
      }
    } finally {
      survivor.child.kill('SIGTERM');
      await survivor.exited;
    }
    assert.ok(completed.size > 20, `only ${completed.size} requests completed`);
    const counts = new Map(sql(`SELECT request_id || ' ' || count(*) FROM "${schema}".entries WHERE type = 'charge' GROUP BY request_id`)
      .split('\n').filter((l) => l !== '').map((l) => { const [id, n] = l.split(' '); return [id!, Number(n)]; }));
    for (const id of completed) assert.equal(counts.get(id), 1, `request ${id} answered whole but charged ${counts.get(id) ?? 0} times`);
    for (const [id, n] of counts) assert.equal(n, 1, `request ${id} charged ${n} times`);
    // The rollup agrees with the entries it was built from, in the same transactions.
    assert.equal(
      sql(`SELECT sum(requests) || ' ' || sum(cost_micro) FROM "${schema}".usage_daily`),
      sql(`SELECT count(*) || ' ' || -sum(amount_micro) FROM "${schema}".entries WHERE type <> 'credit'`),
    );
  });
});

describe('PostgreSQL frozen when the gateway closes', { skip: noPrivateCluster }, () => {
  const pg = new PostgresServer();
  after(async () => {
    try {
      pg.resume();
    } catch {
      // never started
    }
    await pg.remove();
  });

  test('the drain ends: closing the ledger and the admin state does not wait for a database that never answers', async () => {
    await pg.start();
    const gw = await createGateway(testConfig({ ledger: { store: 'postgres', url: pg.url } }), { logger: new Logger(() => {}), adminKey: 'admin-pg-frozen' });
    const url = await gw.listen(0, '127.0.0.1');
    const models = await fetch(`${url}/v1/models`, { headers: { authorization: 'Bearer sk-alice' } });
    assert.equal(models.status, 200);
    await models.arrayBuffer();
    try {
      pg.pause(); // its sockets stay open; nothing answers, nothing closes
      const t0 = Date.now();
      let timer: NodeJS.Timeout | undefined;
      const outcome = await Promise.race([gw.close().then(() => 'closed'), new Promise((r) => { timer = setTimeout(() => r('still waiting'), 15_000); })]);
      clearTimeout(timer);
      assert.equal(outcome, 'closed');
      assert.ok(Date.now() - t0 < 10_000, `closed in ${Date.now() - t0} ms`);
      // Nothing of the gateway's stays connected to the frozen database, so an embedding process
      // can end: open connections are cut at the close's deadline, and one still being made
      // gives up at its connection timeout (5 s). Node lists a process's open handles only
      // through this internal call.
      const toDatabase = () => (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles()
        .filter((h) => h instanceof Socket && !h.destroyed && h.remotePort === pg.port).length;
      await until(() => toDatabase() === 0, 7000, 'no connection to the frozen database left');
    } finally {
      pg.resume();
    }
  });
});
