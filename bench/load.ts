/**
 * A small closed-loop HTTP/1.1 load generator for one GET endpoint.
 *
 * Node's http client costs more CPU per request than a lean server does, so on a 2-core box
 * it would measure itself. This one writes a precomputed request Buffer on raw keep-alive
 * `node:net` sockets and parses answers minimally: find the end of the headers, read the
 * status and `content-length`, wait for that many body bytes. One request in flight per
 * connection (no pipelining), a fixed number of connections, a fixed duration.
 *
 * Library: `load(options)`. CLI:
 *   node --import tsx bench/load.ts --url http://127.0.0.1:PORT [--key KEY] [--path /v1/models]
 *     [--duration 5] [--connections 32] [--models echo-1:mock,other:owner]
 */
import { request as httpRequest } from 'node:http';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';

// ---------------------------------------------------------------------------------------------
// Latency histogram: log-linear buckets in whole microseconds, at most 1/64 (~1.6%) relative
// error. Values below 128 us get one bucket each; above, each power of two is split in 64.
// ---------------------------------------------------------------------------------------------

const LINEAR = 128;
const SUB = 64;
const MAX_US = 0x7fffffff; // ~36 minutes; larger values are clamped (clz32 and >> need < 2^31)
const MAX_SHIFT = 25; // the shift of MAX_US

export class Histogram {
  readonly counts = new Float64Array(LINEAR + SUB * MAX_SHIFT);
  total = 0;
  maxUs = 0;

  record(us: number): void {
    const v = us <= 0 ? 0 : Math.min(Math.floor(us), MAX_US);
    if (v > this.maxUs) this.maxUs = v;
    this.counts[Histogram.index(v)]!++;
    this.total++;
  }

  static index(v: number): number {
    if (v < LINEAR) return v;
    const msb = 31 - Math.clz32(v); // >= 7
    const shift = msb - 6; // (v >> shift) lands in [64, 127]
    const mantissa = v >> shift;
    return LINEAR + (shift - 1) * SUB + (mantissa - SUB);
  }

  /** The upper edge of bucket `i` (what a percentile reports: conservative by < 1.6%). */
  static upper(i: number): number {
    if (i < LINEAR) return i;
    const shift = Math.floor((i - LINEAR) / SUB) + 1;
    const mantissa = ((i - LINEAR) % SUB) + SUB;
    return (mantissa + 1) * 2 ** shift - 1; // not <<: the top bucket reaches 2^31
  }

  /** The value at quantile q (0..1), in microseconds; 0 when empty. */
  quantileUs(q: number): number {
    if (this.total === 0) return 0;
    const rank = Math.max(1, Math.ceil(q * this.total));
    let seen = 0;
    for (let i = 0; i < this.counts.length; i++) {
      seen += this.counts[i]!;
      if (seen >= rank) return Math.min(Histogram.upper(i), this.maxUs);
    }
    return this.maxUs;
  }
}

// ---------------------------------------------------------------------------------------------
// Correctness check (node:http, one request): status, headers and the exact body.
// ---------------------------------------------------------------------------------------------

/** A model as `/v1/models` should list it; `created` is the server's start time, not known here. */
export interface ExpectedModel {
  id: string;
  owned_by: string;
}

export interface CheckResult {
  ok: boolean;
  problems: string[];
  status: number;
  /** Byte length of the checked 200 body: every answer under load must have this length. */
  bodyBytes: number;
}

/**
 * GETs `url + path` once with node:http and checks it against the `/v1/models` contract: 200,
 * `content-type: application/json`, an `x-request-id`, a right `content-length`, and a body equal
 * byte for byte to `{"object":"list","data":[...]}` built from `expected` (sorted by id), with
 * `created` taken from the answer after checking it is a plausible integer timestamp. With
 * `expected` null only the shape is checked.
 */
