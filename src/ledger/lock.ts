import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, readlinkSync, rmdirSync, statSync, unlinkSync, utimes, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';

/** The lock of a ledger directory is held by another instance. */
export class LedgerLockedError extends Error {
  constructor(readonly dir: string, holder: string) {
    super(`${dir} is in use by another gateway (${holder}); each instance needs its own ledger.dir (the lock is ${join(dir, LOCK_FILE)})`);
    this.name = 'LedgerLockedError';
  }
}

const LOCK_FILE = '.lock';

interface Holder {
  pid: number;
  host: string;
  token: string;
  /** When its process started, in clock ticks since boot (Linux), if known. */
  since?: string;
  /** Its pid namespace (Linux), if known: its pid means nothing in another one. */
  pidns?: string;
  /** Its machine's boot id (Linux), if known: one hostname may name two machines. */
  boot?: string;
}

/** Directories this process holds (a second FileLedger on one of them in the same process is refused too). */
const heldHere = new Set<string>();

/**
 * An exclusive lock on a ledger directory, so two instances never write one journal (a rolling
 * deploy that starts the new instance on the old one's volume): a `.lock` file created with
 * O_EXCL, naming the holder, its mtime refreshed every `heartbeatMs`. A lock is stale, and
 * taken over, when its holder is gone: on this host, no process has its pid; elsewhere (a
 * shared volume), or when the holder had this process's own pid (containers), its heartbeat
 * is older than `staleMs`.
 */
export class DirLock {
  private readonly path: string;
  private readonly timer: NodeJS.Timeout;
  private released = false;
  /** A heartbeat still under way: a frozen filesystem (a hung network mount) holds it. */
  private beating = false;

  private constructor(readonly dir: string, private readonly token: string, heartbeatMs: number) {
    this.path = join(dir, LOCK_FILE);
    // In the thread pool, one at a time: on a frozen filesystem a synchronous call froze the
    // whole gateway (probes and model lists too), and piled-up calls would fill the pool.
    this.timer = setInterval(() => {
      if (this.beating) return;
      this.beating = true;
      const now = new Date();
      utimes(this.path, now, now, () => { // gone: nothing to refresh; release() ignores it too
        this.beating = false;
      });
    }, heartbeatMs);
    this.timer.unref();
  }

