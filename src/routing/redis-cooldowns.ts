import { randomBytes } from 'node:crypto';
import type { RedisClientType } from 'redis';
import type { Clock } from '../clock.js';
import { closeRedisClient, loadRedis } from '../limiter/redis.js';
import type { Logger } from '../log.js';
import { MemoryCooldowns } from './cooldowns.js';

/**
 * Sets the cooldown key unless it already lives longer, and then tells every instance:
 * KEYS[1] the key; ARGV[1] the cooldown in whole ms, ARGV[2] the channel, ARGV[3] the message.
 * Arguments are checked before the first write.
 */
const START = `
local ms = ARGV[1]
if type(ms) ~= 'string' or not string.match(ms, '^%d+$') or #ms > 12 or tonumber(ms) < 1 then
  return redis.error_reply('ERR model-gateway: invalid argument ms')
end
if type(ARGV[2]) ~= 'string' or ARGV[2] == '' or type(ARGV[3]) ~= 'string' then
  return redis.error_reply('ERR model-gateway: invalid argument channel')
end
if redis.call('PTTL', KEYS[1]) >= tonumber(ms) then return 0 end
redis.call('SET', KEYS[1], '1', 'PX', ms)
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1`;

/** How long closing waits for the answers still due before it cuts the connections. */
const CLOSE_MS = 1000;
/**
 * Bounds on what another instance (or anyone who can publish on the channel) shares: no
 * cooldown is longer than `routing.cooldownMs` may be (a provider's Retry-After counts up to an
 * hour), and no key longer than a deployment's (found in review: any safe integer was taken,
 * cooling a deployment for millennia).
 */
const MAX_COOLDOWN_MS = 86_400_000;
const MAX_KEY_CHARS = 1024;

export interface RedisCooldownsOptions {
  url: string;
  prefix: string;
  clock: Clock;
  logger?: Logger;
}

/**
 * Cooldowns shared by every instance through Redis: one key per deployment
 * (`<prefix>cooldown:<model>|<provider>`) that expires with its cooldown, and a message on
 * `<prefix>cooldowns` when one starts or grows. Each instance keeps the local copy that routed
 * calls read, so routing never waits for Redis; an instance that (re)connects reads the keys
 * back with their remaining lives, so one that was away misses nothing. Redis being away only
 * stops the sharing: each instance still cools down what it sees fail.
 */
export class RedisCooldowns extends MemoryCooldowns {
  private readonly client: RedisClientType;
  private readonly subscriber: RedisClientType;
  private readonly keyPrefix: string;
  private readonly channel: string;
  /** This instance's own messages come back to it: they are known already. */
  private readonly instance = randomBytes(6).toString('hex');
  private readonly logger: Logger | undefined;
  private lastError = 0;

  constructor(options: RedisCooldownsOptions) {
    super(options.clock);
    const { createClient } = loadRedis();
    this.keyPrefix = `${options.prefix}cooldown:`;
    this.channel = `${options.prefix}cooldowns`;
    this.logger = options.logger;
    this.client = createClient({
      url: options.url, disableOfflineQueue: true,
      socket: { reconnectStrategy: (retries: number) => Math.min(50 * 2 ** retries, 1000) },
    }) as RedisClientType;
    this.subscriber = this.client.duplicate() as RedisClientType;
    for (const c of [this.client, this.subscriber]) {
      c.on('error', (err: Error) => this.warn('redis cooldown store error', err));
      c.connect().catch(() => { /* reconnects by itself */ });
    }
    // On every (re)connection of either: what started while this instance was not listening (the
    // subscriber alone can lose its connection, and the messages sent meanwhile).
    for (const c of [this.client, this.subscriber]) {
      c.on('ready', () => {
        if (this.client.isReady) void this.readAll().catch((err: Error) => this.warn('reading shared cooldowns failed', err));
      });
    }
    this.subscriber.subscribe(this.channel, (message) => this.onMessage(message)).catch((err: Error) => this.warn('redis cooldown subscribe failed', err));
  }

  /** Resolves once both connections are up and the shared cooldowns are read (start-up and tests). */
  async whenReady(ms: number): Promise<void> {
    const until = Date.now() + ms;
    while (!this.client.isReady || !this.subscriber.isReady) {
      if (Date.now() > until) throw new Error('redis is not reachable');
      await new Promise((r) => setTimeout(r, 20));
    }
    await this.readAll();
  }

  override start(key: string, ms: number): void {
    super.start(key, ms);
    if (!this.client.isReady) return;
    const whole = String(Math.max(1, Math.ceil(ms)));
    this.client.eval(START, { keys: [this.keyPrefix + key], arguments: [whole, this.channel, `${this.instance} ${whole} ${key}`] })
      .catch((err: Error) => this.warn('sharing a cooldown failed', err));
  }

  /** `<instance> <ms> <key>`: another instance started a cooldown of `ms` from now. */
  private onMessage(message: string): void {
    const first = message.indexOf(' ');
    const second = message.indexOf(' ', first + 1);
    if (first < 0 || second < 0 || message.slice(0, first) === this.instance) return;
    const ms = Number(message.slice(first + 1, second));
    const key = message.slice(second + 1);
    if (Number.isSafeInteger(ms) && ms > 0 && key.length <= MAX_KEY_CHARS) this.extend(key, this.clock.now() + Math.min(ms, MAX_COOLDOWN_MS));
  }

  /** Reads every shared cooldown with the time it has left. */
  private async readAll(): Promise<void> {
    let cursor = '0';
    do {
      const [next, keys] = (await this.client.sendCommand(['SCAN', cursor, 'MATCH', `${this.keyPrefix}*`, 'COUNT', '1000'])) as [string, string[]];
      cursor = next;
      // Sent together: the client pipelines the commands of one tick.
      const ttls = await Promise.all(keys.map((key) => this.client.sendCommand(['PTTL', key])));
      keys.forEach((key, i) => {
        const ttl = Number(ttls[i]);
        if (ttl > 0 && key.length - this.keyPrefix.length <= MAX_KEY_CHARS) this.extend(key.slice(this.keyPrefix.length), this.clock.now() + Math.min(ttl, MAX_COOLDOWN_MS));
      });
    } while (cursor !== '0');
  }

  private warn(msg: string, err: Error): void {
    const now = Date.now();
    // Timed from the last warning logged (found in review: from the last error, so errors
    // coming more often than every 5 s were never logged again after the first).
    if (now - this.lastError <= 5000) return;
    this.lastError = now;
    this.logger?.warn(msg, { error: err.message });
  }

  override async close(): Promise<void> {
    await Promise.all([this.subscriber, this.client].map((c) => closeRedisClient(c, CLOSE_MS)));
  }
}