export function checkModels(url: string, path: string, headers: Record<string, string>, expected: ExpectedModel[] | null): Promise<CheckResult> {
  return new Promise((resolve) => {
    const problems: string[] = [];
    const req = httpRequest(new URL(path, url), { method: 'GET', headers, agent: false, timeout: 5000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks);
        const body = raw.toString('utf8');
        const status = res.statusCode ?? 0;
        if (status !== 200) problems.push(`status ${status}, want 200 (body ${body.slice(0, 200)})`);
        if (res.headers['content-type'] !== 'application/json') problems.push(`content-type ${JSON.stringify(res.headers['content-type'])}`);
        if (typeof res.headers['x-request-id'] !== 'string' || res.headers['x-request-id'] === '') problems.push('no x-request-id header');
        if (res.headers['content-length'] !== String(raw.length)) problems.push(`content-length ${JSON.stringify(res.headers['content-length'])} but ${raw.length} body bytes`);
        if (res.headers['transfer-encoding'] !== undefined) problems.push('chunked answer: the load generator needs content-length');
        if (status === 200) problems.push(...compareModelsBody(body, expected));
        resolve({ ok: problems.length === 0, problems, status, bodyBytes: raw.length });
      });
    });
    req.on('timeout', () => req.destroy(new Error('timed out after 5 s')));
    req.on('error', (err) => resolve({ ok: false, problems: [`request failed: ${err.message}`], status: 0, bodyBytes: 0 }));
    req.end();
  });
}

function compareModelsBody(body: string, expected: ExpectedModel[] | null): string[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    return [`body is not JSON: ${body.slice(0, 200)}`];
  }
  const data = (parsed as { data?: unknown }).data;
  if (!Array.isArray(data) || data.length === 0) return [`body has no data list: ${body.slice(0, 200)}`];
  const created = (data[0] as { created?: unknown }).created;
  const nowS = Date.now() / 1000;
  if (typeof created !== 'number' || !Number.isInteger(created) || created > nowS + 1 || created < nowS - 86_400) {
    return [`implausible created ${JSON.stringify(created)}`];
  }
  const models = expected ?? data.map((m: { id?: unknown; owned_by?: unknown }) => ({ id: String(m.id), owned_by: String(m.owned_by) }));
  const sorted = [...models].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const want = JSON.stringify({ object: 'list', data: sorted.map((m) => ({ id: m.id, object: 'model', created, owned_by: m.owned_by })) });
  return body === want ? [] : [`body differs\n    got  ${body}\n    want ${want}`];
}

// ---------------------------------------------------------------------------------------------
// The load loop.
// ---------------------------------------------------------------------------------------------

export interface LoadOptions {
  /** Base URL, `http://127.0.0.1:PORT` (only loopback is allowed). */
  url: string;
  path?: string;
  /** Extra request headers, e.g. `{ authorization: 'Bearer KEY' }`. */
  headers?: Record<string, string>;
  connections: number;
  durationS: number;
  /** What the body must be; null checks only the shape. */
  expected?: ExpectedModel[] | null;
  /** The server's process id, to report its CPU use over the timed window (Linux /proc). */
  serverPid?: number;
}

export interface LoadResult {
  /** Responses completed inside the timed window, per second. */
  rps: number;
  requests: number;
  elapsedS: number;
  p50Us: number;
  p99Us: number;
  p999Us: number;
  maxUs: number;
  /** Responses by status code (the timed window plus the drain of in-flight requests). */
  statuses: Record<string, number>;
  /** 200 answers whose body length differs from the checked one. */
  badBodies: number;
  /** Socket errors, unexpected closes and unparsable answers. */
  errors: number;
  /** CPU used in the timed window, in cores (1 = one core busy): this process, and the server's if known. */
  loaderCpu: number;
  serverCpu: number | null;
  /** The node:http correctness check done before loading. */
  check: CheckResult;
}

/** CPU seconds (user + system) a process has used, from /proc/PID/stat; null where unavailable. */
function processCpuS(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the ")" that ends the command name: utime and stime are the 12th and 13th.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100; // USER_HZ is 100 on Linux
  } catch {
    return null;
  }
}

const HEADER_END = Buffer.from('\r\n\r\n');
const CONTENT_LENGTH = Buffer.from('\r\ncontent-length:');

/** One keep-alive connection in a closed loop. */
class Conn {
  /** A request is written and its answer not yet complete. */
  busy = false;
  private dead = false;
  private pending: Buffer | null = null; // bytes of an answer whose headers are not complete
  private bodyLeft = -1; // body bytes still to come; -1 while reading headers
  private status = 0;
  private length = 0;
  private sentAt = 0;

  constructor(private readonly socket: Socket, private readonly run: Run) {
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', () => this.die());
    socket.on('close', () => this.die());
  }

  send(): void {
    this.busy = true;
    this.sentAt = performance.now();
    this.socket.write(this.run.requestBytes);
  }

