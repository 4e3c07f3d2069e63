import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, utimesSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { DirLock, LedgerLockedError } from '../../src/ledger/lock.js';

const tmp = () => mkdtempSync(join(tmpdir(), 'mg-lock-'));
/** The pid of a process that has exited. */
const deadPid = () => spawnSync(process.execPath, ['-e', '0']).pid!;

describe('the ledger directory lock', () => {
  test('one holder at a time; released, it can be taken again', () => {
    const dir = tmp();
    const lock = DirLock.acquire(dir);
    assert.throws(() => DirLock.acquire(dir), (err: unknown) => err instanceof LedgerLockedError && err.message.includes(dir));
    lock.release();
    lock.release();
    DirLock.acquire(dir).release();
  });

  test('a lock whose process is gone (this host) is taken over; a live one is not', () => {
    const dir = tmp();
    writeFileSync(join(dir, '.lock'), JSON.stringify({ pid: deadPid(), host: hostname(), token: 'old' }));
    const lock = DirLock.acquire(dir);
    assert.notEqual(JSON.parse(readFileSync(join(dir, '.lock'), 'utf8')).token, 'old');
    lock.release();
    writeFileSync(join(dir, '.lock'), JSON.stringify({ pid: process.ppid, host: hostname(), token: 'live' }));
    assert.throws(() => DirLock.acquire(dir), LedgerLockedError);
  });

  test('a lock whose pid now names another process (a restart that reused it) is taken over; the holder itself is not (found in review: every start failed until the lock was deleted)', () => {
    const dir = tmp();
    const path = join(dir, '.lock');
    const stat = readFileSync(`/proc/${process.ppid}/stat`, 'utf8');
    const since = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!;
    writeFileSync(path, JSON.stringify({ pid: process.ppid, host: hostname(), token: 'holder', since }));
    assert.throws(() => DirLock.acquire(dir), LedgerLockedError, 'the process that wrote it still runs');
    writeFileSync(path, JSON.stringify({ pid: process.ppid, host: hostname(), token: 'reused', since: String(Number(since) - 1) }));
    assert.throws(() => DirLock.acquire(dir, { staleMs: 60_000 }), LedgerLockedError, 'its heartbeat still runs: another pid namespace\'s holder, say');
    const old = new Date(Date.now() - 120_000);
    utimesSync(path, old, old);
    const lock = DirLock.acquire(dir, { staleMs: 60_000 });
    assert.equal(JSON.parse(readFileSync(path, 'utf8')).pid, process.pid);
    lock.release();
  });

  test('a lock from another pid namespace with this hostname (a container on the host\'s network, a shared volume) is judged by its heartbeat, not by a pid that means nothing here (found in review: taken over at once)', () => {
    const dir = tmp();
    const path = join(dir, '.lock');
    writeFileSync(path, JSON.stringify({ pid: deadPid(), host: hostname(), token: 'elsewhere', pidns: 'pid:[1]' }));
    assert.throws(() => DirLock.acquire(dir, { staleMs: 60_000 }), LedgerLockedError, 'its heartbeat runs');
    const old = new Date(Date.now() - 120_000);
    utimesSync(path, old, old);
    DirLock.acquire(dir, { staleMs: 60_000 }).release();
    // Written by this namespace: a pid that does not run is gone, at once (a restart on the same host).
    const lock = DirLock.acquire(dir);
    const written = JSON.parse(readFileSync(path, 'utf8')) as { pidns?: string };
    lock.release();
    assert.match(written.pidns ?? '', /^pid:\[\d+\]$/);
    writeFileSync(path, JSON.stringify({ pid: deadPid(), host: hostname(), token: 'gone', pidns: written.pidns }));
    DirLock.acquire(dir).release();
    // Another machine with the same hostname (its boot id differs): its heartbeat says.
    writeFileSync(path, JSON.stringify({ pid: deadPid(), host: hostname(), token: 'twin', pidns: written.pidns, boot: 'another-machine' }));
    assert.throws(() => DirLock.acquire(dir, { staleMs: 60_000 }), LedgerLockedError);
    utimesSync(path, old, old);
    DirLock.acquire(dir, { staleMs: 60_000 }).release();
  });

  test('another host\'s lock (a shared volume) is stale once its heartbeat stops, not before', () => {
    const dir = tmp();
    const path = join(dir, '.lock');
    writeFileSync(path, JSON.stringify({ pid: 1, host: 'elsewhere', token: 'far' }));
    assert.throws(() => DirLock.acquire(dir, { staleMs: 60_000 }), LedgerLockedError);
    const old = new Date(Date.now() - 120_000);
    utimesSync(path, old, old);
    DirLock.acquire(dir, { staleMs: 60_000 }).release();
  });

  test('a lock file that cannot be read (its holder died writing it) is judged by its age', () => {
    const dir = tmp();
    writeFileSync(join(dir, '.lock'), '{"pid":');
    assert.throws(() => DirLock.acquire(dir, { staleMs: 60_000 }), LedgerLockedError);
    const old = new Date(Date.now() - 120_000);
    utimesSync(join(dir, '.lock'), old, old);
    DirLock.acquire(dir, { staleMs: 60_000 }).release();
  });

  test('release leaves alone a lock that is no longer its own', () => {
    const dir = tmp();
    const lock = DirLock.acquire(dir);
    writeFileSync(join(dir, '.lock'), JSON.stringify({ pid: process.ppid, host: hostname(), token: 'someone-else' }));
    lock.release();
    assert.equal(JSON.parse(readFileSync(join(dir, '.lock'), 'utf8')).token, 'someone-else');
  });

  test('many instances taking over one stale lock at the same moment: exactly one gets it (found in review: two could, each removing the other\'s fresh lock)', async () => {
    const lockModule = join(__dirname, '..', '..', 'src', 'ledger', 'lock.ts');
    for (let round = 0; round < 4; round++) {
      const dir = tmp();
      writeFileSync(join(dir, '.lock'), JSON.stringify({ pid: deadPid(), host: hostname(), token: 'old' }));
      const go = Date.now() + 1500; // every process tries at this instant (loading takes a while)
      // Each says what it got, then holds on (alive, so its lock is not stale) until told to end.
      const script = `
        const { DirLock } = require(${JSON.stringify(lockModule)});
        while (Date.now() < ${go});
        let got = false;
        try { DirLock.acquire(${JSON.stringify(dir)}); got = true; } catch {}
        process.stdout.write(got ? 'got' : 'refused');
        process.stdin.on('end', () => process.exit(0)).resume();
      `;
      const children = Array.from({ length: 8 }, () => spawn(process.execPath, ['--import', 'tsx', '-e', script], { stdio: ['pipe', 'pipe', 'inherit'] }));
      try {
        const outcomes = await Promise.all(children.map((child) => new Promise<string>((resolve) => {
          child.stdout.once('data', (d: Buffer) => resolve(d.toString()));
          child.once('exit', () => resolve('exited'));
        })));
        assert.equal(outcomes.filter((o) => o === 'got').length, 1, `round ${round}: ${outcomes.join(' ')}`);
      } finally {
        await Promise.all(children.map((child) => new Promise((resolve) => {
          child.once('exit', resolve);
          child.stdin!.end();
        })));
      }
    }
  });
});
