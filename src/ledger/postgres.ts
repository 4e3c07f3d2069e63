import { DAY_MS } from '../clock.js';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { addMicro } from '../money.js';
import { creditMarker } from '../billing/entries.js';
import type { LedgerMoney } from '../limiter/redis.js';
import { addToTotals, CREDIT_KEY_DAYS, groupUsage, type UsageCell } from './book.js';
import type { PgListener } from '../admin/postgres-state.js';
import { migrate, type Pool } from './postgres-schema.js';
import type { AccountTotals, GroupBy, HistoryPage, Ledger, LedgerEntry, UsageRow } from './types.js';

/** The part of the `pg` package's Pool the ledger uses (the package is an optional peer dependency). */
export interface PgPool extends Pool {
  on(event: 'error', listener: (err: Error) => void): unknown;
  /** A client connected, or left the pool. */
  on(event: 'connect' | 'remove', listener: (client: unknown) => void): unknown;
  end(): Promise<void>;
}

/** The part of the `pg` package the gateway uses. */
export interface PgPackage {
  Pool: new (options: Record<string, unknown>) => PgPool;
  /** One connection of its own (what LISTEN needs). */
  Client: new (options: Record<string, unknown>) => PgListener;
}

/** A pg client's socket, as pg keeps it (pg has no public way to cut a connection; it cuts a dead one this way itself). */
interface PgSocketOwner { connection?: { stream?: { destroy(): void } } }

/**
 * Ends a pool or a connection without waiting on a database that stopped answering (a drain
 * must end): pg's end() waits for the server to close each socket, which a frozen server never
 * does. Past `ms`, the sockets of `clients()` are cut, so that nothing keeps the process alive
 * (an embedding process goes on after its gateway closed).
 */
export async function endWithin(end: () => Promise<void>, clients: () => Iterable<unknown>, ms = 2000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const ended = await Promise.race([
    end().then(() => true, () => true),
    new Promise<boolean>((resolve) => { timer = setTimeout(() => resolve(false), ms); }),
  ]);
  clearTimeout(timer);
  if (!ended) for (const client of clients()) (client as PgSocketOwner).connection?.stream?.destroy();
}

/** The clients a pool holds now, kept up to date from its events. */
export function poolClients(pool: PgPool): Set<unknown> {
  const clients = new Set<unknown>();
  pool.on('connect', (client) => clients.add(client));
  pool.on('remove', (client) => clients.delete(client));
  return clients;
}

/** Loads the optional `pg` package only when the config asks for it. */
export function loadPg(): PgPackage {
  try {
    return require('pg') as PgPackage;
  } catch {
    throw new Error('ledger.store "postgres" needs the "pg" package: run `npm install pg` beside the gateway');
  }
}

export interface PostgresLedgerOptions {
  url: string;
  schema: string;
  logger?: Logger;
  /** How often a ledger that lost the database tries it again. */
  retryMs?: number;
  /** Connections to the database (one writes, the others read history and usage). */
  poolSize?: number;
}

interface Pending {
  entry: LedgerEntry;
  resolve: () => void;
  reject: (err: Error) => void;
}

/**
 * Statements written at once: while one commits (its WAL flush), the next is already inserting.
 * Rows they share (an account's rollup and balance) are taken in the same order, so they wait for
 * each other, never deadlock.
 */
const MAX_WRITES = 2;
/** The most entries one statement carries (a tick's charges usually are far fewer). */
const MAX_BATCH = 2000;
/** Entries kept for the database while it is away; beyond, the oldest are logged and dropped. */
const MAX_BACKLOG = 200_000;
/** Deadlock and serialisation failures: the statement did nothing, so it is simply sent again. */
const RETRYABLE = new Set(['40P01', '40001']);
/** Data exceptions and integrity violations: the entries, not the database, are the trouble. */
const REFUSED = /^2[23]/;
const noop = (): void => {};

