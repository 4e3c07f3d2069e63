import { hash, randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import { systemClock, type Clock } from './clock.js';
import type { GatewayConfig } from './config/types.js';
import { Directory, type AccountEntry } from './directory.js';
import { GatewayError } from './errors.js';
import { BodyBudget, type ContinueRequest } from './http/body.js';
import { CountsInFlight } from './http/counts-in-flight.js';
import { RequestContext, validIdempotencyKey } from './http/context.js';
import { sendError, sendErrorSpec } from './http/reply.js';
import { MemoryLedger } from './ledger/memory.js';
import type { Ledger, LedgerEntry } from './ledger/types.js';
import { MemoryLimiter } from './limiter/memory.js';
import type { Limiter, Rejection } from './limiter/types.js';
import { Logger } from './log.js';
import { Metrics } from './metrics.js';
import { createProviders } from './providers/index.js';
import type { Provider } from './providers/types.js';
import { Watchlist } from './providers/watchlist.js';
import { Router } from './router.js';
import { MemoryCooldowns, type Cooldowns } from './routing/cooldowns.js';
import { ItemMemory } from './translate/item-memory.js';
import { Credits } from './admin/credits.js';
import { creditEntry, creditMarker } from './billing/entries.js';
import { AdminConflict, AdminStore, cloneAdminState, overlay, type AdminState } from './admin/state.js';
import { registerAccountRoutes } from './routes/account.js';
import { registerAdminRoutes } from './routes/admin.js';
import { registerCompletionRoutes } from './routes/completions.js';
import { registerCountTokensRoute } from './routes/count-tokens.js';
import { registerModelRoutes } from './routes/models.js';
import type { RouteHost } from './routes/host.js';
import { registerProbeRoutes } from './routes/probes.js';

export interface GatewayOptions {
  clock?: Clock;
  logger?: Logger;
  limiter?: Limiter;
  ledger?: Ledger;
  /** Enables /admin/v1/ with this key (plaintext; only its hash is kept) and keeps changes in `adminStore`. */
  adminKey?: string;
  adminStore?: AdminStore;
  /** Deployments cooling down; default: this process's own (with Redis: shared, routing/redis-cooldowns.ts). */
  cooldowns?: Cooldowns;
  /** The weighted choice's draw; default Math.random. */
  random?: () => number;
}

/**
 * The gateway: config, limiter, ledger and providers composed behind one request handler
 * that plugs into any node:http server. Knows the order of things; each piece knows its job.
 */
export class Gateway implements RouteHost {
  readonly clock: Clock;
  readonly logger: Logger;
  readonly limiter: Limiter;
  readonly bodies = new BodyBudget(() => this.config.server.maxBodyBytes);
  readonly countBodies = new BodyBudget(() => this.config.server.maxBodyBytes);
  readonly counts = new CountsInFlight();
  readonly ledger: Ledger;
  readonly router = new Router<RouteHost>();
  readonly metrics: Metrics;
  /** Kept across reloads, like the limiter's counters (keyed by model and provider id). */
  readonly cooldowns: Cooldowns;
  /** Items of translated Responses answers that later calls may refer to. */
  readonly items: ItemMemory;
  readonly random: () => number;
  directory: Directory;
  providers: Map<string, Provider>;
  /** The config as loaded from its file (or given); admin changes are laid over it. */
  private fileConfig: GatewayConfig;
  readonly admin: AdminStore;
  private readonly adminKeyHash: string | null;
  private changes: Promise<unknown> = Promise.resolve();
  draining = false;
  /** Requests admitted and not yet finished (for the drain). */
  inFlight = 0;
  settling = 0;
  /** Calls waiting for a client that does not read its answer (server.clientIdleTimeoutMs). */
  clientIdle: Watchlist;
  /** Admin credits: durable, then live; idempotent. */
  readonly credits: Credits;
  private readonly createdS: number;

  constructor(config: GatewayConfig, options: GatewayOptions = {}) {
    this.clock = options.clock ?? systemClock;
    this.logger = options.logger ?? new Logger();
    this.limiter = options.limiter ?? new MemoryLimiter(this.clock);
    this.ledger = options.ledger ?? new MemoryLedger();
    this.cooldowns = options.cooldowns ?? new MemoryCooldowns(this.clock);
    this.items = new ItemMemory(() => this.clock.now());
    this.random = options.random ?? Math.random;
    this.createdS = Math.floor(this.clock.now() / 1000);
    this.fileConfig = config;
    this.admin = options.adminStore ?? new AdminStore(null);
    this.adminKeyHash = options.adminKey === undefined || options.adminKey === '' ? null : hash('sha256', options.adminKey);
    this.metrics = new Metrics({
      inFlight: () => this.inFlight, limiterUp: () => this.limiter.ready(), ledgerUp: () => this.ledger.ready(),
      draining: () => this.draining, logDropped: () => this.logger.dropped,
    });
    const effective = overlay(config, this.admin.state);
    if ('errors' in effective) throw new Error(`admin changes do not fit the config: ${effective.errors.join('; ')}`);
    this.directory = new Directory(effective.config, this.createdS);
    this.providers = createProviders(config);
    this.clientIdle = new Watchlist(config.server.clientIdleTimeoutMs);
    registerProbeRoutes(this.router);
    if (this.adminKeyHash !== null) registerAdminRoutes(this.router);
    registerModelRoutes(this.router);
    registerAccountRoutes(this.router);
    registerCompletionRoutes(this.router);
    registerCountTokensRoute(this.router);
    // Changes another instance makes to a shared admin state apply here too, in turn with ours.
    // It is read inside the queue, so a change of ours never builds on a state that moved under it.
    this.admin.watch(() => {
      this.change(async () => this.adoptAdminState(await this.admin.reload())).catch((err: unknown) => {
        this.logger.warn('admin state: could not read a change made by another instance', { error: String(err) });
      });
    });
    this.credits = new Credits({ ledger: this.ledger, limiter: this.limiter, logger: this.logger, now: () => this.clock.now() });
    this.restoreFromLedger();
    this.credits.resume();
    this.creditNewAccounts();
  }

  get config(): GatewayConfig {
    return this.directory.config;
  }

  /**
   * Swaps in a new file config (admin changes stay laid over it): limits apply to the next
   * request; counters are kept (they are keyed by id). Resolves to the problems instead when
   * the admin changes do not fit the new file; the running config then stays. Queued with the
   * admin changes: a reload never undoes one in flight.
   */
  reload(config: GatewayConfig): Promise<string[]> {
    return this.change(async () => {
      const effective = overlay(config, this.admin.state);
      if ('errors' in effective) return effective.errors;
      this.fileConfig = config;
      this.providers = createProviders(config);
      // Calls already waiting keep the bound they started with.
      if (config.server.clientIdleTimeoutMs !== this.clientIdle.ms) this.clientIdle = new Watchlist(config.server.clientIdleTimeoutMs);
      this.apply(effective.config);
      return [];
    });
  }

  /**
   * Applies an admin change: `mutate` edits a copy of the admin state (and may throw a
   * GatewayError: a conflict, an unknown id, checked here, in the queue, so two calls cannot
   * both pass it); the result is validated against the file config, made durable, then live.
   * Resolves to the problems when the change does not fit.
   */
  changeAdmin(mutate: (state: AdminState) => void): Promise<string[]> {
    return this.change(async () => {
      for (let attempt = 1; ; attempt++) {
        const next = cloneAdminState(this.admin.state);
        mutate(next);
        const effective = overlay(this.fileConfig, next);
        if ('errors' in effective) return effective.errors;
        try {
          await this.admin.save(next); // durable first; if this throws, nothing changed
        } catch (err) {
          // A shared store: another instance changed the state first. Take theirs, redo ours on it.
          if (!(err instanceof AdminConflict) || attempt === 5) throw err;
          this.adoptAdminState(await this.admin.reload());
          continue;
        }
        this.admin.state = next;
        this.apply(effective.config);
        return [];
      }
    });
  }

  /** The admin state another instance saved (a shared store), made live here. */
  private adoptAdminState(state: AdminState): void {
    const effective = overlay(this.fileConfig, state);
    if ('errors' in effective) {
      return this.logger.error('admin change from another instance does not fit this config file; not applied', { errors: effective.errors.join('; ') });
    }
    this.apply(effective.config);
  }

  /** Every change of the running config (admin calls and reloads) runs here, one at a time, in order. */
  private change<T>(run: () => Promise<T>): Promise<T> {
    const result = this.changes.then(run, run);
    this.changes = result.catch(() => {});
    return result;
  }

  private apply(config: GatewayConfig): void {
    const previous = this.directory;
    this.directory = new Directory(config, this.createdS);
    this.creditNewAccounts(previous);
  }

  /** Whether a presented key is the admin key (compared by hash). */
  isAdminKey(key: string): boolean {
    return this.adminKeyHash !== null && hash('sha256', key) === this.adminKeyHash;
  }

  ready(): { ready: true } | { ready: false; reason: string } {
    if (this.draining) return { ready: false, reason: 'draining' };
    if (!this.limiter.ready()) return { ready: false, reason: 'limiter_unavailable' };
    if (!this.ledger.ready()) return { ready: false, reason: 'ledger_unavailable' };
    return { ready: true };
  }

  /** The node:http request listener. Hot path: one context allocation, no awaits before the handler. */
  readonly handle = (req: IncomingMessage, res: ServerResponse): void => {
    const ctx = new RequestContext(req, performance.now());
    if (this.draining) ctx.closeConnection = true;
    if (ctx.hosts !== 1 && (ctx.hosts > 1 || (req.httpVersionMinor === 1 && req.httpVersionMajor === 1))) {
      // Node would answer a missing Host itself, bare (no envelope, no request id); the server
      // lets it through. Two are refused too (RFC 9112 § 3.2: they could name two hosts).
      ctx.closeConnection = true;
      const message = ctx.hosts === 0 ? 'An HTTP/1.1 request needs a Host header.' : 'A request may have only one Host header.';
      return sendError(ctx, res, 'invalid_request', this.done, { message });
    }
    const route = this.router.find(ctx);
    if (route === undefined) return sendError(ctx, res, 'not_found', this.done);
    ctx.route = route.label;
    if (route.anthropic) ctx.anthropic = true;
    const handler = route.methods[ctx.method];
    if (handler === undefined) return sendError(ctx, res, 'method_not_allowed', this.done, {}, ['allow', route.allow]);
    if (route.admin) {
      // Admin requests count toward no account's limits; an ordinary API key is 403.
      if (ctx.apiKey === null) return sendError(ctx, res, 'invalid_api_key', this.done);
      if (ctx.apiKey === '') return sendError(ctx, res, 'missing_api_key', this.done);
      if (!this.isAdminKey(ctx.apiKey)) {
        const ordinary = this.directory.keyByHash(hash('sha256', ctx.apiKey)) !== undefined;
        return sendError(ctx, res, ordinary ? 'permission_denied' : 'invalid_api_key', this.done,
          ordinary ? { message: 'Admin endpoints need the admin key.' } : {});
      }
      if (ctx.idempotencyKey !== undefined && !validIdempotencyKey(ctx.idempotencyKey)) {
        return sendError(ctx, res, 'invalid_idempotency_key', this.done);
      }
    } else if (route.auth) {
      if (ctx.apiKey === null) {
        return sendError(ctx, res, 'invalid_api_key', this.done, { message: 'x-api-key and Authorization carry different keys.' });
      }
      if (ctx.apiKey === '') return sendError(ctx, res, 'missing_api_key', this.done);
      const key = this.directory.keyByHash(hash('sha256', ctx.apiKey));
      if (key === undefined || key.disabled) return sendError(ctx, res, 'invalid_api_key', this.done);
      ctx.key = key;
      if (ctx.idempotencyKey !== undefined && !validIdempotencyKey(ctx.idempotencyKey)) {
        return sendError(ctx, res, 'invalid_idempotency_key', this.done);
      }
    }
    try {
      handler(this, ctx, req, res);
    } catch (err) {
      this.fault(ctx, res, err);
    }
  };

  /**
   * A request with `Expect: 100-continue` (Node's 'checkContinue'): its client sends the body
   * once told to. Node would tell it at once; it is told only when a handler begins to read the
   * body (`takeBody`), past the route, the key and the declared size (found in review: a client
   * with no key was asked for the body, answered 401, then held until the request timeout).
   */
  readonly handleContinue = (req: IncomingMessage, res: ServerResponse): void => {
    (req as ContinueRequest).continueWanted = true;
    this.handle(req, res);
  };

  /** A request with an `Expect` other than 100-continue (Node's 'checkExpectation'): 417 in the envelope. */
  readonly expectationFailed = (req: IncomingMessage, res: ServerResponse): void => {
    const ctx = new RequestContext(req, performance.now());
    ctx.closeConnection = true; // its body, if any, is not read
    sendError(ctx, res, 'expectation_failed', this.done);
  };

  /** Writes the access log line, once per request. */
  readonly done = (ctx: RequestContext): void => {
    if (ctx.logged) return;
    ctx.logged = true;
    const end = performance.now();
    const ms = end - ctx.startMs;
    this.metrics.request(ctx.route, ctx.status, ms / 1000);
    this.logger.access(ctx.id, ctx.method, ctx.path, ctx.status, ms, ctx.key?.account.id ?? null, ctx.dropped, end);
  };

  /**
   * Runs `then` once the limiter admits (its answer may be a value or a promise); a denial is
   * answered with its contract error. Every admission decision is counted here.
   */
  admit<T extends { ok: true }>(ctx: RequestContext, res: ServerResponse, answer: T | Rejection | Promise<T | Rejection>, then: (admitted: T) => void): void {
    if (answer instanceof Promise) return this.decide(ctx, res, answer, (decision) => this.admit(ctx, res, decision, then));
    if (!answer.ok) {
      this.metrics.admission(answer.reason);
      return this.reject(ctx, res, answer);
    }
    this.metrics.admission('admitted');
    then(answer);
  }

  /** Answers a limiter denial with its contract error. */
  reject(ctx: RequestContext, res: ServerResponse, rejection: Rejection): void {
    switch (rejection.reason) {
      case 'daily_cap_exceeded':
        return sendError(ctx, res, rejection.reason, this.done, {
          fields: { resets_at: new Date(rejection.resetsAtMs).toISOString() },
        });
      case 'rate_limit_exceeded':
      case 'concurrency_limit_exceeded':
        return sendError(ctx, res, rejection.reason, this.done, { retryAfterS: rejection.retryAfterMs / 1000 });
      default:
        return sendError(ctx, res, rejection.reason, this.done);
    }
  }

  /** Answers a fault: a GatewayError with its own code, anything else as a 500 (logged, never shown). */
  fault(ctx: RequestContext, res: ServerResponse, err: unknown): void {
    if (err instanceof GatewayError) {
      return sendErrorSpec(ctx, res, err.code, err.spec, this.done, err.details);
    }
    this.logger.error('internal error', { request_id: ctx.id, path: ctx.path, error: String((err as Error)?.stack ?? err) });
    sendError(ctx, res, 'internal_error', this.done);
  }

  /**
   * Runs `then` with an answer that may be a value (memory) or a promise (a remote store, the
   * disk); a failure answers through `fault` (a store that cannot answer throws
   * GatewayError('limiter_unavailable'), which is a 503).
   */
  decide<T>(ctx: RequestContext, res: ServerResponse, answer: T | Promise<T>, then: (value: T) => void): void {
    if (!(answer instanceof Promise)) return then(answer);
    answer.then((value) => {
      try {
        then(value);
      } catch (err) {
        this.fault(ctx, res, err);
      }
    }, (err: unknown) => this.fault(ctx, res, err));
  }

  /**
   * Records a ledger entry (built by billing/entries.ts, so every entry has one shape); a
   * promise resolves when it is durable. A failure is logged here (callers that do not wait
   * for durability need not handle it).
   */
  record(entry: LedgerEntry): void | Promise<void> {
    let done: void | Promise<void>;
    try {
      done = this.ledger.append(entry);
    } catch (err) {
      done = Promise.reject(err); // a ledger that throws must not take the caller (a release, say) with it
    }
    if (done instanceof Promise) {
      done.catch((err: unknown) => this.logger.error('ledger append failed', { request_id: entry.requestId, error: String(err) }));
    }
    return done;
  }

  /** A restart must not reset anyone's daily cap or balance: seed the limiter from the ledger. */
  private restoreFromLedger(): void {
    if (!this.limiter.restoresFromLedger) return;
    // The recent admin credits each balance includes: a repeat of one must not apply it again.
    const credits = new Map<string, Array<[string, number]>>();
    for (const entry of this.ledger.recentCredits()) {
      const applied: [string, number] = [creditMarker(entry), entry.createdAt];
      const ids = credits.get(entry.accountId);
      if (ids === undefined) credits.set(entry.accountId, [applied]);
      else ids.push(applied);
    }
    for (const [accountId, totals] of this.ledger.totals()) {
      this.limiter.restore(accountId, totals.balanceMicro, totals.day, totals.spentMicro, totals.credited, credits.get(accountId));
    }
  }

  /** An account's `balanceUsd` is credited once, when it first appears (the limiter's store decides). */
  /**
   * Offers the initial credit to the prepaid accounts: all of them at start, then those new or
   * newly prepaid since `previous` (the store gives it once in any case; this spares a shared
   * store a round trip per account on every change).
   */
  private creditNewAccounts(previous?: Directory): void {
    for (const account of this.directory.accounts.values()) {
      if (account.prepaid && previous?.accounts.get(account.id)?.prepaid !== true) this.creditOnce(account);
    }
  }

  /**
   * `attempt` is kept across the retries of one attempt: with a shared store, a first try that
   * timed out may have succeeded, and its retry must still record the credit.
   */
  private creditOnce(account: AccountEntry, attempt = this.limiter.restoresFromLedger ? '' : randomUUID()): void {
    // Recorded even when it is 0: the entry is how a restart knows the account was credited.
    const write = (balance: number | null) => {
      if (balance === null) return;
      void this.record(creditEntry({
        accountId: account.id, amountMicro: account.initialCreditMicro, balanceAfterMicro: balance, at: this.clock.now(),
        requestId: null, note: 'initial balance from config', idempotencyKey: null,
      }));
    };
    const credited = this.limiter.creditOnce(account.id, account.initialCreditMicro, attempt);
    if (!(credited instanceof Promise)) return write(credited);
    credited.then(write, (err) => {
      // The shared store is away (start-up before Redis answers): try again shortly.
      this.logger.warn('initial credit deferred: limiter store unavailable', { account_id: account.id, error: String(err) });
      setTimeout(() => this.creditOnce(account, attempt), 1000).unref();
    });
  }
}
