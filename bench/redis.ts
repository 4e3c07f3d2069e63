/**
 * `GET /v1/models` with the Redis limiter against the memory limiter, in one run, and Redis
 * memory per active account (issue "Scale out on Redis", item 7).
 *
 *   npm run build && node --import tsx bench/redis.ts [--rounds 5] [--duration 5] [--connections 32] [--warmup 3]
 *     [--accounts 1000] [--rpms 60,600]
 *
 * Starts its own `redis-server` on a free port of 127.0.0.1 (no persistence), and two gateways
 * (dist/main.js) with the same config except `limiter`: `{"store":"memory"}` and
 * `{"store":"redis","url":...,"timeoutMs":1000}`; one plan with rpm 2,000,000 (a real window,
 * never reached) and concurrency 100,000.
 *
 *   1. throughput: bench/load.ts against each gateway, alternating (the order rotates each
 *      round): req/s, p50, p99, gateway CPU per request, Redis CPU per request
 *   2. memory: for rpm R in --rpms, FLUSHALL, then `RedisLimiter.admitInstant` (dist/, what
 *      `/v1/models` calls) for --accounts accounts, each R times (its full RPM) within the
 *      minute; Redis `used_memory` before and after -> bytes per active account
 *
 * Prints tables and a final JSON line. Exits 1 when a check fails or an answer is not a correct 200.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { hash, randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { RedisLimiter as RedisLimiterType } from '../dist/limiter/redis.js';
import { clean, load, type ExpectedModel, type LoadResult } from './load.js';
import { fmtInt, freePort, machineCpu, median, processCpuS, sleep, startChild, stopChild, waitForQuiet, watchOthers, type Child } from './rawhttp.js';

const ROOT = resolve(__dirname, '..');
const TARGET_RATIO = 0.4;

interface Flags {
  rounds: number;
  durationS: number;
  connections: number;
  warmupS: number;
  accounts: number;
  rpms: number[];
}

function parseFlags(argv: string[]): Flags {
  const flags: Flags = { rounds: 5, durationS: 5, connections: 32, warmupS: 3, accounts: 1000, rpms: [60, 600] };
  for (let i = 0; i < argv.length; i++) {
    const [name, inline] = argv[i]!.split('=', 2) as [string, string | undefined];
    const raw = inline ?? argv[++i] ?? '';
    const nums = raw.split(',').map(Number);
    const bad = nums.some((n) => !Number.isFinite(n) || n <= 0);
    if (name === '--rounds' && !bad) flags.rounds = nums[0]!;
    else if (name === '--duration' && !bad) flags.durationS = nums[0]!;
    else if (name === '--connections' && !bad) flags.connections = nums[0]!;
    else if (name === '--warmup' && !bad) flags.warmupS = nums[0]!;
    else if (name === '--accounts' && !bad) flags.accounts = nums[0]!;
    else if (name === '--rpms' && !bad) flags.rpms = nums;
    else {
      process.stderr.write('usage: redis.ts [--rounds N] [--duration S] [--connections N] [--warmup S] [--accounts N] [--rpms 60,600]\n');
      process.exit(2);
    }
  }
  return flags;
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

interface Redis {
  port: number;
  child: ChildProcess;
  cli: (...args: string[]) => string;
}

async function startRedis(dir: string): Promise<Redis> {
  const port = await freePort();
  const log = openSync(join(dir, 'redis.log'), 'w');
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no', '--dir', dir], {
    stdio: ['ignore', log, log],
  });
  closeSync(log);
  const cli = (...args: string[]) => execFileSync('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args], { encoding: 'utf8' }).trim();
  for (let i = 0; ; i++) {
    try {
      if (cli('ping') === 'PONG') return { port, child, cli };
    } catch {
      // not up yet
    }
    if (child.exitCode !== null || i > 100) {
      child.kill('SIGKILL');
      throw new Error(`redis-server did not start on ${port}:\n${readFileSync(join(dir, 'redis.log'), 'utf8')}`);
    }
    await sleep(50);
  }
}

function info(redis: Redis, section: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of redis.cli('info', section).split(/\r?\n/)) {
    const at = line.indexOf(':');
    if (at > 0) out[line.slice(0, at)] = line.slice(at + 1);
  }
  return out;
}

const usedMemory = (redis: Redis) => Number(info(redis, 'memory').used_memory);

// ---------------------------------------------------------------------------------------------
// Memory per account
// ---------------------------------------------------------------------------------------------

interface MemoryResult {
  rpm: number;
  accounts: number;
  admissions: number;
  rejected: number;
  elapsedS: number;
  admissionsPerS: number;
  keys: number;
  usedBefore: number;
  usedAfter: number;
  bytesPerAccount: number;
  encoding: string;
  memoryUsageOfOneWindow: number;
}

async function memoryPerAccount(redis: Redis, rpm: number, accounts: number): Promise<MemoryResult> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { RedisLimiter } = require(join(ROOT, 'dist/limiter/redis.js')) as { RedisLimiter: typeof RedisLimiterType };
  redis.cli('flushall');
  const limiter = new RedisLimiter({ url: `redis://127.0.0.1:${redis.port}`, prefix: 'mg:', timeoutMs: 10_000 });
  try {
    await limiter.whenReady(5000);
    const key = { id: 'key_bench', rpm: null, concurrency: null };
    const account = (i: number) => ({ id: `acct_${String(i).padStart(6, '0')}`, rpm, concurrency: 100, dailyCapMicro: null, prepaid: false });
    // Load the script and open the connection before the "before" reading, then drop that key.
    await limiter.admitInstant({ ...account(0), id: 'warmup' }, key, null);
    redis.cli('del', 'mg:{warmup}:wt', 'mg:{warmup}:wn');
    await sleep(200);
    const usedBefore = usedMemory(redis);

    // Round-robin over the accounts, `rpm` passes: every account at its full RPM, a few hundred
    // admissions in flight at a time (node-redis pipelines them on its one connection).
    const total = rpm * accounts;
    let issued = 0;
    let rejected = 0;
    const t0 = performance.now();
    await new Promise<void>((resolveAll, rejectAll) => {
      let inFlight = 0;
      let finished = 0;
      const pump = () => {
        while (inFlight < 256 && issued < total) {
          const n = issued++;
          inFlight++;
          limiter.admitInstant(account(n % accounts), key, null).then((d) => {
            if (!d.ok) rejected++;
            inFlight--;
            if (++finished === total) resolveAll();
            else pump();
          }, rejectAll);
        }
      };
      pump();
    });
    const elapsedS = (performance.now() - t0) / 1000;
    await sleep(200);
    const usedAfter = usedMemory(redis);
    const keys = Number(redis.cli('dbsize'));
    // The window is a sorted set of milliseconds (wt) and a small hash of counts (wn).
    const sample = `mg:{${account(accounts - 1).id}}:wt`;
    return {
      rpm, accounts, admissions: total, rejected, elapsedS, admissionsPerS: total / elapsedS, keys, usedBefore, usedAfter,
      bytesPerAccount: (usedAfter - usedBefore) / accounts,
      encoding: redis.cli('object', 'encoding', sample),
      memoryUsageOfOneWindow: Number(redis.cli('memory', 'usage', sample, 'samples', '0')) +
        Number(redis.cli('memory', 'usage', sample.replace(/:wt$/, ':wn'), 'samples', '0')),
    };
  } finally {
    await limiter.close();
    redis.cli('flushall');
  }
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

type Result = LoadResult & { cpuUsPerReq: number | null; redisCpuUsPerReq: number | null };

async function main(): Promise<number> {
  const flags = parseFlags(process.argv.slice(2));
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-redis-'));
  const servers: Child[] = [];
  let redis: Redis | null = null;
  const cleanup = async () => {
    await Promise.all(servers.map((s) => stopChild(s.child)));
    if (redis !== null) await stopChild(redis.child);
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('SIGINT', () => void cleanup().finally(() => process.exit(130)));
  let failures = 0;
  try {
    await waitForQuiet('redis.ts');
    const others = watchOthers();
    redis = await startRedis(dir);
    const redisVersion = info(redis, 'server').redis_version ?? '?';

    const key = `sk-bench-${randomBytes(16).toString('hex')}`;
    const models = {
      'echo-1': { provider: 'mock' },
      'mock-gpt-4o-mini': { provider: 'mock', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
    };
    const expected: ExpectedModel[] = Object.entries(models).map(([id, m]) => ({ id, owned_by: m.provider }));
    const config = (limiter: Record<string, unknown>) => ({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      limiter,
      ledger: { store: 'memory' },
      plans: { bench: { rpm: 2_000_000, concurrency: 100_000 } },
      accounts: { acct_bench: { plan: 'bench' } },
      keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', key) } },
      models,
      providers: { mock: { protocol: 'mock' } },
    });
    const files = { memory: join(dir, 'memory.json'), redis: join(dir, 'redis.json') };
    writeFileSync(files.memory, JSON.stringify(config({ store: 'memory' })));
    writeFileSync(files.redis, JSON.stringify(config({ store: 'redis', url: `redis://127.0.0.1:${redis.port}`, timeoutMs: 1000 })));
    const targets = ['memory', 'redis'] as const;
    for (const t of targets) servers.push(await startChild(t, process.execPath, ['dist/main.js', '--config', files[t], '--port', '0'], dir, { cwd: ROOT }));
    const serverOf = (t: string) => servers.find((s) => s.name === t)!;

    const cpu = cpus();
    process.stdout.write(`redis bench: node ${process.version}, redis ${redisVersion}, ${cpu.length} CPU (${cpu[0]?.model ?? '?'}), ${new Date().toISOString()}\n`);
    process.stdout.write(`\n1. GET /v1/models, memory vs redis limiter: ${flags.connections} connections, ${flags.rounds} rounds x ${flags.durationS} s per target\n`);
    const steal0 = machineCpu();
    const run = async (t: string, durationS: number): Promise<Result> => {
      const s = serverOf(t);
      const r0 = processCpuS(redis!.child.pid);
      const r = await load({ url: s.url, path: '/v1/models', headers: { authorization: `Bearer ${key}` }, connections: flags.connections, durationS, expected, serverPid: s.pid });
      const r1 = processCpuS(redis!.child.pid);
      return {
        ...r,
        cpuUsPerReq: r.serverCpu === null || r.requests === 0 ? null : (r.serverCpu * r.elapsedS * 1e6) / r.requests,
        redisCpuUsPerReq: t !== 'redis' || r0 === null || r1 === null || r.requests === 0 ? null : ((r1 - r0) * 1e6) / r.requests,
      };
    };
    for (const t of targets) {
      const w = await run(t, flags.warmupS);
      if (!w.check.ok) throw new Error(`${t}: correctness check failed: ${w.check.problems.join('; ')}`);
    }
    const results: Record<string, Result[]> = { memory: [], redis: [] };
    process.stdout.write(`  ${'round'.padEnd(6)}${'target'.padEnd(8)}${'req/s'.padStart(9)}${'p50 ms'.padStart(8)}${'p99 ms'.padStart(8)}${'p99.9 ms'.padStart(10)}${'gw us/req'.padStart(11)}${'redis us/req'.padStart(14)}  statuses\n`);
    for (let round = 0; round < flags.rounds; round++) {
      for (const t of round % 2 === 0 ? targets : [...targets].reverse()) {
        const r = await run(t, flags.durationS);
        results[t]!.push(r);
        if (!clean(r)) failures++;
        const statuses = Object.entries(r.statuses).map(([k, v]) => `${k}:${v}`).join(' ') + (r.errors > 0 ? ` errors:${r.errors}` : '') + (r.badBodies > 0 ? ` bad:${r.badBodies}` : '');
        process.stdout.write(`  ${String(round + 1).padEnd(6)}${t.padEnd(8)}${fmtInt(r.rps).padStart(9)}${(r.p50Us / 1000).toFixed(2).padStart(8)}${(r.p99Us / 1000).toFixed(2).padStart(8)}` +
          `${(r.p999Us / 1000).toFixed(2).padStart(10)}${(r.cpuUsPerReq?.toFixed(1) ?? '?').padStart(11)}${(r.redisCpuUsPerReq?.toFixed(1) ?? '-').padStart(14)}  ${statuses}\n`);
      }
    }
    const steal1 = machineCpu();
    others.endPhase('1 throughput');
    const med = (t: string, f: (r: Result) => number) => median(results[t]!.map(f));
    const summary = Object.fromEntries(targets.map((t) => [t, {
      rps: med(t, (r) => r.rps), p50Us: med(t, (r) => r.p50Us), p99Us: med(t, (r) => r.p99Us), p999Us: med(t, (r) => r.p999Us),
      cpuUsPerReq: med(t, (r) => r.cpuUsPerReq ?? NaN),
    }])) as Record<'memory' | 'redis', { rps: number; p50Us: number; p99Us: number; p999Us: number; cpuUsPerReq: number }>;
    const redisCpu = med('redis', (r) => r.redisCpuUsPerReq ?? NaN);
    const ratio = summary.redis.rps / summary.memory.rps;
    const paired = median(results.memory!.map((m, i) => results.redis![i]!.rps / m.rps));
    for (const t of targets) {
      const s = summary[t];
      process.stdout.write(`  median ${t.padEnd(7)} ${fmtInt(s.rps)} req/s, p50 ${(s.p50Us / 1000).toFixed(2)} ms, p99 ${(s.p99Us / 1000).toFixed(2)} ms, p99.9 ${(s.p999Us / 1000).toFixed(2)} ms, gateway ${s.cpuUsPerReq.toFixed(1)} us CPU/req\n`);
    }
    process.stdout.write(`  redis / memory: throughput ${ratio.toFixed(3)}x (target >= ${TARGET_RATIO}: ${ratio >= TARGET_RATIO ? 'met' : 'NOT met'}), paired per round ${paired.toFixed(3)}x; ` +
      `p99 ${(summary.redis.p99Us / summary.memory.p99Us).toFixed(2)}x; gateway CPU/req ${(summary.redis.cpuUsPerReq / summary.memory.cpuUsPerReq).toFixed(2)}x; redis-server ${redisCpu.toFixed(1)} us CPU/req\n`);
    const steal = steal0 !== null && steal1 !== null && steal1.total > steal0.total ? (steal1.steal - steal0.steal) / (steal1.total - steal0.total) : null;
    process.stdout.write(`  CPU steal by other guests during phase 1: ${steal === null ? '?' : `${Math.round(steal * 100)}%`}\n`);

    // Phase 2: the gateways are stopped first so nothing else touches Redis.
    await Promise.all(servers.map((s) => stopChild(s.child)));
    process.stdout.write(`\n2. Redis memory per active account: ${flags.accounts} accounts, each admitted its full RPM (RedisLimiter.admitInstant, dist/)\n`);
    const memory: MemoryResult[] = [];
    for (const rpm of flags.rpms) {
      const m = await memoryPerAccount(redis, rpm, flags.accounts);
      memory.push(m);
      if (m.rejected > 0) failures++;
      process.stdout.write(`  rpm ${String(rpm).padEnd(5)} ${fmtInt(m.admissions)} admissions in ${m.elapsedS.toFixed(1)} s (${fmtInt(m.admissionsPerS)}/s, ${m.rejected} rejected), ${m.keys} keys, ` +
        `used_memory ${fmtInt(m.usedBefore)} -> ${fmtInt(m.usedAfter)} B: ${fmtInt(m.bytesPerAccount)} B per account (${(m.bytesPerAccount / rpm).toFixed(1)} B per admission in the window); ` +
        `window encoding ${m.encoding}, MEMORY USAGE of one window ${fmtInt(m.memoryUsageOfOneWindow)} B\n`);
      if (m.elapsedS > 55) process.stdout.write('  (took longer than the window: the first admissions may have left it; per-account figure is then low)\n');
    }

    others.endPhase('2 memory');
    process.stdout.write(`\nphases during which another bench (bench/ledger*) ran: ${others.disturbed().join(', ') || 'none'}\n`);
    const r3 = (x: number) => Math.round(x * 1000) / 1000;
    process.stdout.write(`${JSON.stringify({
      bench: 'redis', node: process.version, redisVersion, date: new Date().toISOString(), cpus: cpu.length, flags,
      memory: { rps: Math.round(summary.memory.rps), p50Ms: summary.memory.p50Us / 1000, p99Ms: summary.memory.p99Us / 1000, cpuUsPerReq: r3(summary.memory.cpuUsPerReq) },
      redis: { rps: Math.round(summary.redis.rps), p50Ms: summary.redis.p50Us / 1000, p99Ms: summary.redis.p99Us / 1000, cpuUsPerReq: r3(summary.redis.cpuUsPerReq), redisServerCpuUsPerReq: r3(redisCpu) },
      throughputRatio: r3(ratio), pairedThroughputRatio: r3(paired), p99Ratio: r3(summary.redis.p99Us / summary.memory.p99Us),
      memoryPerAccount: memory.map((m) => ({ rpm: m.rpm, accounts: m.accounts, bytesPerAccount: Math.round(m.bytesPerAccount), encoding: m.encoding, admissionsPerS: Math.round(m.admissionsPerS), rejected: m.rejected })),
      steal: steal === null ? null : r3(steal), disturbedPhases: others.disturbed(), failures,
    })}\n`);
  } finally {
    await cleanup();
  }
  return failures === 0 ? 0 : 1;
}

main().then((code) => {
  process.exitCode = code;
}, (err: unknown) => {
  process.stderr.write(`redis bench failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exitCode = 1;
});
