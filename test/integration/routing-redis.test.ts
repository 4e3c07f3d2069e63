import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { createGateway, type EmbeddedGateway } from '../../src/create.js';
import { Logger } from '../../src/log.js';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { chatBody, postJson, testConfig, until } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

describe('cooldowns shared by instances on one Redis', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const redis = new RedisServer();
  const primary = new FakeUpstream();
  const fallback = new FakeUpstream();
  const prefix = `rt${Date.now()}:`;
  const started: EmbeddedGateway[] = [];
  let config: Record<string, unknown>;

  const instance = async () => {
    const gw = await createGateway(config, { logger: new Logger(() => {}) });
    const url = await gw.listen(0, '127.0.0.1');
    started.push(gw);
    return { gw, url };
  };
  const servedBy = async (url: string) => {
    const res = await postJson(`${url}/v1/chat/completions`, 'sk-alice', chatBody('pair'));
    assert.equal(res.status, 200);
    await res.arrayBuffer();
    return res.headers.get('x-gateway-deployment');
  };
  const pttl = (key: string) => Number(spawnSync('redis-cli', ['-p', String(redis.port), 'PTTL', key]).stdout.toString().trim());

  before(async () => {
    await redis.start();
    const [a, b] = [await primary.start(), await fallback.start()];
    for (const up of [primary, fallback]) up.fallback = (_req, res) => json(res, 200, openaiCompletion('ok'));
    config = testConfig({
      limiter: { store: 'redis', url: redis.url, prefix, timeoutMs: 500 },
      routing: { cooldownMs: 60_000 },
      keys: { key_alice: { account: 'acct_alice', key: 'sk-alice' } },
      models: { pair: { price: 'free', deployments: [{ provider: 'a' }, { provider: 'b', fallback: true }] } },
      providers: { a: { protocol: 'openai', baseUrl: `${a}/v1` }, b: { protocol: 'openai', baseUrl: `${b}/v1` } },
    });
  });
  after(async () => {
    await Promise.all(started.map((g) => g.close()));
    await Promise.all([primary.close(), fallback.close()]);
    await redis.stop();
  });

  test('a deployment that fails on one instance is skipped by the others, and by one that starts later', async () => {
    const one = await instance();
    const two = await instance();
    assert.equal(await servedBy(two.url), 'a');

    primary.queue.push((_req, res) => json(res, 503, { error: { message: 'overloaded' } }));
    assert.equal(await servedBy(one.url), 'b', 'instance one fails over');
    const key = `${prefix}cooldown:pair|a`;
    const ttl = pttl(key);
    assert.ok(ttl > 55_000 && ttl <= 60_000, `one key per deployment, living as long as its cooldown (PTTL ${ttl})`);

    // Instance two learns it from Redis, without a round trip on its own calls.
    await until(() => two.gw.gateway.cooldowns.until('pair|a') > 0, 2000, 'instance two to hear of the cooldown');
    const hits = primary.hits;
    assert.equal(await servedBy(two.url), 'b');
    const three = await instance();
    assert.equal(await servedBy(three.url), 'b', 'an instance started later reads the cooldowns already there');
    assert.equal(primary.hits, hits, 'no instance tried the deployment while it cooled down');

    // A longer cooldown on instance two (Retry-After: 600) extends it everywhere.
    const before = one.gw.gateway.cooldowns.until('pair|a');
    await two.gw.gateway.reload(two.gw.gateway.config); // a reload keeps them, too
    two.gw.gateway.cooldowns.start('pair|a', 600_000);
    await until(() => one.gw.gateway.cooldowns.until('pair|a') > before + 500_000, 2000, 'instance one to hear of the extension');
    assert.ok(pttl(key) > 590_000);
    // A shorter one changes nothing anywhere. (One connection runs its commands in order: once
    // instance two hears of the marker sent after it, the shorter one has run.)
    const extended = two.gw.gateway.cooldowns.until('pair|a');
    one.gw.gateway.cooldowns.start('pair|a', 1000);
    one.gw.gateway.cooldowns.start('marker|x', 60_000);
    await until(() => two.gw.gateway.cooldowns.until('marker|x') > 0, 2000, 'instance two to hear of the marker');
    assert.ok(pttl(key) > 590_000, 'the key kept its longer life');
    assert.equal(two.gw.gateway.cooldowns.until('pair|a'), extended, 'and no instance shortened it');
  });
});
