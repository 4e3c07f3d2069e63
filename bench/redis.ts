/**
 * The Redis limiter against the memory limiter, in one run: `GET /v1/models` and a billable chat
 * call, and Redis memory per active account (issue "Scale out on Redis", item 7).
 *
 *   npm run build && node --import tsx bench/redis.ts [--rounds 10] [--duration 1] [--processes 3] [--connections 32]
 *     [--warmup 2] [--accounts 1000] [--rpms 60,600] [--phases models,chat,memory]
 *
 * Starts its own `redis-server` on a free port of 127.0.0.1 (no persistence), and gateways
 * (dist/main.js, `--processes` of each kind, as bench/run.ts does and for the same reason:
 * processes of one build differ by up to 16 % on this VM) with the same config except `limiter`: `{"store":"memory"}` and
 * `{"store":"redis","url":...,"timeoutMs":1000}`; memory ledger, mock provider; a plan with rpm
 * 2,000,000 (a real window, never reached) and concurrency 100,000 for each of two accounts:
 * one for `/v1/models`, one prepaid (balance and daily cap of $1,000,000, never reached) for chat.
 *
 *   1. models: `GET /v1/models` against each gateway process, closed loop, alternating (the order
 *      rotates each round; a limiter's figure in a round is the mean over its processes): req/s,
 *      p50, p99, gateway CPU per request, Redis CPU per request;
 *      redis/memory throughput target >= 0.40
 *   2. chat: `POST /v1/chat/completions`, non-streamed, a small body, to a priced mock model:
 *      every call is admitted with a reservation and settled (ledger and limiter), in the
 *      same rounds and columns; target >= 0.70
 *   3. memory: for rpm R in --rpms, FLUSHALL, then `RedisLimiter.admitInstant` (dist/, what
 *      `/v1/models` calls) for --accounts accounts, each R times (its full RPM) within the
 *      minute; Redis `used_memory` before and after -> bytes per active account
 * `--phases` picks some of them. Each throughput phase first checks one answer of each gateway
 * (the models list; a chat completion echoing the prompt, with its usage).
 *
 * Prints tables and a final JSON line. Exits 1 when a check fails or an answer is not a correct
 * 200; a missed target is reported, not an error.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { hash, randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { RedisLimiter as RedisLimiterType } from '../dist/limiter/redis.js';
import {
  choices, fmtInt, fmtMs, fmtRatio, fmtUs, int, ints, mean, median, metText, num, parseFlags, pct, round3, Rounds, runMain, runRounds, statusText, type FlagValues,
} from './cli.js';
import { checkChat, checkModels, type CheckResult } from './load.js';
import {
  closedLoop, freePort, machineCpu, non200, once, perReq, rawRequest, sleep, startChild, stealShare, stopChild, waitForQuiet, watchOthers,
  type Child, type RunResult,
} from './rawhttp.js';

const ROOT = resolve(__dirname, '..');
const LIMITERS = ['memory', 'redis'] as const;
type Limiter = (typeof LIMITERS)[number];
const MODELS = {
  'echo-1': { provider: 'mock' },
  'mock-gpt-4o-mini': { provider: 'mock', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
};
const CHAT_MODEL = 'mock-gpt-4o-mini';
const PROMPT = 'hello there, bench';
/** Least redis/memory throughput wanted, per throughput phase. */
const TARGET_MODELS = 0.4;
const TARGET_CHAT = 0.7;
/** The chat account's balance and daily cap: far more than a run can spend. */
const CHAT_USD = 1_000_000;

