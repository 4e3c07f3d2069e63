/**
 * Shared pieces of the bench scripts (cli.ts has their flags, rounds and formats): a raw
 * keep-alive HTTP/1.1 client on `node:net` for any method, closed-loop and open-loop drivers,
 * child-process servers, /proc readings and the "wait until the other bench is done" gate.
 *
 * The client writes precomputed request Buffers and parses answers minimally, like load.ts:
 * status, `content-length` or `transfer-encoding: chunked` (decoded chunk by chunk, so a
 * streamed answer's first body byte is timed: time to first token), one request in flight per
 * connection, no pipelining.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { connect, createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Histogram } from './histogram.js';

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/** A complete HTTP/1.1 request as bytes. */
export function rawRequest(method: string, port: number, path: string, headers: Record<string, string>, body?: string): Buffer {
  const lines = [`${method} ${path} HTTP/1.1`, `host: 127.0.0.1:${port}`];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  if (body !== undefined) lines.push(`content-length: ${Buffer.byteLength(body)}`);
  return Buffer.from(`${lines.join('\r\n')}\r\n\r\n${body ?? ''}`);
}

export interface Answer {
  status: number;
  /** Decoded body bytes (chunk framing excluded). */
  bodyBytes: number;
  /** Milliseconds from the write to the end of the headers, to the first body byte, to the end. */
  headMs: number;
  firstByteMs: number;
  totalMs: number;
  /** The decoded body, and the status line and headers, when the request asked to keep them. */
  body: Buffer | null;
  head: string | null;
  chunked: boolean;
}

const HEADER_END = Buffer.from('\r\n\r\n');

/** Modes of the answer parser. */
const enum M { Idle, Head, Length, ChunkSize, ChunkData, ChunkCrlf, LastCrlf }

/** One keep-alive connection: one request in flight, answers decoded (content-length or chunked). */
export class RawConn {
  busy = false;
  dead = false;
  private mode = M.Idle;
  private pending: Buffer | null = null;
  private left = 0;
  private sizeLine = '';
  private status = 0;
  private bodyBytes = 0;
  private chunked = false;
  private sentAt = 0;
  private headAt = 0;
  private firstAt = 0;
  private keep: Buffer[] | null = null;
  private head: string | null = null;
  /** Extra milliseconds to add to the measured latency (an open-loop request that waited for a connection). */
  private lateMs = 0;

  constructor(private readonly socket: Socket, private readonly onAnswer: (conn: RawConn, a: Answer) => void, private readonly onDead: (conn: RawConn) => void) {
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', () => this.die());
    socket.on('close', () => this.die());
  }

  send(request: Buffer, keepBody = false, lateMs = 0): void {
    this.busy = true;
    this.mode = M.Head;
    this.pending = null;
    this.status = 0;
    this.bodyBytes = 0;
    this.chunked = false;
    this.headAt = 0;
    this.firstAt = 0;
    this.keep = keepBody ? [] : null;
    this.lateMs = lateMs;
    this.sentAt = performance.now();
    this.socket.write(request);
  }

  close(): void {
    this.dead = true;
    this.socket.destroy();
  }

  private die(): void {
    if (this.dead) return;
    this.dead = true;
    this.socket.destroy();
    this.onDead(this);
  }