  close(): void {
    this.dead = true;
    this.socket.destroy();
  }

  /** An error, an unexpected close or an unparsable answer: counted once, the socket dropped. */
  private die(): void {
    if (this.dead) return;
    this.dead = true;
    this.socket.destroy();
    this.run.fail(this);
  }

  private onData(chunk: Buffer): void {
    if (!this.busy) return this.die(); // bytes nobody asked for
    if (this.bodyLeft >= 0) return this.onBody(chunk.length);
    const buf = this.pending === null ? chunk : Buffer.concat([this.pending, chunk]);
    const end = buf.indexOf(HEADER_END);
    if (end === -1) {
      this.pending = buf;
      return;
    }
    this.pending = null;
    // "HTTP/1.1 200 ...": three ASCII digits at offset 9.
    this.status = (buf[9]! - 48) * 100 + (buf[10]! - 48) * 10 + (buf[11]! - 48);
    const length = contentLength(buf, end);
    if (length < 0) return this.die(); // chunked or malformed: not what this bench expects
    this.length = length;
    this.bodyLeft = length;
    this.onBody(buf.length - end - 4);
  }

  private onBody(bytes: number): void {
    this.bodyLeft -= bytes;
    if (this.bodyLeft > 0) return;
    if (this.bodyLeft < 0) return this.die(); // bytes beyond the answer: impossible without pipelining
    this.bodyLeft = -1;
    this.busy = false;
    this.run.done(this, this.status, performance.now() - this.sentAt, this.length);
  }
}

/** `content-length` (any case) from the header block `buf[0, end)`; -1 if missing. */
function contentLength(buf: Buffer, end: number): number {
  // Lower-case a copy of the header block (~150 bytes) so one indexOf finds the header.
  const head = Buffer.from(buf.subarray(0, end + 2));
  for (let i = 0; i < head.length; i++) {
    const c = head[i]!;
    if (c >= 65 && c <= 90) head[i] = c + 32;
  }
  const at = head.indexOf(CONTENT_LENGTH);
  if (at === -1) return -1;
  let i = at + CONTENT_LENGTH.length;
  while (head[i] === 32) i++;
  let n = 0;
  let digits = 0;
  for (; head[i]! >= 48 && head[i]! <= 57; i++, digits++) n = n * 10 + head[i]! - 48;
  return digits === 0 ? -1 : n;
}

/** Shared state of one timed run. */
class Run {
  readonly histogram = new Histogram();
  readonly statuses = new Map<number, number>();
  running = false;
  /** Answers completed inside the timed window. */
  counted = 0;
  badBodies = 0;
  errors = 0;
  /** Called when a failure ends the timed window early. */
  onAbort: () => void = () => {};
  private conns: Conn[] = [];
  private drained: (() => void) | null = null;

  constructor(readonly requestBytes: Buffer, readonly expectedBytes: number) {}

  start(conns: Conn[]): void {
    this.conns = conns;
    this.running = true;
    for (const c of conns) c.send();
  }

  done(conn: Conn, status: number, ms: number, bodyBytes: number): void {
    this.statuses.set(status, (this.statuses.get(status) ?? 0) + 1);
    if (status === 200 && bodyBytes !== this.expectedBytes) this.badBodies++;
    if (this.running) {
      this.histogram.record(ms * 1000);
      this.counted++;
      conn.send();
    } else {
      this.checkDrained();
    }
  }

  fail(_conn: Conn): void {
    this.errors++;
    if (this.running) {
      this.running = false; // a broken connection spoils the run: end it early
      this.onAbort();
    }
    this.checkDrained();
  }

  /** Stops sending; resolves once no connection has a request in flight. */
  stop(): Promise<void> {
    this.running = false;
    return new Promise((resolve) => {
      this.drained = resolve;
      this.checkDrained();
    });
  }

  private checkDrained(): void {
    if (this.drained !== null && !this.conns.some((c) => c.busy)) this.drained();
  }
}