const FLAGS = {
  rounds: int({ default: 10, help: 'rounds per throughput phase (each runs every process once)' }),
  durationS: num({ name: 'duration', default: 1, help: 'seconds per timed run' }),
  processes: int({ default: 3, min: 1, max: 8, help: 'gateway processes per limiter' }),
  connections: int({ default: 32, help: 'keep-alive connections' }),
  warmupS: num({ name: 'warmup', default: 2, help: 'seconds of warmup per process and phase' }),
  accounts: int({ default: 1000, help: 'memory phase: active accounts' }),
  rpms: ints({ default: [60, 600], help: 'memory phase: the rpm limits measured' }),
  phases: choices({ choices: ['models', 'chat', 'memory'], default: ['models', 'chat', 'memory'], help: 'the phases to run' }),
};

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
  const cli = (...args: string[]) => execFileSync('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
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
// Throughput: memory vs redis limiter
// ---------------------------------------------------------------------------------------------

/** A call loaded against both gateways. */
interface Phase {
  name: 'models' | 'chat';
  title: string;
  /** Least redis/memory throughput wanted. */
  target: number;
  request: (port: number) => Buffer;
  /** One answer checked before the load; its body length is what every answer must have. */
  check: (port: number) => Promise<CheckResult>;
}

interface Side { rps: number; p50Us: number; p99Us: number; p999Us: number; cpuUsPerReq: number }

interface PhaseResult {
  memory: Side;
  redis: Side;
  ratio: number;
  paired: number;
  redisCpuUsPerReq: number;
  steal: number | null;
  /** Timed runs with an answer that was not a correct 200 (or no answer at all). */
  failures: number;
}

const HEADER = `  ${'round'.padEnd(6)}${'target'.padEnd(10)}${'req/s'.padStart(9)}${'p50 ms'.padStart(8)}${'p99 ms'.padStart(8)}${'p99.9 ms'.padStart(10)}${'gw us/req'.padStart(11)}${'redis us/req'.padStart(14)}  statuses`;
const q = (r: RunResult, quantile: number) => r.total.quantileUs(quantile);

async function throughput(p: Phase, servers: Record<Limiter, Child[]>, redisPid: number, flags: FlagValues<typeof FLAGS>): Promise<PhaseResult> {
  const all = LIMITERS.flatMap((t) => servers[t]);
  const byName = new Map(all.map((s) => [s.name, s]));
  const expectBytes = new Map<string, number>();
  for (const s of all) {
    const c = await p.check(s.port);
    if (!c.ok) throw new Error(`${s.name}: ${p.name} correctness check failed: ${c.problems.join('; ')}`);
    expectBytes.set(s.name, c.bodyBytes);
  }
  const drive = (name: string, durationS: number) => {
    const s = byName.get(name)!;
    return closedLoop({
      port: s.port, requests: [p.request(s.port)], durationS, connections: flags.connections,
      expectBytes: expectBytes.get(name)!, watch: { gateway: s.pid, redis: redisPid },
    });
  };
  process.stdout.write(`${p.title}, memory vs redis limiter: ${flags.connections} connections, ${flags.rounds} rounds x ${flags.durationS} s per process, ` +
    `${flags.processes} process(es) per limiter\n${HEADER}\n`);
  let failures = 0;
  const steal0 = machineCpu();
  const rounds = await runRounds({
    targets: all.map((s) => s.name), rounds: flags.rounds,
    warmup: (name) => drive(name, flags.warmupS),
    run: (name) => drive(name, flags.durationS),
    onRun: (name, round, r) => {
      if (non200(r) > 0 || r.requests === 0) failures++;
      const redisUs = name.startsWith('redis') ? fmtUs(perReq(r, 'redis')) : '-';
      process.stdout.write(`  ${String(round + 1).padEnd(6)}${name.padEnd(10)}${fmtInt(r.rps).padStart(9)}${fmtMs(q(r, 0.5), 2).padStart(8)}${fmtMs(q(r, 0.99), 2).padStart(8)}` +
        `${fmtMs(q(r, 0.999), 2).padStart(10)}${fmtUs(perReq(r, 'gateway')).padStart(11)}${redisUs.padStart(14)}  ${statusText(r)}\n`);
    },
  });
  const steal = stealShare(steal0, machineCpu());
  // A limiter's round: the mean over its processes (percentiles: the median of theirs).
  const ofRound = (t: Limiter, round: number) => {
    const runs = servers[t].map((s) => rounds.results[s.name]![round]!);
    return {
      rps: mean(runs, (r) => r.rps), p50Us: median(runs.map((r) => q(r, 0.5))), p99Us: median(runs.map((r) => q(r, 0.99))),
      p999Us: median(runs.map((r) => q(r, 0.999))), cpuUsPerReq: mean(runs, (r) => perReq(r, 'gateway') ?? NaN), redisUs: mean(runs, (r) => perReq(r, 'redis') ?? NaN),
    };
  };
  const perRound = new Rounds(Object.fromEntries(LIMITERS.map((t) => [t, Array.from({ length: rounds.count }, (_, i) => ofRound(t, i))])) as Record<Limiter, ReturnType<typeof ofRound>[]>);
  const side = (t: Limiter): Side => {
    const med = (pick: (f: ReturnType<typeof ofRound>) => number) => perRound.median(t, pick);
    return { rps: med((f) => f.rps), p50Us: med((f) => f.p50Us), p99Us: med((f) => f.p99Us), p999Us: med((f) => f.p999Us), cpuUsPerReq: med((f) => f.cpuUsPerReq) };
  };
  const [m, r] = [side('memory'), side('redis')];
  const result: PhaseResult = {
    memory: m, redis: r, ratio: r.rps / m.rps, paired: perRound.paired('redis', 'memory', (f) => f.rps),
    redisCpuUsPerReq: perRound.median('redis', (f) => f.redisUs), steal, failures,
  };
  for (const t of LIMITERS) {
    const s = result[t];
    process.stdout.write(`  median ${t.padEnd(7)} ${fmtInt(s.rps)} req/s, p50 ${fmtMs(s.p50Us, 2)} ms, p99 ${fmtMs(s.p99Us, 2)} ms, p99.9 ${fmtMs(s.p999Us, 2)} ms, gateway ${fmtUs(s.cpuUsPerReq)} us CPU/req\n`);
  }
  process.stdout.write(`  redis / memory: throughput ${fmtRatio(result.ratio)} (target >= ${p.target}: ${metText(result.ratio >= p.target)}), paired per round ${fmtRatio(result.paired)}; ` +
    `p99 ${fmtRatio(result.redis.p99Us / result.memory.p99Us, 2)}; gateway CPU/req ${fmtRatio(result.redis.cpuUsPerReq / result.memory.cpuUsPerReq, 2)}; redis-server ${fmtUs(result.redisCpuUsPerReq)} us CPU/req\n`);
  process.stdout.write(`  CPU steal by other guests during the phase: ${pct(steal)}\n`);
  return result;
}

/**
 * Null when the account behind `key` shows a charge in the limiter (`GET /v1/balance`: spend
 * today and a balance below the initial one), else what it shows. Settling follows the answer,
 * so it is polled for a second.
 */
async function settled(port: number, key: string): Promise<string | null> {
  let last = '';
  for (let i = 0; i < 20; i++) {
    const a = await once(port, rawRequest('GET', port, '/v1/balance', { authorization: `Bearer ${key}` }));
    last = `${a.status} ${a.body?.toString('utf8') ?? ''}`;
    const b = a.status === 200 ? JSON.parse(a.body!.toString('utf8')) as { balance?: unknown; daily_spend?: unknown } : {};
    if (Number(b.daily_spend) > 0 && Number(b.balance) < CHAT_USD) return null;
    await sleep(50);
  }
  return `the call was not settled: GET /v1/balance answered ${last}`;
}

/** A phase's figures in the final JSON line. */
function phaseJson(p: Phase, r: PhaseResult) {
  const side = (s: Side) => ({ rps: Math.round(s.rps), p50Ms: s.p50Us / 1000, p99Ms: s.p99Us / 1000, cpuUsPerReq: round3(s.cpuUsPerReq) });
  return {
    memory: side(r.memory), redis: { ...side(r.redis), redisServerCpuUsPerReq: round3(r.redisCpuUsPerReq) },
    throughputRatio: round3(r.ratio), pairedThroughputRatio: round3(r.paired), p99Ratio: round3(r.redis.p99Us / r.memory.p99Us),
    target: p.target, targetMet: r.ratio >= p.target, steal: r.steal === null ? null : round3(r.steal),
  };
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  const flags = parseFlags('redis.ts', FLAGS);
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
    const cpu = cpus();
    process.stdout.write(`redis bench: node ${process.version}, redis ${redisVersion}, ${cpu.length} CPU (${cpu[0]?.model ?? '?'}), ${new Date().toISOString()}\n`);

    // Two accounts on one plan: /v1/models as before; chat on a prepaid account with a daily cap.
    const key = `sk-bench-${randomBytes(16).toString('hex')}`;
    const chatKey = `sk-bench-chat-${randomBytes(16).toString('hex')}`;
    const config = (limiter: Record<string, unknown>) => ({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      limiter,
      ledger: { store: 'memory' },
      plans: { bench: { rpm: 2_000_000, concurrency: 100_000 } },
      accounts: { acct_bench: { plan: 'bench' }, acct_chat: { plan: 'bench', balanceUsd: CHAT_USD, dailyCapUsd: CHAT_USD } },
      keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', key) }, key_chat: { account: 'acct_chat', sha256: hash('sha256', chatKey) } },
      models: MODELS,
      providers: { mock: { protocol: 'mock' } },
    });
    const phases: Phase[] = [];
    if (flags.phases.includes('models')) {
      phases.push({
        name: 'models', title: '\n1. GET /v1/models', target: TARGET_MODELS,
        request: (port) => rawRequest('GET', port, '/v1/models', { authorization: `Bearer ${key}` }),
        check: (port) => checkModels(`http://127.0.0.1:${port}`, '/v1/models', { authorization: `Bearer ${key}` },
          Object.entries(MODELS).map(([id, m]) => ({ id, owned_by: m.provider }))),
      });
    }
    if (flags.phases.includes('chat')) {
      const body = JSON.stringify({ model: CHAT_MODEL, messages: [{ role: 'user', content: PROMPT }], max_tokens: 32 });
      const request = (port: number) => rawRequest('POST', port, '/v1/chat/completions', { authorization: `Bearer ${chatKey}`, 'content-type': 'application/json' }, body);
      phases.push({
        name: 'chat', title: `\n2. POST /v1/chat/completions (billable: ${CHAT_MODEL}, prepaid account with a daily cap)`, target: TARGET_CHAT,
        request, check: async (port) => {
          const c = checkChat(await once(port, request(port)), CHAT_MODEL, PROMPT);
          const problem = await settled(port, chatKey);
          return problem === null ? c : { ...c, ok: false, problems: [...c.problems, problem] };
        },
      });
    }

    const results: Partial<Record<Phase['name'], PhaseResult>> = {};
    if (phases.length > 0) {
      const files = { memory: join(dir, 'memory.json'), redis: join(dir, 'redis.json') };
      writeFileSync(files.memory, JSON.stringify(config({ store: 'memory' })));
      writeFileSync(files.redis, JSON.stringify(config({ store: 'redis', url: `redis://127.0.0.1:${redis.port}`, timeoutMs: 1000 })));
      const byLimiter: Record<Limiter, Child[]> = { memory: [], redis: [] };
      for (let i = 1; i <= flags.processes; i++) {
        for (const t of LIMITERS) {
          const child = await startChild(`${t}#${i}`, process.execPath, ['dist/main.js', '--config', files[t], '--port', '0'], dir, { cwd: ROOT });
          servers.push(child);
          byLimiter[t].push(child);
        }
      }
      for (const p of phases) {
        const r = await throughput(p, byLimiter, redis.child.pid!, flags);
        results[p.name] = r;
        failures += r.failures;
        others.endPhase(p.name);
      }
      // The memory phase wants nothing else touching Redis.
      await Promise.all(servers.map((s) => stopChild(s.child)));
    }

    const memory: MemoryResult[] = [];
    if (flags.phases.includes('memory')) {
      process.stdout.write(`\n3. Redis memory per active account: ${flags.accounts} accounts, each admitted its full RPM (RedisLimiter.admitInstant, dist/)\n`);
      for (const rpm of flags.rpms) {
        const m = await memoryPerAccount(redis, rpm, flags.accounts);
        memory.push(m);
        if (m.rejected > 0) failures++;
        process.stdout.write(`  rpm ${String(rpm).padEnd(5)} ${fmtInt(m.admissions)} admissions in ${m.elapsedS.toFixed(1)} s (${fmtInt(m.admissionsPerS)}/s, ${m.rejected} rejected), ${m.keys} keys, ` +
          `used_memory ${fmtInt(m.usedBefore)} -> ${fmtInt(m.usedAfter)} B: ${fmtInt(m.bytesPerAccount)} B per account (${(m.bytesPerAccount / rpm).toFixed(1)} B per admission in the window); ` +
          `window encoding ${m.encoding}, MEMORY USAGE of one window ${fmtInt(m.memoryUsageOfOneWindow)} B\n`);
        if (m.elapsedS > 55) process.stdout.write('  (took longer than the window: the first admissions may have left it; per-account figure is then low)\n');
      }
      others.endPhase('memory');
    }

    process.stdout.write(`\nphases during which another bench (bench/ledger*) ran: ${others.disturbed().join(', ') || 'none'}${failures > 0 ? `; FAILED: ${failures} run(s) with an answer that was not a correct 200, or rejected admissions` : ''}\n`);
    const json = (name: Phase['name']) => {
      const p = phases.find((x) => x.name === name);
      return p === undefined || results[name] === undefined ? null : phaseJson(p, results[name]);
    };
    process.stdout.write(`${JSON.stringify({
      bench: 'redis', node: process.version, redisVersion, date: new Date().toISOString(), cpus: cpu.length, flags,
      ...json('models'), chat: json('chat'),
      memoryPerAccount: memory.map((m) => ({ rpm: m.rpm, accounts: m.accounts, bytesPerAccount: Math.round(m.bytesPerAccount), encoding: m.encoding, admissionsPerS: Math.round(m.admissionsPerS), rejected: m.rejected })),
      disturbedPhases: others.disturbed(), failures,
    })}\n`);
  } finally {
    await cleanup();
  }
  return failures === 0 ? 0 : 1;
}

runMain('redis bench', main);