  private onData(chunk: Buffer): void {
    if (this.mode === M.Idle) return this.die(); // bytes nobody asked for
    let buf = chunk;
    let i = 0;
    if (this.mode === M.Head) {
      buf = this.pending === null ? chunk : Buffer.concat([this.pending, chunk]);
      const end = buf.indexOf(HEADER_END);
      if (end === -1) {
        this.pending = buf;
        return;
      }
      this.pending = null;
      this.headAt = performance.now();
      this.status = (buf[9]! - 48) * 100 + (buf[10]! - 48) * 10 + (buf[11]! - 48);
      if (this.keep !== null) this.head = buf.toString('latin1', 0, end);
      const head = buf.toString('latin1', 0, end + 2).toLowerCase();
      const cl = /\r\ncontent-length: *(\d+)\r\n/.exec(head);
      if (cl !== null) {
        this.left = Number(cl[1]);
        this.mode = M.Length;
      } else if (/\r\ntransfer-encoding: *chunked\r\n/.test(head)) {
        this.chunked = true;
        this.mode = M.ChunkSize;
        this.sizeLine = '';
      } else {
        return this.die(); // no framing: not what this bench expects
      }
      i = end + 4;
      if (this.mode === M.Length && this.left === 0) return this.finish(buf, i);
    }
    while (i < buf.length) {
      switch (this.mode) {
        case M.Length:
        case M.ChunkData: {
          const take = Math.min(this.left, buf.length - i);
          if (this.firstAt === 0) this.firstAt = performance.now();
          if (this.keep !== null) this.keep.push(buf.subarray(i, i + take));
          this.bodyBytes += take;
          this.left -= take;
          i += take;
          if (this.left === 0) {
            if (this.mode === M.Length) return this.finish(buf, i);
            this.mode = M.ChunkCrlf;
            this.left = 2;
          }
          break;
        }
        case M.ChunkSize: {
          const lf = buf.indexOf(10, i);
          if (lf === -1) {
            this.sizeLine += buf.toString('latin1', i);
            i = buf.length;
            break;
          }
          this.sizeLine += buf.toString('latin1', i, lf);
          i = lf + 1;
          const size = parseInt(this.sizeLine, 16);
          this.sizeLine = '';
          if (!Number.isFinite(size)) return this.die();
          if (size === 0) {
            this.mode = M.LastCrlf; // no trailers expected: just the closing CRLF
            this.left = 2;
          } else {
            this.mode = M.ChunkData;
            this.left = size;
          }
          break;
        }
        case M.ChunkCrlf:
        case M.LastCrlf: {
          const take = Math.min(this.left, buf.length - i);
          this.left -= take;
          i += take;
          if (this.left === 0) {
            if (this.mode === M.LastCrlf) return this.finish(buf, i);
            this.mode = M.ChunkSize;
          }
          break;
        }
        default:
          return this.die();
      }
    }
  }

  private finish(buf: Buffer, at: number): void {
    if (at !== buf.length) return this.die(); // bytes beyond the answer: impossible without pipelining
    const now = performance.now();
    this.mode = M.Idle;
    this.busy = false;
    const late = this.lateMs;
    const answer: Answer = {
      status: this.status,
      bodyBytes: this.bodyBytes,
      headMs: this.headAt - this.sentAt + late,
      firstByteMs: (this.firstAt === 0 ? now : this.firstAt) - this.sentAt + late,
      totalMs: now - this.sentAt + late,
      body: this.keep === null ? null : Buffer.concat(this.keep),
      head: this.head,
      chunked: this.chunked,
    };
    this.keep = null;
    this.head = null;
    this.onAnswer(this, answer);
  }
}