  /** Takes the lock of `dir` (creating the directory), or throws LedgerLockedError. */
  static acquire(dir: string, options: { heartbeatMs?: number; staleMs?: number } = {}): DirLock {
    const heartbeatMs = options.heartbeatMs ?? 5000;
    const staleMs = options.staleMs ?? 3 * heartbeatMs;
    mkdirSync(dir, { recursive: true });
    if (heldHere.has(dir)) throw new LedgerLockedError(dir, `this process, pid ${process.pid}`);
    const path = join(dir, LOCK_FILE);
    const token = `${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const fd = openSync(path, 'wx');
        try {
          const since = processStart(process.pid);
          const pidns = pidNamespace();
          const boot = bootId();
          writeSync(fd, JSON.stringify({
            pid: process.pid, host: hostname(), token, started: new Date().toISOString(), ...(since !== null ? { since } : {}), ...(pidns !== null ? { pidns } : {}),
            ...(boot !== null ? { boot } : {}),
          }));
          fsyncSync(fd);
        } finally {
          closeSync(fd);
        }
        heldHere.add(dir);
        return new DirLock(dir, token, heartbeatMs);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      const holder = readHolder(path);
      const state = judge(path, holder, staleMs);
      if (state === 'live') {
        throw new LedgerLockedError(dir, holder === null ? 'unknown holder' : `pid ${holder.pid} on ${holder.host}`);
      }
      // The holder is gone: take its lock over, one taker at a time (see takeOver). A lock gone
      // meanwhile needs nothing removed: the create is tried again.
      if (state === 'stale') takeOver(dir, path, holder, staleMs);
    }
    throw new LedgerLockedError(dir, 'another instance took it over first');
  }

  /** Gives the lock back (only if it is still ours). */
  release(): void {
    if (this.released) return;
    this.released = true;
    clearInterval(this.timer);
    heldHere.delete(this.dir);
    if (readHolder(this.path)?.token === this.token) {
      try {
        unlinkSync(this.path);
      } catch { /* already gone */ }
    }
  }
}

/**
 * Removes a stale lock so that the O_EXCL create can be tried again, under a takeover guard (a
 * directory, made atomically): two takers that both judged the lock stale could otherwise each
 * remove the other's fresh lock and both go on. The one holding the guard removes the lock only
 * if it is still the one judged stale (same token); the others are refused. A guard left by a
 * taker that died is stale after `staleMs`.
 */
function takeOver(dir: string, path: string, judged: Holder | null, staleMs: number): void {
  const guard = `${path}.takeover`;
  try {
    mkdirSync(guard);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    let age = 0;
    try {
      age = Date.now() - statSync(guard).mtimeMs;
    } catch { /* gone meanwhile: its taker finished */ }
    if (age > staleMs) {
      try {
        rmdirSync(guard);
      } catch { /* another taker removed it first */ }
    }
    throw new LedgerLockedError(dir, 'another instance is taking it over');
  }
  try {
    // Removed only if it is still the lock judged stale: the same token, or, for one that could
    // not be read (half-written by a taker that died), one still unreadable and as old. A fresh
    // lock of another taker is never removed (found in a flaky test: a lock judged gone, or one
    // just created and not yet written, read as null and matched a null judged, and was
    // removed, so two takers both went on).
    const now = readHolder(path);
    if (judged !== null ? now?.token !== judged.token : now !== null || judge(path, null, staleMs) !== 'stale') return;
    try {
      unlinkSync(path);
    } catch { /* gone already */ }
  } finally {
    try {
      rmdirSync(guard);
    } catch { /* removed as stale by another taker: the create decides */ }
  }
}

function readHolder(path: string): Holder | null {
  try {
    const holder = JSON.parse(readFileSync(path, 'utf8')) as Holder;
    return typeof holder.pid === 'number' && typeof holder.host === 'string' ? holder : null;
  } catch {
    return null; // unreadable, or half-written by a holder that died while creating it
  }
}

/** Whether the lock at `path` (its holder as read) is held, stale, or gone already. */
function judge(path: string, holder: Holder | null, staleMs: number): 'live' | 'stale' | 'gone' {
  let age: number;
  try {
    age = Date.now() - statSync(path).mtimeMs;
  } catch {
    return 'gone';
  }
  return stale(holder, age, staleMs) ? 'stale' : 'live';
}

function stale(holder: Holder | null, age: number, staleMs: number): boolean {
  // Its pid is judged on this machine (boot id), in this pid namespace (found in review: a holder
  // in another container, or on another machine, with the same hostname, whose pid does not run
  // here, was taken over at once).
  if (holder !== null && holder.host === hostname() && holder.pid !== process.pid && (holder.pidns === undefined || holder.pidns === pidNamespace()) &&
    (holder.boot === undefined || holder.boot === bootId())) {
    let alive = true;
    try {
      process.kill(holder.pid, 0);
    } catch (err) {
      alive = (err as NodeJS.ErrnoException).code === 'EPERM'; // EPERM: running, another user's
    }
    if (!alive) return true;
    // Alive, unless the pid now names another process, one that started at another time
    // (found in review: after a restart that reused the holder's pid, the lock was never taken
    // over and every start failed), and the heartbeat stopped too.
    const since = typeof holder.since === 'string' ? processStart(holder.pid) : null;
    return since !== null && since !== holder.since && age > staleMs;
  }
  // Another host's, or a holder with this very pid (two containers are both pid 1): its heartbeat says.
  return age > staleMs;
}

/**
 * When process `pid` started, in clock ticks since boot (field 22 of Linux's /proc/PID/stat,
 * immune to clock changes), or null where that cannot be read.
 */
function processStart(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The fields after the command's closing parenthesis start with field 3.
    const start = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
    return start !== undefined && /^\d+$/.test(start) ? start : null;
  } catch {
    return null;
  }
}

/** This process's pid namespace ('pid:[N]', Linux), or null where it cannot be read. */
function pidNamespace(): string | null {
  try {
    return readlinkSync('/proc/self/ns/pid');
  } catch {
    return null;
  }
}

/** This machine's boot id (Linux: changes at every boot), or null where it cannot be read. */
function bootId(): string | null {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return null;
  }
}
