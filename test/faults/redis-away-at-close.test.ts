import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { systemClock } from '../../src/clock.js';
import { RedisLimiter } from '../../src/limiter/redis.js';
import { RedisCooldowns } from '../../src/routing/redis-cooldowns.js';
import { freePort, hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * A drain ends even when Redis is away: closing the limiter and the shared cooldowns does not
 * wait for a Redis that is down (the client keeps reconnecting), gone, or frozen (its answers
 * never come), and leaves no connection open behind it. Before, close() waited on QUIT for
 * ever, and SIGTERM never ended the process.
 */
describe('fault: Redis away when the gateway closes', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  after(() => server.stop());

  /** TCP sockets this process holds open. */
  const sockets = () => process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap').length;
  const closesWithin = async (close: () => Promise<void>, ms: number, what: string) => {
    const t0 = Date.now();
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([close().then(() => 'closed'), new Promise((r) => { timer = setTimeout(() => r('still waiting'), 5000); })]);
    clearTimeout(timer);
    assert.equal(outcome, 'closed', what);
    assert.ok(Date.now() - t0 < ms, `${what}: closed in ${Date.now() - t0} ms`);
  };

  test('nothing listening: the clients keep reconnecting, and close returns at once', async () => {
    const url = `redis://127.0.0.1:${await freePort()}`;
    const limiter = new RedisLimiter({ url, prefix: 'c:', timeoutMs: 300 });
    const cooldowns = new RedisCooldowns({ url, prefix: 'c:', clock: systemClock });
    try {
      await new Promise((r) => setTimeout(r, 300)); // a few reconnects
      await closesWithin(() => limiter.close(), 1000, 'limiter');
      await closesWithin(() => cooldowns.close(), 1000, 'cooldowns');
    } finally {
      await Promise.all([limiter.close(), cooldowns.close()]);
    }
  });

  test('Redis killed, then frozen: close returns within its deadline, its connections cut', async () => {
    await server.start();
    const before = sockets();
    const gone = new RedisLimiter({ url: server.url, prefix: 'c:', timeoutMs: 300 });
    try {
      await gone.whenReady(3000);
      await server.stop();
      await closesWithin(() => gone.close(), 1000, 'killed');
    } finally {
      await gone.close();
    }

    await server.start();
    const frozen = new RedisLimiter({ url: server.url, prefix: 'c:', timeoutMs: 300 });
    const cooldowns = new RedisCooldowns({ url: server.url, prefix: 'c:', clock: systemClock });
    try {
      await frozen.whenReady(3000);
      await cooldowns.whenReady(3000);
      assert.ok(sockets() >= before + 3, 'the limiter\'s connection and the cooldowns\' two are open');
      server.pause();
      void frozen.snapshot({ id: 'a', rpm: null, concurrency: null, dailyCapMicro: null, prepaid: false }).catch(() => {}); // an answer it waits for
      await closesWithin(() => frozen.close(), 1500, 'frozen limiter');
      await closesWithin(() => cooldowns.close(), 2500, 'frozen cooldowns');
      // A destroyed socket's handle closes on a later turn of the loop.
      for (let i = 0; i < 100 && sockets() > before; i++) await new Promise((r) => setTimeout(r, 10));
      assert.equal(sockets(), before, 'their connections were cut, not left waiting for Redis');
    } finally {
      server.resume();
      await Promise.all([frozen.close(), cooldowns.close()]);
    }
  });
});