const COLUMNS = 'seq, id, type, account_id, key_id, amount_micro, balance_after_micro, balance_unknown, created_at, request_id, model, deployment, input_tokens, output_tokens, estimated, note, idempotency_key';

/**
 * The ledger of a fleet: every instance writes the same PostgreSQL tables (CONTRACT section 11,
 * README "Running a fleet"). Appends are group-committed: the entries of a tick go in one
 * statement, which inserts them, skipping any already there (each entry's id is unique, so a
 * retried write never doubles a charge), and adds them to the usage rollup and the balances
 * in the same transaction; the promise of each resolves once it is committed. While the
 * database is away the ledger is not ready (model calls get 503 before going upstream), the
 * entries of calls already under way are kept and written when it answers again, and their
 * waiters are refused (an answer whose charge cannot commit is not completed).
 */
export class PostgresLedger implements Ledger {
  /** Group commits made and the entries they carried (benchmarks). */
  readonly stats = { commits: 0, records: 0 };
  private readonly queue: Pending[] = [];
  /** Statements under way (at most MAX_WRITES). */
  private writing = 0;
  private up = true;
  private retryTimer: NodeJS.Timeout | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  /** When the database last answered. */
  private lastOk = Date.now();
  private closed = false;
  private readonly logger: Logger | undefined;
  private readonly retryMs: number;
  /** Balances and the latest day's spend as of start (restores a memory limiter), then this instance's own entries. */
  private readonly totalsByAccount = new Map<string, AccountTotals>();
  /** This instance's view of the admin credits of the last days (given again to a shared limiter at start). */
  private readonly credits: LedgerEntry[] = [];
  private readonly t: Record<'entries' | 'usage' | 'balances', string>;
  /** The append statement (group commit), and its name as a prepared statement. */
  private readonly appendSql: string;
  private readonly appendName: string;

  /** The connections, shared with the admin state kept in the same database. */
  private constructor(readonly pool: PgPool, private readonly clients: Set<unknown>, schema: string, options: PostgresLedgerOptions) {
    this.logger = options.logger;
    this.retryMs = options.retryMs ?? 1000;
    const q = `"${schema}"`;
    this.t = { entries: `${q}.entries`, usage: `${q}.usage_daily`, balances: `${q}.balances` };
    this.appendName = `mg-append-${schema}`;
    this.appendSql = `
      WITH ins AS (
        INSERT INTO ${this.t.entries} (id, type, account_id, key_id, amount_micro, balance_after_micro, created_at, request_id, model,
          deployment, input_tokens, output_tokens, estimated, note, idempotency_key, balance_unknown)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[],
          $9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::boolean[], $14::text[], $15::text[], $16::boolean[])
        ON CONFLICT DO NOTHING
        RETURNING id, type, account_id, key_id, amount_micro, balance_after_micro, balance_unknown, created_at, model, input_tokens, output_tokens
      ), used AS (
        INSERT INTO ${this.t.usage} AS u (account_id, day, model, key_id, requests, input_tokens, output_tokens, cost_micro)
        SELECT account_id, (created_at / ${DAY_MS})::int, coalesce(model, ''), coalesce(key_id, ''), count(*), sum(input_tokens),
          sum(output_tokens), -sum(amount_micro)
        FROM ins WHERE type <> 'credit' GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (account_id, day, model, key_id) DO UPDATE SET requests = u.requests + excluded.requests,
          input_tokens = u.input_tokens + excluded.input_tokens, output_tokens = u.output_tokens + excluded.output_tokens,
          cost_micro = u.cost_micro + excluded.cost_micro
      ), money AS (
        INSERT INTO ${this.t.balances} AS b (account_id, balance_micro, credited)
        SELECT account_id, sum(CASE WHEN type = 'credit' OR balance_after_micro IS NOT NULL OR balance_unknown THEN amount_micro ELSE 0 END),
          bool_or(type = 'credit')
        FROM ins GROUP BY account_id ORDER BY account_id
        ON CONFLICT (account_id) DO UPDATE SET balance_micro = b.balance_micro + excluded.balance_micro, credited = b.credited OR excluded.credited
      )
      SELECT id FROM ins`;
  }

