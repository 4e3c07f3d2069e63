import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

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

const PG_BIN = '/usr/lib/postgresql/15/bin';

/** Whether a private PostgreSQL cluster can be made here (initdb and pg_ctl), or why not. */
export const noPrivateCluster: string | false = spawnSync(`${PG_BIN}/initdb`, ['--version']).status === 0
  ? false : `no initdb at ${PG_BIN}`;

/**
 * A PostgreSQL cluster of the test's own on a free port, which it can stop and start (an
 * outage the machine's server must not suffer). Run as the `postgres` user when the tests
 * run as root (initdb refuses root).
 */
export class PostgresServer {
  private dir = '';
  port = 0;

  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/postgres`;
  }

  private run(command: string, args: string[]): void {
    const root = process.getuid?.() === 0;
    const r = root
      ? spawnSync('runuser', ['-u', 'postgres', '--', `${PG_BIN}/${command}`, ...args], { encoding: 'utf8', timeout: 60_000 })
      : spawnSync(`${PG_BIN}/${command}`, args, { encoding: 'utf8', timeout: 60_000 });
    if (r.status !== 0) throw new Error(`${command} failed: ${r.stderr || r.stdout}`);
  }

  async start(): Promise<this> {
    if (this.dir === '') {
      this.dir = mkdtempSync(join(tmpdir(), 'mg-pg-'));
      if (process.getuid?.() === 0) {
        const uid = Number(execFileSync('id', ['-u', 'postgres']).toString());
        const gid = Number(execFileSync('id', ['-g', 'postgres']).toString());
        chownSync(this.dir, uid, gid);
      }
      this.run('initdb', ['-D', `${this.dir}/data`, '-A', 'trust', '-U', 'postgres', '--no-sync']);
      this.port = await freePort();
    }
    this.run('pg_ctl', ['-D', `${this.dir}/data`, '-w', '-l', `${this.dir}/log`, '-o',
      `-p ${this.port} -k ${this.dir} -c listen_addresses=127.0.0.1 -c fsync=off`, 'start']);
    return this;
  }

  /** Stops at once (as a crash would: no clean shutdown of the clients' sessions). */
  stop(): void {
    this.run('pg_ctl', ['-D', `${this.dir}/data`, '-m', 'immediate', '-w', 'stop']);
  }

  /** Freezes the cluster (the server and its sessions stop answering, their sockets stay open), or thaws it. */
  pause(): void {
    this.signal('SIGSTOP');
  }

  resume(): void {
    this.signal('SIGCONT');
  }

  /** The server first (so it forks no session meanwhile), then its sessions; one that ended meanwhile is skipped. */
  private signal(signal: NodeJS.Signals): void {
    const main = Number(readFileSync(join(this.dir, 'data', 'postmaster.pid'), 'utf8').split('\n')[0]);
    process.kill(main, signal);
    const children = spawnSync('pgrep', ['-P', String(main)], { encoding: 'utf8' }).stdout.trim().split(/\s+/).filter(Boolean).map(Number);
    for (const pid of children) {
      try {
        process.kill(pid, signal);
      } catch {
        // ended meanwhile
      }
    }
  }

  async remove(): Promise<void> {
    try {
      this.stop();
    } catch {
      // already stopped
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
