/** What the ledger's tables are made with: the pg Pool's query, or one connection of it. */
export interface Sql {
  query(text: string | { name: string; text: string; values: unknown[] }, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

export interface Pool extends Sql {
  connect(): Promise<Sql & { release(err?: Error): void }>;
}

/**
 * The schema's versions, in order; each runs once, in its own transaction. Never edit one that
 * has shipped: add the next. The README's "Running a fleet" documents the tables.
 */
export const MIGRATIONS: ReadonlyArray<(s: string) => string> = [
  (s) => `
    CREATE TABLE ${s}.entries (
      id text PRIMARY KEY,
      seq bigserial NOT NULL,
      type text NOT NULL CHECK (type IN ('charge', 'credit', 'usage')),
      account_id text NOT NULL,
      key_id text,
      amount_micro bigint NOT NULL,
      balance_after_micro bigint,
      created_at bigint NOT NULL,
      request_id text,
      model text,
      deployment text,
      input_tokens bigint NOT NULL,
      output_tokens bigint NOT NULL,
      estimated boolean NOT NULL,
      note text,
      idempotency_key text
    );
    CREATE INDEX entries_history ON ${s}.entries (account_id, seq DESC) WHERE type <> 'usage';
    CREATE UNIQUE INDEX entries_credit_key ON ${s}.entries (account_id, idempotency_key) WHERE type = 'credit' AND idempotency_key IS NOT NULL;
    CREATE TABLE ${s}.usage_daily (
      account_id text NOT NULL,
      day integer NOT NULL,
      model text NOT NULL,
      key_id text NOT NULL,
      requests bigint NOT NULL,
      input_tokens bigint NOT NULL,
      output_tokens bigint NOT NULL,
      cost_micro bigint NOT NULL,
      PRIMARY KEY (account_id, day, model, key_id)
    );
    CREATE TABLE ${s}.balances (
      account_id text PRIMARY KEY,
      balance_micro bigint NOT NULL,
      credited boolean NOT NULL
    );
    CREATE TABLE ${s}.admin_state (
      id smallint PRIMARY KEY CHECK (id = 1),
      version bigint NOT NULL,
      state text NOT NULL
    );`,
  // A prepaid charge whose balance after it is not known (its Redis settlement was not
  // confirmed) still counts in the balance. Adding a column with a constant default is instant,
  // but takes a lock that every insert queues behind: a long report holding the table makes the
  // start fail after 10 s (and start again) rather than stall the fleet's writes behind it.
  (s) => `SET LOCAL lock_timeout = '10s'; ALTER TABLE ${s}.entries ADD COLUMN balance_unknown boolean NOT NULL DEFAULT false;`,
];

/**
 * Creates the schema or brings it to the latest version. Safe when several instances start at
 * once: they take turns on an advisory lock, and each version is recorded with the change it made.
 */
export async function migrate(pool: Pool, schema: string): Promise<void> {
  const s = `"${schema}"`;
  const client = await pool.connect();
  let failed: Error | undefined;
  try {
    await client.query('SELECT pg_advisory_lock(hashtext($1))', [`model-gateway:${schema}`]);
    try {
      await client.query(`CREATE SCHEMA IF NOT EXISTS ${s}`);
      await client.query(`CREATE TABLE IF NOT EXISTS ${s}.schema_version (version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
      const { rows } = await client.query(`SELECT coalesce(max(version), 0) AS v FROM ${s}.schema_version`);
      const current = Number(rows[0]!.v);
      if (current > MIGRATIONS.length) {
        throw new Error(`the schema "${schema}" is at version ${current}, newer than this gateway knows (${MIGRATIONS.length}): upgrade the gateway`);
      }
      for (let v = current + 1; v <= MIGRATIONS.length; v++) {
        await client.query('BEGIN');
        try {
          await client.query(MIGRATIONS[v - 1]!(s));
          await client.query(`INSERT INTO ${s}.schema_version (version) VALUES ($1)`, [v]);
          await client.query('COMMIT');
        } catch (err) {
          await client.query('ROLLBACK').catch(() => {}); // the error that matters is the migration's
          throw err;
        }
      }
    } finally {
      // Never hides the migration's own error; a connection that broke is closed by its release.
      await client.query('SELECT pg_advisory_unlock(hashtext($1))', [`model-gateway:${schema}`]).catch((err: Error) => { failed ??= err; });
    }
  } catch (err) {
    failed = err as Error;
    throw err;
  } finally {
    client.release(failed);
  }
}