  /** Connects, creates or migrates the schema (once for the fleet: an advisory lock), reads the totals. */
  static async open(options: PostgresLedgerOptions): Promise<PostgresLedger> {
    const { Pool } = loadPg();
    // A statement that hangs (a database that stopped answering) fails after query_timeout instead.
    const pool = new Pool({ connectionString: options.url, max: options.poolSize ?? 4, connectionTimeoutMillis: 5000, query_timeout: 10_000 });
    const clients = poolClients(pool);
    let ledger: PostgresLedger | null = null;
    // An idle connection that breaks (the server went away) must not take the process with it;
    // it says at once that the database is gone.
    pool.on('error', (err) => ledger?.lost(err));
    try {
      await migrate(pool, options.schema);
      ledger = new PostgresLedger(pool, clients, options.schema, options);
      await ledger.load();
      ledger.startHeartbeat();
      return ledger;
    } catch (err) {
      await endWithin(() => pool.end(), () => clients);
      throw new Error(`the PostgreSQL ledger could not start: ${(err as Error).message}`);
    }
  }

  private async load(): Promise<void> {
    for (const [accountId, totals] of await this.moneyOf(null)) this.totalsByAccount.set(accountId, totals);
    const since = Date.now() - CREDIT_KEY_DAYS * DAY_MS;
    const credits = await this.pool.query(
      `SELECT ${COLUMNS} FROM ${this.t.entries} WHERE type = 'credit' AND request_id IS NOT NULL AND created_at >= $1 ORDER BY seq`, [since]);
    for (const r of credits.rows) this.credits.push(entryOf(r as Row));
  }

