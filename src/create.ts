import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { join } from 'node:path';
import { AdminStore } from './admin/state.js';
import { systemClock, type Clock } from './clock.js';
import type { GatewayConfig } from './config/types.js';
import { validateConfig } from './config/validate.js';
import { Gateway } from './gateway.js';
import { FileLedger } from './ledger/file.js';
import { MemoryLedger } from './ledger/memory.js';
import { loadPg, PostgresLedger } from './ledger/postgres.js';
import { PostgresAdminStore } from './admin/postgres-state.js';
import type { Ledger } from './ledger/types.js';
import { RedisLimiter } from './limiter/redis.js';
import type { Limiter } from './limiter/types.js';
import { Logger } from './log.js';
import { RedisCooldowns } from './routing/redis-cooldowns.js';
import type { Cooldowns } from './routing/cooldowns.js';
import { createGatewayServer, listen } from './server.js';

/** A config that does not validate: every problem, named by its JSON path. */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid config:\n${problems.map((p) => `  ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

export interface CreateOptions {
  /** Folder that relative paths in the config (ledger.dir) resolve against; default: the working directory. */
  baseDir?: string;
  /** Where `apiKeyEnv` names are read; default: process.env. */
  env?: Record<string, string | undefined>;
  /** Default: JSON lines on stdout at the config's `server.logLevel`. */
  logger?: Logger;
  /** Enables /admin/v1/ with this key. */
  adminKey?: string;
  /** For tests: the limiter's time source (memory store only). */
  clock?: Clock;
}

export interface Health {
  live: true;
  ready: boolean;
  /** Why not ready: 'draining', 'limiter_unavailable' or 'ledger_unavailable'; null when ready. */
  reason: string | null;
}

/** A running gateway: a request handler for any node:http server, or its own listener. */
export interface EmbeddedGateway {
  readonly gateway: Gateway;
  /** The node:http request listener (mount it under a prefix by rewriting `req.url` first). */
  readonly handler: (req: IncomingMessage, res: ServerResponse) => void;
  /** Starts its own server; resolves with the base URL. */
  listen(port?: number, host?: string): Promise<string>;
  /**
   * Swaps in a new config (validated exactly as a file is); resolves to [] or the problems.
   * Reloads and admin changes are applied one at a time, in order.
   */
  reload(config: unknown): Promise<string[]>;
  health(): Health;
  /**
   * Graceful stop: not ready at once; its own listener (if any) keeps accepting for
   * `server.drainDelayMs`, then closes; in-flight requests get `server.drainTimeoutMs`; stores
   * are flushed and closed.
   */
  close(): Promise<void>;
}

/**
 * Builds a gateway from a config object, validated exactly as a config file is (throws
 * ConfigError listing every problem). Opens the ledger and the limiter store the config names.
 */
export async function createGateway(config: unknown, options: CreateOptions = {}): Promise<EmbeddedGateway> {
  const env = options.env ?? process.env;
  const baseDir = options.baseDir ?? process.cwd();
  const result = validateConfig(config, { baseDir, env });
  if (!result.ok) throw new ConfigError(result.errors);
  const logger = options.logger ?? new Logger(undefined, result.config.server.logLevel, { bufferBytes: result.config.server.logBufferBytes });
  for (const warning of result.warnings) logger.warn(warning);
  return startGateway(result.config, { ...options, logger }, (next) => {
    const r = validateConfig(next, { baseDir, env });
    return r.ok ? r.config : new ConfigError(r.errors);
  });
}

/** The ledger the config names (PostgreSQL: the schema is created or migrated first). */
async function openLedger(config: GatewayConfig, logger: Logger): Promise<Ledger> {
  switch (config.ledger.store) {
    case 'file': return FileLedger.open(config.ledger.dir, { logger });
    case 'postgres': return PostgresLedger.open({ url: config.ledger.url, schema: config.ledger.schema, logger });
    default: return new MemoryLedger();
  }
}

/**
 * Admin changes are kept where the ledger is: beside its journal, in its database (shared by
 * the fleet), or in memory only with the memory ledger.
 */
async function openAdminStore(config: GatewayConfig, ledger: Ledger, logger: Logger): Promise<AdminStore> {
  const where = config.ledger;
  if (where.store === 'file') return new AdminStore(join(where.dir, 'admin-state.json'));
  if (where.store !== 'postgres') return new AdminStore(null);
  const { Client } = loadPg();
  return PostgresAdminStore.open({
    pool: (ledger as PostgresLedger).pool, schema: where.schema, logger,
    // A connection that went half-open gives no error of its own: TCP keepalive from 10 s of
    // silence (not the system's two hours), and a statement with no answer fails after 5 s
    // (LISTEN, and the store's regular check of the connection); a reconnect that hangs is
    // given up (then tried again).
    listener: () => new Client({ connectionString: where.url, keepAlive: true, keepAliveInitialDelayMillis: 10_000, connectionTimeoutMillis: 5000, query_timeout: 5000 }),
  });
}

/** The same from an already validated config (the CLI's path). */
export async function startGateway(
  config: GatewayConfig, options: CreateOptions & { logger: Logger },
  validate: (raw: unknown) => GatewayConfig | ConfigError = (raw) => {
    const r = validateConfig(raw, { baseDir: options.baseDir ?? process.cwd(), env: options.env ?? process.env });
    return r.ok ? r.config : new ConfigError(r.errors);
  },
): Promise<EmbeddedGateway> {
  const { logger } = options;
  const ledger = await openLedger(config, logger);
  let limiter: Limiter | undefined;
  let cooldowns: Cooldowns | undefined;
  let adminStore: AdminStore | undefined;
  // A start that fails half-way closes what it opened (an embedding process goes on).
  const abandon = async (err: unknown): Promise<never> => {
    for (const open of [adminStore, cooldowns, limiter, ledger]) await Promise.resolve(open?.close()).catch(() => {});
    throw err;
  };
  let gateway: Gateway;
  try {
    if (config.limiter.store === 'redis') {
      // With the PostgreSQL ledger, Redis rebuilds an account's money from it when it lost it.
      const shared = ledger instanceof PostgresLedger ? ledger : null;
      const redis = new RedisLimiter({ ...config.limiter, logger, ...(shared === null ? {} : { money: (id: string) => shared.accountMoney(id) }) });
      // Start even if Redis is away (not ready, fail-closed); it is picked up when it answers.
      await redis.whenReady(3000).catch(() => logger.warn('redis is not reachable yet; requests get 503 until it is'));
      limiter = redis;
      // Deployments cooling down are shared too (CONTRACT section 10); routing never waits for them.
      const cooling = new RedisCooldowns({ url: config.limiter.url, prefix: config.limiter.prefix, clock: options.clock ?? systemClock, logger });
      await cooling.whenReady(1000).catch(() => {});
      cooldowns = cooling;
    }
    adminStore = await openAdminStore(config, ledger, logger);
    gateway = new Gateway(config, {
      logger, ledger, adminStore,
      ...(limiter === undefined ? {} : { limiter }),
      ...(cooldowns === undefined ? {} : { cooldowns }),
      ...(options.adminKey ? { adminKey: options.adminKey } : {}),
      ...(options.clock === undefined ? {} : { clock: options.clock }),
    });
  } catch (err) {
    return abandon(err);
  }
  let server: Server | null = null;
  let closing: Promise<void> | null = null;

  const close = async (): Promise<void> => {
    gateway.draining = true;
    const { drainDelayMs, drainTimeoutMs } = gateway.config.server;
    if (server !== null) {
      const s = server;
      await new Promise((r) => setTimeout(r, drainDelayMs));
      const forced = setTimeout(() => {
        logger.warn('drain timeout: closing remaining connections', { in_flight: gateway.inFlight });
        s.closeAllConnections();
      }, drainTimeoutMs);
      forced.unref();
      await new Promise<void>((resolve) => {
        s.close(() => resolve());
        s.closeIdleConnections();
      });
      clearTimeout(forced);
    }
    // Calls cut at the deadline are charged when their answers close, just after their
    // connections, and with a remote limiter once their settlements answer: the ledger must
    // take those charges before it closes (a settlement fails at the limiter's own deadline at
    // the latest, and is then recorded all the same). Embedded without a server: the whole
    // drain timeout for the calls themselves.
    const limiterMs = gateway.config.limiter.store === 'redis' ? gateway.config.limiter.timeoutMs : 0;
    const until = Date.now() + (server !== null ? Math.max(2000, limiterMs + 500) : drainTimeoutMs);
    while ((gateway.inFlight > 0 || gateway.settling > 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    await gateway.admin.close();
    await gateway.ledger.close();
    await gateway.limiter.close();
    await gateway.cooldowns.close();
    await logger.flush();
  };

  return {
    gateway,
    handler: gateway.handle,
    async listen(port = config.server.port, host = config.server.host) {
      if (server !== null) throw new Error('already listening');
      server = createGatewayServer(gateway);
      return listen(server, port, host);
    },
    reload(next) {
      const validated = validate(next);
      if (validated instanceof ConfigError) return Promise.resolve(validated.problems);
      return gateway.reload(validated);
    },
    health() {
      const state = gateway.ready();
      return { live: true, ready: state.ready, reason: state.ready ? null : state.reason };
    },
    close() {
      closing ??= close();
      return closing;
    },
  };
}