function openSocket(host: string, port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port });
    socket.once('connect', () => {
      socket.removeListener('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}

/** Checks the target with node:http, then loads it for `durationS` seconds. */
export async function load(options: LoadOptions): Promise<LoadResult> {
  const target = new URL(options.url);
  if (target.hostname !== '127.0.0.1' || target.protocol !== 'http:') throw new Error(`only http://127.0.0.1 is allowed, got ${options.url}`);
  const port = Number(target.port);
  const path = options.path ?? '/v1/models';
  const headers = options.headers ?? {};

  const check = await checkModels(options.url, path, headers, options.expected ?? null);
  const empty = { rps: 0, requests: 0, elapsedS: 0, p50Us: 0, p99Us: 0, p999Us: 0, maxUs: 0, statuses: {}, badBodies: 0, errors: 0, loaderCpu: 0, serverCpu: null, check };
  if (!check.ok) return empty;

  const lines = [`GET ${path} HTTP/1.1`, `host: ${target.host}`];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  const run = new Run(Buffer.from(`${lines.join('\r\n')}\r\n\r\n`), check.bodyBytes);

  // Connect everything first: connection setup is not part of the timed window.
  const sockets = await Promise.all(Array.from({ length: options.connections }, () => openSocket(target.hostname, port)));
  const conns = sockets.map((s) => new Conn(s, run));

  const t0 = performance.now();
  const loaderCpu0 = process.cpuUsage();
  const serverCpu0 = processCpuS(options.serverPid);
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, options.durationS * 1000);
    run.onAbort = () => {
      clearTimeout(timer);
      resolve();
    };
    run.start(conns);
  });
  const counted = run.counted;
  const elapsedS = (performance.now() - t0) / 1000;
  const loaderCpu = process.cpuUsage(loaderCpu0);
  const serverCpu1 = processCpuS(options.serverPid);
  // Let in-flight requests finish (their statuses count; their latencies do not), at most 5 s.
  await Promise.race([run.stop(), new Promise((r) => setTimeout(r, 5000).unref())]);
  run.errors += conns.filter((c) => c.busy).length; // still unanswered after 5 s
  for (const c of conns) c.close();

  const h = run.histogram;
  return {
    rps: counted / elapsedS,
    requests: counted,
    elapsedS,
    p50Us: h.quantileUs(0.5),
    p99Us: h.quantileUs(0.99),
    p999Us: h.quantileUs(0.999),
    maxUs: h.maxUs,
    statuses: Object.fromEntries([...run.statuses].sort((a, b) => a[0] - b[0]).map(([s, n]) => [String(s), n])),
    badBodies: run.badBodies,
    errors: run.errors,
    loaderCpu: (loaderCpu.user + loaderCpu.system) / 1e6 / elapsedS,
    serverCpu: serverCpu0 === null || serverCpu1 === null ? null : (serverCpu1 - serverCpu0) / elapsedS,
    check,
  };
}

/** True when the run saw only correct 200 answers. */
export function clean(r: LoadResult): boolean {
  const non200 = Object.entries(r.statuses).some(([s, n]) => s !== '200' && n > 0);
  return r.check.ok && !non200 && r.badBodies === 0 && r.errors === 0 && r.requests > 0;
}

// ---------------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------------

function cli(argv: string[]): void {
  const flags = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i]!;
    const value = argv[i + 1];
    if (!name.startsWith('--') || value === undefined) {
      process.stderr.write('usage: load.ts --url http://127.0.0.1:PORT [--key KEY] [--path P] [--duration S] [--connections N] [--models id:owner,...]\n');
      process.exit(2);
    }
    flags.set(name.slice(2), value);
  }
  const key = flags.get('key');
  const models = flags.get('models');
  load({
    url: flags.get('url') ?? 'http://127.0.0.1:8080',
    path: flags.get('path') ?? '/v1/models',
    headers: key === undefined ? {} : { authorization: `Bearer ${key}` },
    durationS: Number(flags.get('duration') ?? 5),
    connections: Number(flags.get('connections') ?? 32),
    expected: models === undefined ? null : models.split(',').map((m) => {
      const [id, owned_by] = m.split(':');
      return { id: id!, owned_by: owned_by ?? '' };
    }),
  }).then((r) => {
    if (!r.check.ok) process.stderr.write(`correctness check failed:\n  ${r.check.problems.join('\n  ')}\n`);
    process.stdout.write(`${JSON.stringify(r, (k, v) => (k === 'check' ? { ok: v.ok, problems: v.problems } : typeof v === 'number' ? Math.round(v * 10) / 10 : v))}\n`);
    process.exitCode = clean(r) ? 0 : 1;
  }, (err: unknown) => {
    process.stderr.write(`load failed: ${String(err)}\n`);
    process.exitCode = 1;
  });
}

if (require.main === module) cli(process.argv.slice(2));