  append(entry: LedgerEntry): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.closed) return reject(new Error('the ledger is closed'));
      if (this.queue.length >= MAX_BACKLOG) {
        const lost = this.queue.shift()!;
        this.logger?.error('ledger backlog full: an entry was not recorded', { entry: JSON.stringify(lost.entry) });
        lost.reject(new Error('ledger backlog full'));
      }
      // While the database is away an entry waits for it (the provider billed the call; the
      // limiter gave the initial credit), but its answer does not. An admin's credit refused
      // is not kept: the admin was told nothing was credited, and may well ask again.
      if (this.up) this.queue.push({ entry, resolve, reject });
      else {
        if (!adminCredit(entry)) this.queue.push({ entry, resolve: noop, reject: noop });
        reject(new GatewayError('ledger_unavailable', { retryAfterS: 1 }));
      }
      this.schedule();
    });
  }

  /** The pool lost a connection: ask the database, and stop taking calls if it is gone. */
  private lost(err: Error): void {
    this.logger?.warn('postgres connection lost', { error: err.message });
    if (this.up && this.writing === 0) this.beat();
  }

  /**
   * Asks the database every `retryMs` while nothing is written: an outage shows in `ready()`
   * (and turns calls away before they go upstream) without waiting for a charge to fail.
   */
  private startHeartbeat(): void {
    this.heartbeat = setInterval(() => {
      if (this.up && this.writing === 0 && Date.now() - this.lastOk >= this.retryMs) this.beat();
    }, this.retryMs);
    this.heartbeat.unref();
  }

  private beat(): void {
    this.pool.query('SELECT 1').then(() => { this.lastOk = Date.now(); }, (err: Error) => {
      if (!this.up) return;
      this.logger?.error('postgres ledger unavailable: model calls get 503 until it answers', { error: err.message });
      this.up = false;
      this.refuseWaiters();
      this.retryLater();
    });
  }

  /** At most MAX_WRITES statements at a time; everything appended meanwhile goes in the next (group commit). */
  private schedule(): void {
    if (this.writing >= MAX_WRITES || !this.up || this.queue.length === 0) return;
    this.writing++;
    setImmediate(() => void this.flush());
  }

  private async flush(): Promise<void> {
    // Gone down since it was scheduled: its entries wait for the retry (their waiters were
    // refused, so a write now would record a charge whose call was refused: found in review).
    if (!this.up) {
      this.writing--;
      return;
    }
    const batch = this.queue.splice(0, MAX_BATCH);
    const failed = batch.length === 0 ? null : await this.write(batch);
    this.writing--;
    if (failed !== null) return this.down(failed.err, failed.rest);
    this.schedule();
  }

  /**
   * Writes a batch and answers its waiters; null when every entry is recorded (or refused),
   * else the database's error and the entries not written. When the database refuses what it
   * was given (classes 22, 23), not the connection, the entries are sent one at a time: one bad
   * entry must not hold up the others; one refused alone is logged whole.
   */
  private async write(batch: Pending[]): Promise<{ err: Error; rest: Pending[] } | null> {
    try {
      this.written(batch, await this.insert(batch));
      return null;
    } catch (err) {
      if (!REFUSED.test(codeOf(err))) return { err: err as Error, rest: batch };
    }
    for (let i = 0; i < batch.length; i++) {
      const one = batch.slice(i, i + 1);
      try {
        this.written(one, await this.insert(one));
      } catch (err) {
        if (!REFUSED.test(codeOf(err))) return { err: err as Error, rest: batch.slice(i) };
        this.logger?.error('postgres ledger refused an entry; it is not recorded', { error: (err as Error).message, entry: JSON.stringify(one[0]!.entry) });
        one[0]!.reject(err as Error);
      }
    }
    return null;
  }

  /** A committed batch: the entries it inserted count in the totals (not those already there); every waiter is answered. */
  private written(batch: Pending[], inserted: ReadonlySet<string>): void {
    this.lastOk = Date.now();
    for (const p of batch) {
      if (inserted.has(p.entry.id)) this.applyTotals(p.entry);
      p.resolve();
    }
  }

  /** The database did not take a batch: not ready; the batch waits at the head of the queue, its waiters refused. */
  private down(err: Error, batch: Pending[]): void {
    if (this.up) this.logger?.error('postgres ledger unavailable: model calls get 503 until it answers', { error: err.message });
    this.up = false;
    this.queue.unshift(...batch);
    this.refuseWaiters();
    this.retryLater();
  }

  /**
   * The database is away: every waiter still queued is refused now (its call gets no complete
   * answer), not when the database is back (found in review: the entries queued behind the
   * failed batch waited out the whole outage, and their calls with them). The entries wait for
   * the database; refused admin credits do not (see append).
   */
  private refuseWaiters(): void {
    const refusal = new GatewayError('ledger_unavailable', { retryAfterS: 1 });
    const kept: Pending[] = [];
    for (const p of this.queue) {
      p.reject(refusal);
      if (!adminCredit(p.entry)) kept.push({ entry: p.entry, resolve: noop, reject: noop });
    }
    this.queue.length = 0;
    this.queue.push(...kept);
  }

  private retryLater(): void {
    if (this.retryTimer !== null || this.closed) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      void this.retry();
    }, this.retryMs);
    this.retryTimer.unref();
  }

  /** Writes the backlog (or just asks, when there is none); ready again once it goes through. */
  private async retry(): Promise<void> {
    const batch = this.queue.splice(0, MAX_BATCH);
    let failed: { err: Error; rest: Pending[] } | null = null;
    if (batch.length > 0) failed = await this.write(batch);
    else await this.pool.query('SELECT 1').catch((err: Error) => { failed = { err, rest: [] }; });
    if (failed !== null) {
      this.queue.unshift(...(failed as { rest: Pending[] }).rest);
      return this.retryLater();
    }
    this.logger?.warn('postgres ledger available again', { backlog_written: batch.length });
    this.up = true;
    this.schedule();
  }

  /**
   * One statement (one transaction): the entries not already there, then the usage rollup and
   * the balances from exactly those. Rows are taken in a fixed order so two instances writing
   * the same rollup rows never deadlock.
   */
  private async insert(batch: Pending[]): Promise<Set<string>> {
    const cols: unknown[][] = Array.from({ length: 16 }, () => []);
    for (const { entry: e } of batch) {
      const values = [
        e.id, e.type, e.accountId, e.keyId, e.amountMicro, e.balanceAfterMicro, e.createdAt, e.requestId, e.model, e.deployment,
        e.inputTokens, e.outputTokens, e.estimated, e.note, e.idempotencyKey, e.balanceUnknown,
      ];
      for (let i = 0; i < 16; i++) cols[i]!.push(values[i]);
    }
    // A named statement: each connection parses and plans it once. Deadlocks and serialisation
    // failures did nothing: the statement is sent again.
    for (let tries = 1; ; tries++) {
      try {
        const { rows } = await this.pool.query({ name: this.appendName, text: this.appendSql, values: cols });
        this.stats.commits++;
        this.stats.records += batch.length;
        return new Set(rows.map((r) => String(r.id)));
      } catch (err) {
        if (!RETRYABLE.has(codeOf(err)) || tries === 5) throw err;
      }
    }
  }

  /** Keeps `totals()` as the book would (it is read at start; this instance's own entries keep it current). */
  private applyTotals(e: LedgerEntry): void {
    addToTotals(this.totalsByAccount, e);
    if (e.type !== 'credit' || e.requestId === null) return;
    this.credits.push(e);
    const since = Date.now() - CREDIT_KEY_DAYS * DAY_MS;
    while (this.credits.length > 0 && this.credits[0]!.createdAt < since) this.credits.shift(); // kept as long as they are given again
  }

  totals(): ReadonlyMap<string, AccountTotals> {
    return this.totalsByAccount;
  }

  /** Balances and the latest day's spend: of every account (null), or of one. */
  private async moneyOf(accountId: string | null): Promise<Map<string, AccountTotals>> {
    const { rows } = await this.pool.query(`
      SELECT b.account_id, b.balance_micro, b.credited, d.day, d.cost
      FROM ${this.t.balances} b
      LEFT JOIN LATERAL (
        SELECT day, sum(cost_micro) AS cost FROM ${this.t.usage} u WHERE u.account_id = b.account_id
        GROUP BY day ORDER BY day DESC LIMIT 1
      ) d ON true
      WHERE $1::text IS NULL OR b.account_id = $1`, [accountId]);
    const out = new Map<string, AccountTotals>();
    for (const r of rows) {
      out.set(String(r.account_id), {
        // Sums past 2^53 (credits added up) saturate, as the limiters' money does.
        balanceMicro: addMicro(0, Number(r.balance_micro)), credited: r.credited === true,
        day: r.day == null ? 0 : Number(r.day), spentMicro: r.cost == null ? 0 : addMicro(0, Number(r.cost)),
      });
    }
    return out;
  }

  /**
   * One account's money as the database has it now, and the markers of its recent admin credits
   * (a shared limiter store that lost the account rebuilds it from this, credits marked applied).
   */
  async accountMoney(accountId: string): Promise<LedgerMoney> {
    const totals = (await this.moneyOf(accountId)).get(accountId) ?? { balanceMicro: 0, day: 0, spentMicro: 0, credited: false };
    const { rows } = await this.pool.query(
      `SELECT id, idempotency_key FROM ${this.t.entries} WHERE account_id = $1 AND type = 'credit' AND request_id IS NOT NULL
       AND created_at >= $2 ORDER BY seq DESC LIMIT 1000`, [accountId, Date.now() - (CREDIT_KEY_DAYS + 1) * DAY_MS]);
    const creditIds = rows.map((r) => creditMarker({ id: String(r.id), idempotencyKey: r.idempotency_key == null ? null : String(r.idempotency_key) }));
    return { ...totals, creditIds };
  }

  /** Keyset pagination on (account, seq): the cursor is the last entry's sequence number. */
  async history(accountId: string, limit: number, after: string | null): Promise<HistoryPage> {
    let before: number | null = null;
    if (after !== null) {
      if (!/^p\d{1,15}$/.test(after)) throw new GatewayError('invalid_request', { message: 'The cursor "after" is not valid.', fields: { param: 'after' } });
      before = Number(after.slice(1));
    }
    const { rows } = await this.pool.query(
      `SELECT ${COLUMNS} FROM ${this.t.entries} WHERE account_id = $1 AND type <> 'usage' AND ($2::bigint IS NULL OR seq < $2)
       ORDER BY seq DESC LIMIT $3`, [accountId, before, limit + 1]);
    const hasMore = rows.length > limit;
    const page = (rows as Row[]).slice(0, limit);
    return { entries: page.map(entryOf), hasMore, nextCursor: hasMore ? `p${page.at(-1)!.seq}` : null };
  }

  /** From the rollup, never the raw entries. */
  async usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): Promise<UsageRow[]> {
    const { rows } = await this.pool.query(
      `SELECT day, model, key_id, requests, input_tokens, output_tokens, cost_micro FROM ${this.t.usage}
       WHERE account_id = $1 AND day BETWEEN $2 AND $3`, [accountId, startDay, endDay]);
    return groupUsage((rows as Array<Record<string, string | number>>).map((r): UsageCell => ({
      day: Number(r.day), model: String(r.model), keyId: String(r.key_id), requests: Number(r.requests),
      inputTokens: Number(r.input_tokens), outputTokens: Number(r.output_tokens), costMicro: Number(r.cost_micro),
    })), groupBy);
  }

  /** Keys are unique per account in the database, and kept for ever. */
  async creditByKey(accountId: string, idempotencyKey: string): Promise<LedgerEntry | undefined> {
    const { rows } = await this.pool.query(
      `SELECT ${COLUMNS} FROM ${this.t.entries} WHERE account_id = $1 AND idempotency_key = $2 AND type = 'credit'`, [accountId, idempotencyKey]);
    return rows.length === 0 ? undefined : entryOf(rows[0] as Row);
  }

  recentCredits(): Iterable<LedgerEntry> {
    const since = Date.now() - CREDIT_KEY_DAYS * DAY_MS;
    return this.credits.filter((e) => e.createdAt >= since);
  }

  ready(): boolean {
    return this.up;
  }

  /** Writes what is queued (waiting up to a few seconds for a database that is away), then disconnects. */
  async close(): Promise<void> {
    const until = Date.now() + 5000;
    while ((this.queue.length > 0 || this.writing > 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    if (this.queue.length > 0) this.logger?.error('postgres ledger closed with entries not recorded', { entries: this.queue.length });
    this.closed = true;
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    await endWithin(() => this.pool.end(), () => this.clients);
  }
}

type Row = Record<string, string | number | boolean | null>;

function entryOf(r: Row): LedgerEntry {
  const num = (v: unknown) => Number(v);
  const text = (v: unknown) => (v === null ? null : String(v));
  return {
    id: String(r.id), type: r.type as LedgerEntry['type'], accountId: String(r.account_id), keyId: text(r.key_id),
    amountMicro: num(r.amount_micro), balanceAfterMicro: r.balance_after_micro === null ? null : num(r.balance_after_micro),
    balanceUnknown: r.balance_unknown === true,
    createdAt: num(r.created_at), requestId: text(r.request_id), model: text(r.model), inputTokens: num(r.input_tokens),
    outputTokens: num(r.output_tokens), estimated: r.estimated === true, note: text(r.note), idempotencyKey: text(r.idempotency_key),
    deployment: text(r.deployment),
  };
}

/** The SQLSTATE of a database error ('' for anything else). */
function codeOf(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : '';
}

/** A credit an admin call made (it carries the call's request id): durable first, so refused means not made. */
function adminCredit(entry: LedgerEntry): boolean {
  return entry.type === 'credit' && entry.requestId !== null;
}
