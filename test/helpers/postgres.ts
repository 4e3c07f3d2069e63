import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';

/** The machine's PostgreSQL (trust auth, database `test`), or MG_TEST_PG_URL. */
export const PG_URL = process.env.MG_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

function psql(url: string, sql: string): string | null {
  const r = spawnSync('psql', [url, '-Atqc', sql], { encoding: 'utf8', timeout: 10_000 });
  return r.status === 0 ? r.stdout.trim() : null;
}

/** Why PostgreSQL tests are skipped here, or false when one answers. */
export const noPostgres: string | false = spawnSync('psql', ['--version']).status !== 0
  ? 'psql is not installed'
  : psql(PG_URL, 'SELECT 1') === '1' ? false : `no PostgreSQL answers at ${PG_URL}`;

/** A schema of its own for one test run (dropped after with `dropSchema`). */
export function freshSchema(): string {
  return `mg_test_${process.pid}_${randomBytes(4).toString('hex')}`;
}

export function dropSchema(schema: string, url = PG_URL): void {
  psql(url, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/** Runs one statement (tests that look at the tables themselves). */
export function sql(statement: string, url = PG_URL): string {
  const out = psql(url, statement);
  if (out === null) throw new Error(`psql failed: ${statement}`);
  return out;
}
