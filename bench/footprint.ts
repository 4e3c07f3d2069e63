/**
 * Footprint of the single-file build (issue "One binary"): idle memory, start-up time, memory
 * under load over many accounts and after it.
 *
 *   npm run build && node --import tsx bench/footprint.ts [--starts 10] [--accounts 10000] [--rate 1000]
 *     [--load 20] [--idle 75]
 *
 * Runs `node scripts/bundle.js` first (dist/model-gateway.js), then:
 *   1. start-up, spawn to the "listening" stdout line, `--starts` times each, alternating:
 *      the bundle (demo config), a bare node:http server that listens and prints the same line,
 *      and the unbundled dist/main.js (for comparison); medians. The first 3 starts of the
 *      bundle and of the bare server also stay idle 2 s, then VmRSS is read (/proc/PID/status).
 *   2. the bundle with a config of `--accounts` accounts, one sha256 key each: RSS idle, then
 *      under an open-loop `--rate` req/s of GET /v1/models spread round-robin over all keys for
 *      `--load` s (RSS sampled every 500 ms, the maximum kept), then idle `--idle` s after the
 *      load (every RPM window has passed after 60 s; the limiter sweeps idle state every 5 s).
 * Prints tables and a final JSON line. Exits 1 when an answer is not a correct 200.
 */
import { execFileSync, spawn } from 'node:child_process';
import { hash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fmtInt, fmtMB, fmtMs, int, median, metText, num, parseFlags, round3, runMain, statusText } from './cli.js';
import { non200, once, openLoop, rawRequest, rssBytes, sleep, startChild, stopChild, waitForQuiet, watchOthers } from './rawhttp.js';

const ROOT = resolve(__dirname, '..');
const BUNDLE = 'dist/model-gateway.js';
const TARGET_IDLE_MB = 50;
const TARGET_START_MS = 150;
const TARGET_LOAD_MB = 100;
const MB = 1024 * 1024;

const FLAGS = {
  starts: int({ default: 10, help: 'start-ups of each server, alternating' }),
  accounts: int({ default: 10_000, help: 'accounts (one key each) in the config of phase 2' }),
  rate: num({ default: 1000, arg: 'R', help: 'phase 2: requests per second, open loop' }),
  loadS: num({ name: 'load', default: 20, help: 'phase 2: seconds of load' }),
  idleS: num({ name: 'idle', default: 75, help: 'phase 2: seconds idle after the load' }),
  /** Diagnosis: V8's --max-semi-space-size for the gateway of phase 2; 0 = Node's default. */
  semiSpaceMB: int({ name: 'max-semi-space', default: 0, min: 0, arg: 'MB', help: "phase 2: V8's --max-semi-space-size for the gateway, 0 = Node's default" }),
};

/** The least a Node server can be: node:http, listens, prints the same "listening" line. */
const BARE_SERVER = `'use strict';
const http = require('node:http');
const server = http.createServer((req, res) => res.end('ok'));
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ msg: 'listening', url: 'http://127.0.0.1:' + server.address().port }) + '\\n');
});
process.on('SIGTERM', () => process.exit(0));
`;

interface FullGc {
  /** Milliseconds since the gateway started, as V8 prints it. */
  atMs: number;
  kind: string;
  beforeMB: number;
  afterMB: number;
  count: number;
}

/** The latest full (mark-compact) collection in a --trace-gc log, and how many there were. */
function lastFullGc(log: string): FullGc | null {
  const re = /(\d+) ms: (Mark-Compact[^\d]*?) ([\d.]+) \(([\d.]+)\) -> ([\d.]+) \(([\d.]+)\) MB/g;
  let last: FullGc | null = null;
  let count = 0;
  for (const m of log.matchAll(re)) {
    count++;
    last = { atMs: Number(m[1]), kind: m[2]!.trim(), beforeMB: Number(m[3]), afterMB: Number(m[5]), count };
  }
  return last;
}

