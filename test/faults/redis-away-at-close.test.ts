import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { systemClock } from '../../src/clock.js';
import { RedisLimiter } from '../../src/limiter/redis.js';
import { RedisCooldowns } from '../../src/routing/redis-cooldowns.js';
import { freePort, hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * A drain ends even when Redis is away: closing the limiter and the shared cooldowns does not
 * wait for a Redis that is down (the client keeps reconnecting), gone, or frozen (QUIT never
 * answered). Before, close() waited on QUIT for ever, and SIGTERM never ended the process.
 */
describe('fault: Redis away when the gateway closes', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  after(() => server.stop());

  const closesWithin = async (close: () => Promise<void>, ms: number, what: string) => {
    const t0 = Date.now();
    const outcome = await Promise.race([close().then(() => 'closed'), new Promise((r) => setTimeout(() => r('still waiting'), 5000))]);
    assert.equal(outcome, 'closed', what);
    assert.ok(Date.now() - t0 < ms, `${what}: closed in ${Date.now() - t0} ms`);
  };

  test('nothing listening: the clients keep reconnecting, and close returns at once', async () => {
    const url = `redis://127.0.0.1:${await freePort()}`;
    const limiter = new RedisLimiter({ url, prefix: 'c:', timeoutMs: 300 });
    const cooldowns = new RedisCooldowns({ url, prefix: 'c:', clock: systemClock });
    await new Promise((r) => setTimeout(r, 300)); // a few reconnects
    await closesWithin(() => limiter.close(), 1000, 'limiter');
    await closesWithin(() => cooldowns.close(), 1000, 'cooldowns');
  });

  test('Redis killed, then frozen: close returns within its deadline', async () => {
    await server.start();
    const gone = new RedisLimiter({ url: server.url, prefix: 'c:', timeoutMs: 300 });
    await gone.whenReady(3000);
    await server.stop();
    await closesWithin(() => gone.close(), 1000, 'killed');

    await server.start();
    const frozen = new RedisLimiter({ url: server.url, prefix: 'c:', timeoutMs: 300 });
    const cooldowns = new RedisCooldowns({ url: server.url, prefix: 'c:', clock: systemClock });
    await frozen.whenReady(3000);
    await cooldowns.whenReady(3000);
    server.pause();
    try {
      await closesWithin(() => frozen.close(), 1500, 'frozen limiter');
      await closesWithin(() => cooldowns.close(), 2500, 'frozen cooldowns');
    } finally {
      server.resume();
    }
  });
});