export function openSocket(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.removeListener('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}

/** One request on a fresh connection, body kept: for correctness checks. */
export async function once(port: number, request: Buffer, timeoutMs = 5000): Promise<Answer> {
  const socket = await openSocket(port);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      conn.close();
      reject(new Error(`no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    const conn = new RawConn(socket, (c, a) => {
      clearTimeout(timer);
      c.close();
      resolve(a);
    }, () => {
      clearTimeout(timer);
      reject(new Error('connection closed before the answer was complete'));
    });
    conn.send(request, true);
  });
}

// ---------------------------------------------------------------------------------------------
// Load drivers
// ---------------------------------------------------------------------------------------------

export interface RunResult {
  /** Answers completed inside the timed window, per second. */
  rps: number;
  requests: number;
  elapsedS: number;
  /** Total latency (write to last byte). */
  total: Histogram;
  /** Write to first body byte (for streams: the first SSE event, i.e. time to first token). */
  first: Histogram;
  statuses: Record<string, number>;
  /** Answers whose body length differs from `expectBytes` (when given) or that fail `check`. */
  badBodies: number;
  errors: number;
  /** Open loop only: requests that found no free connection and waited for one (their wait is counted in their latency). */
  queued: number;
  /** Open loop only: requests sent over the window, and requests still unanswered at the end. */
  sent: number;
  unanswered: number;
  loaderCpuS: number;
  /** CPU seconds (user + system) each watched process used in the timed window. */
  cpuS: Record<string, number | null>;
  /** Machine-wide CPU jiffies over the timed window (closed loop only; null elsewhere or on other systems). */
  machine: { busy: number; total: number; steal: number } | null;
}

export interface DriveOptions {
  port: number;
  /** Requests used round-robin. */
  requests: Buffer[];
  durationS: number;
  /** Body length every 200 must have, or null. */
  expectBytes?: number | null;
  /** Keep each body and check it (slower; for streams). */
  check?: ((body: Buffer) => boolean) | null;
  /** Processes whose CPU use over the window is reported, by name. */
  watch?: Record<string, number>;
}

function histogramsAndCounters() {
  return { total: new Histogram(), first: new Histogram(), statuses: new Map<number, number>(), badBodies: 0, errors: 0 };
}

function record(s: ReturnType<typeof histogramsAndCounters>, a: Answer, opts: DriveOptions, timed: boolean): void {
  s.statuses.set(a.status, (s.statuses.get(a.status) ?? 0) + 1);
  if (a.status === 200) {
    if (opts.expectBytes != null && a.bodyBytes !== opts.expectBytes) s.badBodies++;
    else if (opts.check != null && (a.body === null || !opts.check(a.body))) s.badBodies++;
  }
  if (timed) {
    s.total.record(a.totalMs * 1000);
    s.first.record(a.firstByteMs * 1000);
  }
}

function cpuOf(watch: Record<string, number> | undefined): Record<string, number | null> {
  const out: Record<string, number | null> = {};
  for (const [name, pid] of Object.entries(watch ?? {})) out[name] = processCpuS(pid);
  return out;
}

function cpuDelta(a: Record<string, number | null>, b: Record<string, number | null>): Record<string, number | null> {
  const out: Record<string, number | null> = {};
  for (const name of Object.keys(a)) out[name] = a[name] === null || b[name] === null ? null : b[name]! - a[name]!;
  return out;
}

/** Closed loop: `connections` keep-alive connections, each sending its next request as soon as the last is answered. */
export async function closedLoop(opts: DriveOptions & { connections: number }): Promise<RunResult> {
  const s = histogramsAndCounters();
  const keep = opts.check != null;
  let running = false;
  let counted = 0;
  let next = 0;
  let drained: (() => void) | null = null;
  const conns: RawConn[] = [];
  const checkDrained = () => {
    if (drained !== null && !conns.some((c) => c.busy && !c.dead)) drained();
  };
  const sockets = await Promise.all(Array.from({ length: opts.connections }, () => openSocket(opts.port)));
  let abort: () => void = () => {};
  for (const socket of sockets) {
    conns.push(new RawConn(socket, (c, a) => {
      record(s, a, opts, running);
      if (running) {
        counted++;
        c.send(opts.requests[next++ % opts.requests.length]!, keep);
      } else {
        checkDrained();
      }
    }, () => {
      s.errors++;
      if (running) abort();
      checkDrained();
    }));
  }
  const t0 = performance.now();
  const cpu0 = cpuOf(opts.watch);
  const loader0 = process.cpuUsage();
  const machine0 = machineCpu();
  running = true;
  for (const c of conns) c.send(opts.requests[next++ % opts.requests.length]!, keep);
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, opts.durationS * 1000);
    abort = () => {
      clearTimeout(timer);
      resolve();
    };
  });
  running = false;
  const elapsedS = (performance.now() - t0) / 1000;
  const loader = process.cpuUsage(loader0);
  const cpu = cpuDelta(cpu0, cpuOf(opts.watch));
  const machine1 = machineCpu();
  const requests = counted;
  await Promise.race([new Promise<void>((r) => { drained = r; checkDrained(); }), sleep(5000)]);
  const unanswered = conns.filter((c) => c.busy && !c.dead).length;
  for (const c of conns) c.close();
  return {
    rps: requests / elapsedS, requests, elapsedS, total: s.total, first: s.first,
    statuses: Object.fromEntries([...s.statuses].map(([k, v]) => [String(k), v])),
    badBodies: s.badBodies, errors: s.errors + unanswered, queued: 0, sent: requests, unanswered,
    loaderCpuS: (loader.user + loader.system) / 1e6, cpuS: cpu,
    machine: machine0 === null || machine1 === null ? null
      : { busy: machine1.busy - machine0.busy, total: machine1.total - machine0.total, steal: machine1.steal - machine0.steal },
  };
}

/**
 * Open loop: requests leave on a timer at `ratePerS` whatever the answers do. A 1 ms timer
 * sends however many are due, so they leave spread out, not in bursts. Each goes on a free
 * connection of a pre-opened pool; with none free it waits for one and the wait counts in its
 * latency (no coordinated omission). Latency is measured from the moment of writing.
 */
export async function openLoop(opts: DriveOptions & { ratePerS: number; pool: number }): Promise<RunResult> {
  const s = histogramsAndCounters();
  const keep = opts.check != null;
  let running = false;
  let counted = 0;
  let sent = 0;
  let queuedCount = 0;
  const idle: RawConn[] = [];
  const waiting: number[] = []; // intended send times of requests that found no free connection
  const all: RawConn[] = [];
  const request = () => opts.requests[sent++ % opts.requests.length]!;
  const sockets = await Promise.all(Array.from({ length: opts.pool }, () => openSocket(opts.port)));
  for (const socket of sockets) {
    const conn = new RawConn(socket, (c, a) => {
      record(s, a, opts, running);
      if (running) counted++;
      const intended = waiting.shift();
      if (intended !== undefined && running) c.send(request(), keep, performance.now() - intended);
      else idle.push(c);
    }, () => {
      s.errors++;
    });
    all.push(conn);
    idle.push(conn);
  }
  const cpu0 = cpuOf(opts.watch);
  const loader0 = process.cpuUsage();
  const t0 = performance.now();
  running = true;
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now();
      const elapsed = now - t0;
      if (elapsed >= opts.durationS * 1000) return resolve();
      const due = Math.floor((elapsed / 1000) * opts.ratePerS);
      while (sent + waiting.length < due) {
        let c = idle.pop();
        while (c !== undefined && c.dead) c = idle.pop(); // a connection the server closed
        if (c === undefined) {
          queuedCount++;
          waiting.push(t0 + (sent + waiting.length) * (1000 / opts.ratePerS));
        } else {
          c.send(request(), keep);
        }
      }
      setTimeout(tick, 1);
    };
    tick();
  });
  running = false;
  const elapsedS = (performance.now() - t0) / 1000;
  const loader = process.cpuUsage(loader0);
  const cpu = cpuDelta(cpu0, cpuOf(opts.watch));
  waiting.length = 0;
  for (let i = 0; i < 500 && all.some((c) => c.busy && !c.dead); i++) await sleep(10);
  const unanswered = all.filter((c) => c.busy && !c.dead).length;
  for (const c of all) c.close();
  return {
    rps: counted / elapsedS, requests: counted, elapsedS, total: s.total, first: s.first,
    statuses: Object.fromEntries([...s.statuses].map(([k, v]) => [String(k), v])),
    badBodies: s.badBodies, errors: s.errors + unanswered, queued: queuedCount, sent, unanswered,
    loaderCpuS: (loader.user + loader.system) / 1e6, cpuS: cpu, machine: null,
  };
}

/** Answers that were not a correct 200 (any run result: this file's or load.ts's). */
export function non200(r: { statuses: Record<string, number>; badBodies: number; errors: number }): number {
  return Object.entries(r.statuses).reduce((n, [k, v]) => n + (k === '200' ? 0 : v), 0) + r.badBodies + r.errors;
}

/** CPU microseconds per answered request of a watched process over a run; null when unknown. */
export function perReq(r: RunResult, name: string): number | null {
  const s = r.cpuS[name];
  return s === null || s === undefined || r.requests === 0 ? null : (s * 1e6) / r.requests;
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/** CPU seconds (user + system) a process has used, from /proc/PID/stat; null where unavailable. */
export function processCpuS(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100; // utime + stime, USER_HZ = 100
  } catch {
    return null;
  }
}

/** VmRSS of a process in bytes, from /proc/PID/status; null where unavailable. */
export function rssBytes(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m === null ? null : Number(m[1]) * 1024;
  } catch {
    return null;
  }
}

/**
 * Machine-wide CPU jiffies from /proc/stat (Linux): busy (run in this VM: not idle, iowait or
 * steal), stolen (wanted but given by the hypervisor to other guests of the host), total; null elsewhere.
 */
export function machineCpu(): { busy: number; total: number; steal: number } | null {
  try {
    // "cpu user nice system idle iowait irq softirq steal guest guest_nice"; guest is inside user.
    const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number);
    const total = f.reduce((a, b) => a + b, 0);
    const steal = f[7] ?? 0;
    return { busy: total - f[3]! - f[4]! - steal, total, steal };
  } catch {
    return null;
  }
}

/** Share of the machine's CPU time stolen by other guests of the host between two readings. */
export function stealShare(a: ReturnType<typeof machineCpu>, b: ReturnType<typeof machineCpu>): number | null {
  return a === null || b === null || b.total <= a.total ? null : (b.steal - a.steal) / (b.total - a.total);
}

export interface Child {
  name: string;
  url: string;
  port: number;
  child: ChildProcess;
  pid: number;
  stdoutFile: string;
  stderrFile: string;
}

/**
 * Spawns `command args` with stdout and stderr going to files (a gateway writes an access-log
 * line per request: a file never blocks it and costs the load generator nothing), then waits
 * for its "listening" JSON line.
 */
export async function startChild(name: string, command: string, args: string[], dir: string, options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<Child> {
  const stdoutFile = `${dir}/${name}.stdout.log`;
  const stderrFile = `${dir}/${name}.stderr.log`;
  const out = openSync(stdoutFile, 'w');
  const err = openSync(stderrFile, 'w');
  const child = spawn(command, args, { cwd: options.cwd, env: options.env ?? process.env, stdio: ['ignore', out, err] });
  closeSync(out);
  closeSync(err);
  let exited: string | null = null;
  child.on('exit', (code, signal) => {
    exited = `exited (${signal ?? code})`;
  });
  const deadline = Date.now() + (options.timeoutMs ?? 20_000);
  for (;;) {
    const text = readFileSync(stdoutFile, 'utf8');
    const line = text.split('\n').find((l) => l.includes('"msg":"listening"'));
    if (line !== undefined) {
      const url = (JSON.parse(line) as { url: string }).url;
      return { name, url, port: Number(new URL(url).port), child, pid: child.pid!, stdoutFile, stderrFile };
    }
    if (exited !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`${name} did not start: ${exited ?? 'no listening line in time'}\n${readFileSync(stderrFile, 'utf8')}`);
    }
    await sleep(20);
  }
}

/** SIGTERM (a gateway drains and closes its ledger), SIGKILL after `killAfterMs`. */
export async function stopChild(child: ChildProcess, killAfterMs = 5000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), killAfterMs);
  await exited;
  clearTimeout(timer);
}

/** A port free right now on 127.0.0.1 (for servers that cannot take port 0, like redis-server). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createNetServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Waits while another benchmark (`bench/ledger*.ts`) runs on this 2-core machine, polling every
 * 10 s for at most 15 minutes, so two measurements never share the cores.
 */
export async function waitForQuiet(label: string): Promise<void> {
  const deadline = Date.now() + 15 * 60_000;
  let said = false;
  for (;;) {
    const busy = otherBenchRunning() ? 'yes' : '';
    if (busy === '') return;
    if (Date.now() > deadline) {
      process.stderr.write(`${label}: another benchmark is still running after 15 minutes; measuring anyway\n`);
      return;
    }
    if (!said) process.stderr.write(`${label}: waiting for another benchmark (bench/ledger*) to finish...\n`);
    said = true;
    await sleep(10_000);
  }
}

/** True when another benchmark (`bench/ledger*`, or a wrapper naming it) is running now. */
function otherBenchRunning(): boolean {
  try {
    return execFileSync('pgrep', ['-f', 'bench/ledger'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() !== '';
  } catch {
    return false; // pgrep exits 1 when nothing matches
  }
}

/**
 * Watches, every 5 s, whether another benchmark (`bench/ledger*`) runs while this one
 * measures. `endPhase(name)` closes a phase: it is listed in `disturbed()` when the other
 * bench was seen during it, so a disturbed run says which of its figures to distrust.
 */
export function watchOthers(): { endPhase: (name: string) => void; disturbed: () => string[] } {
  let current = false;
  const disturbed: string[] = [];
  const timer = setInterval(() => {
    execFile('pgrep', ['-f', 'bench/ledger'], (err, stdout) => {
      if (err === null && stdout.trim() !== '') current = true;
    });
  }, 5000);
  timer.unref();
  return {
    endPhase(name) {
      if (current || otherBenchRunning()) disturbed.push(name);
      current = false;
    },
    disturbed: () => disturbed,
  };
}
