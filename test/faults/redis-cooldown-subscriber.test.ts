import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { systemClock } from '../../src/clock.js';
import { RedisCooldowns } from '../../src/routing/redis-cooldowns.js';
import { until } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * An instance whose subscriber connection alone is cut (Redis killed it: a client-output-buffer
 * limit, CLIENT KILL) misses the cooldowns other instances announce meanwhile. It now reads the
 * shared cooldowns back when the subscriber is back, as it does when its other connection is.
 */
describe('fault: the cooldown subscriber loses its connection', { skip: hasRedis ? false : 'redis-server is not installed' }, () => {
  const server = new RedisServer();
  let a: RedisCooldowns;
  let b: RedisCooldowns;
  before(async () => {
    await server.start();
    a = new RedisCooldowns({ url: server.url, prefix: 'sub:', clock: systemClock });
    b = new RedisCooldowns({ url: server.url, prefix: 'sub:', clock: systemClock });
    await a.whenReady(3000);
    await b.whenReady(3000);
  });
  after(async () => {
    await a.close();
    await b.close();
    await server.stop();
  });

  test('a cooldown announced while the subscriber was away is known once it is back (found in review: it was missed)', async () => {
    const admin = createClient({ url: server.url });
    await admin.connect();
    try {
      const subscriber = (a as unknown as { subscriber: { isReady: boolean; on(e: string, f: () => void): void } }).subscriber;
      let back = 0;
      subscriber.on('ready', () => back++);
      // Another instance's cooldown whose announcement this one never got (it was away): the
      // key as START writes it, without the message.
      await admin.set('sub:cooldown:model-x/provider-y', '1', { PX: 30_000 });
      assert.equal(a.until('model-x/provider-y'), 0, 'not known: no message came');
      await admin.sendCommand(['CLIENT', 'KILL', 'TYPE', 'pubsub']);
      await until(() => back > 0 && subscriber.isReady, 5000, 'the subscriber back');
      await until(() => a.until('model-x/provider-y') > Date.now() + 20_000, 3000, 'the cooldown read back');
      assert.equal(b.until('model-x/provider-y') > 0, true, 'and by the other instance, whose subscriber was cut too');
    } finally {
      await admin.quit();
    }
  });

  test('what is shared is bounded: a cooldown of millennia counts as a day, an oversized key is ignored (found in review)', async () => {
    const admin = createClient({ url: server.url });
    await admin.connect();
    try {
      const channel = (a as unknown as { channel: string }).channel;
      await admin.publish(channel, `other ${Number.MAX_SAFE_INTEGER} model-y/provider-z`);
      await admin.publish(channel, `other 60000 ${'k'.repeat(2000)}`);
      await admin.publish(channel, 'other 60000 model-y/provider-last');
      await until(() => a.until('model-y/provider-last') > 0, 3000, 'the messages read');
      const end = a.until('model-y/provider-z');
      assert.ok(end > Date.now() && end <= Date.now() + 86_400_000, `capped at a day (${end - Date.now()} ms)`);
      assert.equal(a.until('k'.repeat(2000)), 0);
    } finally {
      await admin.quit();
    }
  });
});
