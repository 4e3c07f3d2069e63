import type { Logger } from '../log.js';
import { endWithin, type PgPool } from '../ledger/postgres.js';
import { AdminConflict, AdminStore, emptyAdminState, fromJson, toJson, type AdminState } from './state.js';

/** A connection that listens (the pg package's Client). */
export interface PgListener {
  connect(): Promise<unknown>;
  query(text: string): Promise<{ rows: Array<Record<string, unknown>> }>;
  on(event: 'notification', listener: (message: { channel: string; payload?: string }) => void): unknown;
  on(event: 'error' | 'end', listener: (err?: Error) => void): unknown;
  end(): Promise<void>;
}

export interface PostgresAdminOptions {
  pool: PgPool;
  /** A new listening connection (pg's Client with the ledger's URL). */
  listener: () => PgListener;
  schema: string;
  logger?: Logger;
  /** How often the listening connection is checked and the version read (default 2000 ms). */
  checkMs?: number;
}

/**
 * The admin state of a fleet, in the ledger's database: one row (the state as JSON and a
 * version). A change is saved only over the version it was made from (else AdminConflict:
 * the gateway reads the state again and redoes the change, so two instances never undo each
 * other's), and announced with NOTIFY; every instance LISTENs and applies it at once. A
 * listener that reconnects reads the whole state again, so a change made while it was away is
 * not missed. Every `checkMs` the listening connection reads the version: a connection that
 * died silently (no error, no end: a NAT's idle timeout, a failover) is found and made again,
 * and a change whose NOTIFY was missed, or whose read failed, is read then (found in review:
 * either could leave a deleted key working on an instance until the next change).
 */
export class PostgresAdminStore extends AdminStore {
  private version = 0;
  private readonly table: string;
  private readonly channel: string;
  private listener: PgListener | null = null;
  /** A listening connection being made (its LISTEN may hang on a database that stopped answering). */
  private connecting: PgListener | null = null;
  private changed: (() => void) | null = null;
  /** A change announced before `watch` was called: reported to it then. */
  private missed = false;
  /** A change announced and not read yet: announced once (the check would queue a read every 2 s). */
  private announced = false;
  private closed = false;
  private retry: NodeJS.Timeout | null = null;
  private readonly check: NodeJS.Timeout;
  private checking = false;

  private constructor(private readonly options: PostgresAdminOptions) {
    super(null, `postgres schema ${options.schema}`);
    this.table = `"${options.schema}".admin_state`;
    this.channel = `${options.schema}_admin`;
    // Never a rejection left unhandled (it would end the process): a check that throws is just tried again.
    this.check = setInterval(() => void this.checkListener().catch(() => {}), options.checkMs ?? 2000);
    this.check.unref();
  }

  static async open(options: PostgresAdminOptions): Promise<PostgresAdminStore> {
    const store = new PostgresAdminStore(options);
    try {
      // Listening first, then reading: a change saved in between is in what is read, or
      // announced (found in review: read first, a change saved before the LISTEN was missed).
      await store.listen();
      await store.reload();
    } catch (err) {
      await store.close();
      throw err;
    }
    return store;
  }

  override async reload(): Promise<AdminState> {
    this.announced = false; // a change announced from now on is read again (this read may fail)
    const { rows } = await this.options.pool.query(`SELECT version, state FROM ${this.table} WHERE id = 1`);
    const row = rows[0];
    this.version = row === undefined ? 0 : Number(row.version);
    this.state = row === undefined ? emptyAdminState() : fromJson(String(row.state));
    return this.state;
  }

  override async save(state: AdminState): Promise<void> {
    const { rows } = await this.options.pool.query(`
      WITH saved AS (
        INSERT INTO ${this.table} AS a (id, version, state) VALUES (1, $1 + 1, $2)
        ON CONFLICT (id) DO UPDATE SET version = a.version + 1, state = excluded.state WHERE a.version = $1
        RETURNING version
      )
      SELECT version, pg_notify($3, version::text) FROM saved`, [this.version, toJson(state), this.channel]);
    if (rows.length === 0) throw new AdminConflict();
    this.version = Number(rows[0]!.version);
  }

  override watch(changed: () => void): void {
    this.changed = changed;
    if (this.missed) {
      this.missed = false;
      changed();
    }
  }

  /** A newer version exists: the gateway reads it (in turn with its own changes). */
  private announce(): void {
    if (this.announced) return;
    this.announced = true;
    if (this.changed === null) this.missed = true;
    else this.changed();
  }

  /**
   * Reads the version on the listening connection: newer than this instance's, it is read;
   * no answer (within the connection's query timeout), the connection is made again.
   */
  private async checkListener(): Promise<void> {
    const listener = this.listener;
    if (listener === null || this.checking || this.closed) return;
    this.checking = true;
    try {
      const { rows } = await listener.query(`SELECT version FROM ${this.table} WHERE id = 1`);
      const version = rows[0] === undefined ? 0 : Number(rows[0].version);
      if (version > this.version) this.announce();
    } catch (err) {
      if (this.listener === listener && !this.closed) {
        this.options.logger?.warn('admin state: the postgres listener did not answer; reconnecting', { error: String(err) });
        this.listener = null;
        void endWithin(() => listener.end(), () => [listener]);
        this.reconnectLater();
      }
    } finally {
      this.checking = false;
    }
  }

  /** LISTENs on its own connection; when it breaks, connects again and reads the whole state. */
  private async listen(): Promise<void> {
    if (this.closed) return;
    const listener = this.options.listener();
    listener.on('notification', (message) => {
      if (Number(message.payload) > this.version) this.announce();
    });
    const lost = () => {
      if (this.listener !== listener || this.closed) return;
      this.listener = null;
      this.options.logger?.warn('admin state: lost the postgres listener; reconnecting');
      this.reconnectLater();
    };
    listener.on('error', lost);
    listener.on('end', lost);
    this.connecting = listener;
    try {
      await listener.connect();
      await listener.query(`LISTEN "${this.channel}"`);
    } catch (err) {
      await listener.end().catch(() => {}); // a connection that failed half-way is not kept
      throw err;
    } finally {
      this.connecting = null;
    }
    if (this.closed) return void listener.end().catch(() => {}); // closed meanwhile
    this.listener = listener;
  }

  private reconnectLater(): void {
    if (this.retry !== null || this.closed) return;
    this.retry = setTimeout(() => {
      this.retry = null;
      this.listen().then(() => this.announce(), () => this.reconnectLater());
    }, 1000);
    this.retry.unref();
  }

  override async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.check);
    if (this.retry !== null) clearTimeout(this.retry);
    const open = [this.listener, this.connecting].filter((l) => l !== null);
    await Promise.all(open.map((l) => endWithin(() => l.end(), () => [l])));
  }
}