const gcText = (g: FullGc | null) => (g === null ? 'no full GC yet' : `${g.afterMB} MB (full GC #${g.count}, ${g.kind}, ${(g.atMs / 1000).toFixed(1)} s after start)`);

interface Start {
  ms: number;
  rss: number | null;
}

/** Spawns, times the "listening" line on stdout (a pipe, read as it comes), optionally reads RSS after `idleMs`, stops. */
function startOnce(args: string[], idleMs: number | null): Promise<Start> {
  return new Promise((resolveStart, reject) => {
    const t0 = performance.now();
    const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] });
    let seen = '';
    let ms = -1;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${args.join(' ')}: no listening line within 15 s`));
    }, 15_000);
    child.stdout.on('data', (chunk: Buffer) => {
      if (ms >= 0) return; // drained, ignored
      seen += chunk.toString('utf8');
      if (!seen.includes('"msg":"listening"')) return;
      ms = performance.now() - t0;
      clearTimeout(timer);
      const finish = (rss: number | null) => {
        child.once('exit', () => resolveStart({ ms, rss }));
        child.kill('SIGTERM');
        setTimeout(() => child.kill('SIGKILL'), 5000).unref();
      };
      if (idleMs === null) finish(null);
      else setTimeout(() => finish(rssBytes(child.pid)), idleMs);
    });
    child.once('exit', (code, signal) => {
      if (ms < 0) {
        clearTimeout(timer);
        reject(new Error(`${args.join(' ')} exited (${signal ?? code}) before listening`));
      }
    });
  });
}

async function main(): Promise<number> {
  const flags = parseFlags('footprint.ts', FLAGS);
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-footprint-'));
  let stopGateway: (() => Promise<void>) | null = null;
  const cleanup = async () => {
    if (stopGateway !== null) await stopGateway();
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('SIGINT', () => void cleanup().finally(() => process.exit(130)));
  let bad = 0;
  try {
    process.stdout.write(execFileSync(process.execPath, ['scripts/bundle.js'], { cwd: ROOT, encoding: 'utf8' }));
    await waitForQuiet('footprint.ts');
    const others = watchOthers();
    const bareFile = join(dir, 'bare-server.js');
    writeFileSync(bareFile, BARE_SERVER);
    const cpu = cpus();
    process.stdout.write(`footprint bench: node ${process.version}, ${cpu.length} CPU (${cpu[0]?.model ?? '?'}), ${new Date().toISOString()}\n`);

    // 1. Start-up time and idle RSS.
    const targets: Record<string, string[]> = {
      bundle: [BUNDLE, '--port', '0'],
      bare: [bareFile],
      'dist/main.js': ['dist/main.js', '--port', '0'],
    };
    const names = Object.keys(targets);
    const starts: Record<string, Start[]> = Object.fromEntries(names.map((n) => [n, []]));
    for (const n of names) await startOnce(targets[n]!, null); // warm the file cache
    for (let i = 0; i < flags.starts; i++) {
      for (const n of i % 2 === 0 ? names : [...names].reverse()) {
        const idle = i < 3 && n !== 'dist/main.js' ? 2000 : null;
        starts[n]!.push(await startOnce(targets[n]!, idle));
      }
    }
    const startMs = Object.fromEntries(names.map((n) => [n, median(starts[n]!.map((s) => s.ms))])) as Record<string, number>;
    const idleRss = Object.fromEntries(['bundle', 'bare'].map((n) => [n, median(starts[n]!.filter((s) => s.rss !== null).map((s) => s.rss!))])) as Record<string, number>;
    process.stdout.write(`\n1. start-up (spawn to "listening" line), median of ${flags.starts}; idle RSS after 2 s, median of 3\n`);
    for (const n of names) {
      const all = starts[n]!.map((s) => s.ms.toFixed(0)).join(' ');
      process.stdout.write(`  ${n.padEnd(13)} start ${startMs[n]!.toFixed(1).padStart(6)} ms  [${all}]${idleRss[n] === undefined ? '' : `  idle RSS ${fmtMB(idleRss[n]!)} MB [${starts[n]!.filter((s) => s.rss !== null).map((s) => fmtMB(s.rss)).join(' ')}]`}\n`);
    }
    others.endPhase('1 start-up and idle RSS');
    const startRatio = startMs.bundle! / startMs.bare!;
    const idleRatio = idleRss.bundle! / idleRss.bare!;
    process.stdout.write(`  bundle / bare: start-up ${startRatio.toFixed(2)}x (+${(startMs.bundle! - startMs.bare!).toFixed(1)} ms; target <= ${TARGET_START_MS} ms: ${metText(startMs.bundle! <= TARGET_START_MS)}), ` +
      `idle RSS ${idleRatio.toFixed(2)}x (+${fmtMB(idleRss.bundle! - idleRss.bare!)} MB; target <= ${TARGET_IDLE_MB} MB: ${metText(idleRss.bundle! <= TARGET_IDLE_MB * MB)})\n`);

    // 2. RSS over many accounts.
    process.stdout.write(`\n2. ${fmtInt(flags.accounts)} accounts (one sha256 key each, plan rpm 60, concurrency 4): open loop ${fmtInt(flags.rate)} req/s of GET /v1/models round-robin over the keys for ${flags.loadS} s, then ${flags.idleS} s idle\n`);
    const secret = randomBytes(8).toString('hex');
    const keyOf = (i: number) => `sk-fp-${secret}-${i}`;
    const accounts: Record<string, unknown> = {};
    const keys: Record<string, unknown> = {};
    for (let i = 0; i < flags.accounts; i++) {
      accounts[`acct_${i}`] = { plan: 'std' };
      keys[`key_${i}`] = { account: `acct_${i}`, sha256: hash('sha256', keyOf(i)) };
    }
    const configFile = join(dir, 'accounts.json');
    writeFileSync(configFile, JSON.stringify({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      limiter: { store: 'memory' },
      ledger: { store: 'memory' },
      plans: { std: { rpm: 60, concurrency: 4 } },
      accounts,
      keys,
      models: { 'echo-1': { provider: 'mock' }, 'mock-gpt-4o-mini': { provider: 'mock', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } } },
      providers: { mock: { protocol: 'mock' } },
    }));
    // --trace-gc: V8 prints a line per collection on stdout (with the access log), heap used
    // before -> after; the gateway itself exposes nothing new.
    const v8Flags = flags.semiSpaceMB > 0 ? [`--max-semi-space-size=${flags.semiSpaceMB}`] : [];
    if (v8Flags.length > 0) process.stdout.write(`  (diagnosis: the gateway runs with ${v8Flags.join(' ')})\n`);
    const gw = await startChild('bundle-accounts', process.execPath, ['--trace-gc', ...v8Flags, BUNDLE, '--config', configFile, '--port', '0'], dir, { cwd: ROOT });
    const heap = () => lastFullGc(readFileSync(gw.stdoutFile, 'utf8'));
    stopGateway = () => stopChild(gw.child);
    const requests = Array.from({ length: flags.accounts }, (_, i) => rawRequest('GET', gw.port, '/v1/models', { authorization: `Bearer ${keyOf(i)}` }));
    const probe = await once(gw.port, requests[0]!);
    if (probe.status !== 200) throw new Error(`GET /v1/models answered ${probe.status}: ${probe.body?.toString('utf8')}`);
    const expectBytes = probe.bodyBytes;
    await sleep(2000);
    const rssStart = rssBytes(gw.pid);
    const heapStart = heap();

    const samples: Array<{ t: number; rss: number | null }> = [];
    const t0 = performance.now();
    const sampler = setInterval(() => samples.push({ t: (performance.now() - t0) / 1000, rss: rssBytes(gw.pid) }), 500);
    const res = await openLoop({ port: gw.port, requests, durationS: flags.loadS, ratePerS: flags.rate, pool: 64, expectBytes });
    const loadEnd = (performance.now() - t0) / 1000;
    others.endPhase('2 load');
    bad += non200(res);
    const during = samples.filter((s) => s.t <= loadEnd && s.rss !== null).map((s) => s.rss!);
    const maxLoad = Math.max(...during);
    const rssAtEnd = rssBytes(gw.pid);
    const heapAtEnd = heap();
    process.stdout.write(`  load: ${fmtInt(res.sent)} sent, ${fmtInt(res.rps)} answered/s, p50 ${fmtMs(res.total.quantileUs(0.5))} ms, p99 ${fmtMs(res.total.quantileUs(0.99))} ms, ` +
      `statuses ${statusText(res)}\n`);
    process.stdout.write(`  RSS idle with the config ${fmtMB(rssStart)} MB; under load max ${fmtMB(maxLoad)} MB (target <= ${TARGET_LOAD_MB} MB: ${metText(maxLoad <= TARGET_LOAD_MB * MB)}); at the end of the load ${fmtMB(rssAtEnd)} MB\n`);

    const checkpoints = [5, 30, 60, 65, 70, flags.idleS].filter((s, i, a) => s <= flags.idleS && a.indexOf(s) === i);
    const after: Record<string, number | null> = {};
    for (const c of checkpoints) {
      const wait = loadEnd + c - (performance.now() - t0) / 1000;
      if (wait > 0) await sleep(wait * 1000);
      after[`${c}s`] = rssBytes(gw.pid);
    }
    clearInterval(sampler);
    others.endPhase('3 idle after load');
    const idleSamples = samples.filter((s) => s.t > loadEnd && s.rss !== null).map((s) => s.rss!);
    const heapEnd = heap();
    process.stdout.write(`  RSS after the load stopped: ${checkpoints.map((c) => `+${c} s ${fmtMB(after[`${c}s`]!)} MB`).join(', ')}; lowest ${fmtMB(Math.min(...idleSamples))} MB\n`);
    process.stdout.write(`  V8 heap used after the latest full GC (--trace-gc): before the load ${gcText(heapStart)}; at the end of the load ${gcText(heapAtEnd)}; at the end ${gcText(heapEnd)}\n`);
    const series = samples.filter((_, i) => i % 4 === 0).map((s) => `${s.t.toFixed(0)}s:${fmtMB(s.rss)}`).join(' ');
    process.stdout.write(`  RSS series (MB, every 2 s): ${series}\n`);
    await stopChild(gw.child);
    stopGateway = null;

    process.stdout.write(`\nphases during which another bench (bench/ledger*) ran: ${others.disturbed().join(', ') || 'none'}\n`);
    const r1 = (x: number) => Math.round(x * 10) / 10;
    const mb = (b: number | null) => (b === null ? null : r1(b / MB));
    process.stdout.write(`${JSON.stringify({
      bench: 'footprint', node: process.version, date: new Date().toISOString(), cpus: cpu.length, flags,
      startMs: Object.fromEntries(names.map((n) => [n, r1(startMs[n]!)])), startRatio: round3(startRatio),
      idleRssMB: { bundle: mb(idleRss.bundle!), bare: mb(idleRss.bare!) }, idleRatio: round3(idleRatio),
      accounts: { rssIdleMB: mb(rssStart), rssMaxUnderLoadMB: mb(maxLoad), rssEndOfLoadMB: mb(rssAtEnd),
        rssAfterMB: Object.fromEntries(Object.entries(after).map(([k, v]) => [k, mb(v)])), sent: res.sent, p99Ms: res.total.quantileUs(0.99) / 1000,
        heapAfterFullGcMB: { beforeLoad: heapStart?.afterMB ?? null, endOfLoad: heapAtEnd?.afterMB ?? null, end: heapEnd?.afterMB ?? null } },
      disturbedPhases: others.disturbed(), bad,
    })}\n`);
  } finally {
    await cleanup();
  }
  return bad === 0 ? 0 : 1;
}

runMain('footprint bench', main);
