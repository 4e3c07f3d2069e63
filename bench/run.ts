/**
 * The benchmark runner: `GET /v1/models` on the gateway against a bare node:http baseline.
 *
 *   npm run bench -- [--rounds 10] [--duration 1] [--processes 3] [--connections 32] [--warmup 2] [--rpm 2000000]
 *     [--nolog] [--before DIST_DIR]
 *   (or, after `npm run build`: node --import tsx bench/run.ts [flags])
 *
 * Starts every target `--processes` times, each server in its own child process, on 127.0.0.1:
 *   baseline           bench/baseline.ts
 *   gateway            dist/main.js, the plan with a finite RPM (a real sliding window, never hit)
 *   gateway-unlimited  dist/main.js, the plan without an RPM limit
 *   gateway-nolog      only with --nolog: the gateway with its access log off (bench/gateway-nolog.ts)
 *   gateway-before     only with --before: an older build (its dist/, copied aside) on the plan with
 *                      a finite RPM, to compare a change with what it replaced in the same run
 * and loads them one at a time from this process (bench/load.ts): a warmup of each, then
 * `rounds` rounds of every process for `duration` seconds, the order rotating each round so
 * no process always follows the same one. A target's figure in a round is the mean over its
 * processes. Why several processes, and short runs: on this 2-vCPU VM two processes of one
 * build, loaded in turn, differed by up to 16 % for their whole life (JIT and memory luck),
 * and the machine's speed drifts by a third within a minute; one process per target and 5 s
 * runs measured that luck as often as the build. Prints a table per round, the medians, the
 * gateway/baseline ratios and a final JSON line. Exits 1 when a correctness check fails or any
 * answer is not a correct 200 (a 429 included); missed targets are reported, not an error.
 */
import { execFileSync } from 'node:child_process';
import { hash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import {
  bool, fmtInt, fmtMs, fmtRatio, fmtUs, int, mean, median, metText, num, parseFlags, path, pct, round3, Rounds, runMain, runRounds, statusText,
} from './cli.js';
import { clean, load, type ExpectedModel, type LoadResult } from './load.js';
import { machineCpu, non200, stealShare, startChild, stopChild, type Child } from './rawhttp.js';

const ROOT = resolve(__dirname, '..');
const TARGET_THROUGHPUT = 0.9; // gateway req/s >= 0.90 x baseline
const TARGET_P99 = 1.25; // gateway p99 <= 1.25 x baseline

const FLAGS = {
  rounds: int({ default: 10, help: 'timed rounds of every process' }),
  durationS: num({ name: 'duration', default: 1, help: 'seconds per timed run' }),
  processes: int({ default: 3, min: 1, max: 8, help: 'server processes per target' }),
  connections: int({ default: 32, help: 'keep-alive connections' }),
  warmupS: num({ name: 'warmup', default: 2, help: 'seconds of warmup per process' }),
  rpm: int({ default: 2_000_000, max: 1_000_000_000, help: "the gateway plan's rpm (a real window, never reached)" }),
  nolog: bool({ help: 'add the gateway-nolog target (diagnosis: what the access log costs)' }),
  before: path({ arg: 'DIST_DIR', help: 'add the gateway-before target: the dist/ of an older build' }),
};

// ---------------------------------------------------------------------------------------------
// The source measured (servers are started and stopped with rawhttp.ts's startChild/stopChild)
// ---------------------------------------------------------------------------------------------

/** The commit measured, `+dirty` when src/ has uncommitted changes; null outside a git checkout. */
function sourceVersion(): string | null {
  try {
    const git = (...args: string[]) => execFileSync('git', args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    return `${git('rev-parse', '--short', 'HEAD')}${git('status', '--porcelain', '--', 'src') === '' ? '' : '+dirty'}`;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------------------------
// Statistics and printing
// ---------------------------------------------------------------------------------------------

/** One timed run, with what the runner adds: machine CPU steal and server CPU per request. */
type Result = LoadResult & {
  /** Share of the machine's CPU time the hypervisor gave to other guests during the run. */
  steal: number | null;
  /** Server CPU time (user + system) per answered request, in microseconds. */
  cpuUsPerReq: number | null;
};

interface Summary {
  rps: number;
  p50Us: number;
  p99Us: number;
  p999Us: number;
  cpuUsPerReq: number | null;
  non200: number;
}

// vs base: throughput and p99 as multiples of the baseline's in the same round. cpu/req: server
// CPU microseconds per request. cpu srv/gen: server and load generator CPU, % of one core.
// steal: % of the machine's CPU time taken by other guests of the host meanwhile.
const HEADER = `  ${'target'.padEnd(18)} ${'req/s'.padStart(9)} ${'p50 ms'.padStart(7)} ${'p99 ms'.padStart(7)} ${'p99.9 ms'.padStart(8)}  ` +
  `${'vs base'.padEnd(14)} ${'cpu/req'.padStart(7)}  ${'cpu srv/gen'.padEnd(11)} ${'steal'.padStart(5)}  statuses`;

function row(name: string, r: Result, base: Result | undefined): string {
  const ratio = base === undefined || name === 'baseline' ? '' : `${fmtRatio(r.rps / base.rps)} ${fmtRatio(r.p99Us / base.p99Us, 2)}`;
  const cpu = `${pct(r.serverCpu)}/${pct(r.loaderCpu)}`;
  return `  ${name.padEnd(18)} ${fmtInt(r.rps).padStart(9)} ${fmtMs(r.p50Us, 2).padStart(7)} ${fmtMs(r.p99Us, 2).padStart(7)} ${fmtMs(r.p999Us, 2).padStart(8)}  ` +
    `${ratio.padEnd(14)} ${`${fmtUs(r.cpuUsPerReq)}us`.padStart(7)}  ${cpu.padEnd(11)} ${pct(r.steal).padStart(5)}  ${statusText(r)}`;
}

/** One round of a target: the mean over its processes (percentiles: the median of theirs). */
function combine(runs: Result[]): Result {
  const meanOrNull = (pick: (r: Result) => number | null) => (runs.every((r) => pick(r) !== null) ? mean(runs, (r) => pick(r)!) : null);
  const statuses: Record<string, number> = {};
  for (const r of runs) for (const [status, n] of Object.entries(r.statuses)) statuses[status] = (statuses[status] ?? 0) + n;
  return {
    ...runs[0]!,
    rps: mean(runs, (r) => r.rps),
    requests: runs.reduce((n, r) => n + r.requests, 0),
    elapsedS: mean(runs, (r) => r.elapsedS),
    p50Us: median(runs.map((r) => r.p50Us)),
    p99Us: median(runs.map((r) => r.p99Us)),
    p999Us: median(runs.map((r) => r.p999Us)),
    maxUs: Math.max(...runs.map((r) => r.maxUs)),
    statuses,
    badBodies: runs.reduce((n, r) => n + r.badBodies, 0),
    errors: runs.reduce((n, r) => n + r.errors, 0),
    loaderCpu: mean(runs, (r) => r.loaderCpu),
    serverCpu: meanOrNull((r) => r.serverCpu),
    steal: meanOrNull((r) => r.steal),
    cpuUsPerReq: meanOrNull((r) => r.cpuUsPerReq),
  };
}

function summarize(rounds: Rounds<string, Result>, name: string): Summary {
  const rs = rounds.results[name]!;
  const med = (pick: (r: Result) => number) => rounds.median(name, pick);
  return {
    rps: Math.round(med((r) => r.rps)),
    p50Us: med((r) => r.p50Us),
    p99Us: med((r) => r.p99Us),
    p999Us: med((r) => r.p999Us),
    cpuUsPerReq: rs.every((r) => r.cpuUsPerReq !== null) ? round3(med((r) => r.cpuUsPerReq!)) : null,
    non200: rs.reduce((n, r) => n + non200(r), 0),
  };
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  const flags = parseFlags('run.ts', FLAGS);
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-'));
  const servers: Child[] = [];
  const cleanup = async () => {
    await Promise.all(servers.map((s) => stopChild(s.child)));
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('SIGINT', () => {
    void cleanup().finally(() => process.exit(130));
  });

  try {
    // One config per gateway variant; the baseline reads the keys and models of the first.
    const key = `sk-bench-${randomBytes(16).toString('hex')}`;
    const models = {
      'echo-1': { provider: 'mock' },
      'mock-gpt-4o-mini': { provider: 'mock', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
    };
    const expected: ExpectedModel[] = Object.entries(models).map(([id, m]) => ({ id, owned_by: m.provider }));
    const config = (plan: Record<string, number>) => ({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      ledger: { store: 'memory' },
      plans: { bench: plan },
      accounts: { acct_bench: { plan: 'bench' } },
      keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', key) } },
      models,
      providers: { mock: { protocol: 'mock' } },
    });
    const windowed = join(dir, 'gateway.json');
    const unlimited = join(dir, 'gateway-unlimited.json');
    writeFileSync(windowed, JSON.stringify(config({ rpm: flags.rpm, concurrency: 100_000 })));
    writeFileSync(unlimited, JSON.stringify(config({ concurrency: 100_000 })));

    // Each target's command line; every target runs as `flags.processes` processes, NAME#1, NAME#2, ...
    const targets: Array<[string, string[]]> = [
      ['baseline', ['--import', 'tsx', 'bench/baseline.ts', '--config', windowed, '--port', '0']],
      ['gateway', ['dist/main.js', '--config', windowed, '--port', '0']],
      ['gateway-unlimited', ['dist/main.js', '--config', unlimited, '--port', '0']],
    ];
    if (flags.nolog) targets.push(['gateway-nolog', ['--import', 'tsx', 'bench/gateway-nolog.ts', '--config', windowed]]);
    if (flags.before !== null) targets.push(['gateway-before', [join(flags.before, 'main.js'), '--config', windowed, '--port', '0']]);
    const names = targets.map(([name]) => name);
    for (let i = 1; i <= flags.processes; i++) {
      for (const [name, args] of targets) servers.push(await startChild(`${name}#${i}`, process.execPath, args, dir, { cwd: ROOT }));
    }
    const serverOf = (name: string) => servers.find((s) => s.name === name)!;
    const processesOf = (target: string) => servers.filter((s) => s.name.slice(0, s.name.lastIndexOf('#')) === target);

    const cpu = cpus();
    const commit = sourceVersion();
    process.stdout.write(
      `GET /v1/models: ${names.join(', ')}, ${flags.processes} process(es) each (${servers.map((s) => `${s.name} ${s.url}`).join(', ')})\n` +
      `commit ${commit ?? '?'} (dist/ as built from it), node ${process.version}, ${cpu.length} cores (${cpu[0]?.model ?? '?'}), load generator in this process\n` +
      `${flags.connections} connections, ${flags.rounds} rounds x ${flags.durationS} s per process, warmup ${flags.warmupS} s, gateway rpm ${flags.rpm}\n`,
    );

    let ok = true;
    const runOne = async (server: Child, durationS: number): Promise<Result> => {
      const before = machineCpu();
      const r = await load({
        url: server.url, path: '/v1/models', headers: { authorization: `Bearer ${key}` },
        connections: flags.connections, durationS, expected, serverPid: server.child.pid,
      });
      const after = machineCpu();
      if (!r.check.ok) process.stdout.write(`  ${server.name}: correctness check FAILED\n    ${r.check.problems.join('\n    ')}\n`);
      if (!clean(r)) ok = false;
      return {
        ...r,
        steal: stealShare(before, after),
        cpuUsPerReq: r.serverCpu === null || r.requests === 0 ? null : (r.serverCpu * r.elapsedS * 1e6) / r.requests,
      };
    };

    process.stdout.write(`\nwarmup\n${HEADER}\n`);
    const byTarget: Record<string, Result[]> = Object.fromEntries(names.map((name) => [name, []]));
    const perProcess = await runRounds({
      targets: servers.map((s) => s.name), rounds: flags.rounds, stop: () => !ok,
      warmup: async (name) => process.stdout.write(`${row(name, await runOne(serverOf(name), flags.warmupS), undefined)}\n`),
      run: (name) => runOne(serverOf(name), flags.durationS),
      onRound: (round, got) => {
        const combined = Object.fromEntries(names.map((name) => [name, combine(processesOf(name).map((s) => got[s.name]!))]));
        process.stdout.write(`\nround ${round + 1}: each target the mean of its processes (req/s of each after the statuses)\n${HEADER}\n`);
        for (const name of names) {
          byTarget[name]!.push(combined[name]!);
          const each = processesOf(name).map((s) => fmtInt(got[s.name]!.rps)).join(' ');
          process.stdout.write(`${row(name, combined[name]!, combined.baseline)}  [${each}]\n`);
        }
      },
    });
    const rounds = new Rounds(byTarget);

    const summary: Record<string, Summary> = {};
    const ratios: Record<string, Record<string, number | boolean | null>> = {};
    let steal: number | null = null;
    if (rounds.count > 0) {
      for (const name of names) summary[name] = summarize(rounds, name);
      process.stdout.write(
        `\nsummary: medians of ${rounds.count} rounds\n` +
        `  ${'target'.padEnd(18)} ${'req/s'.padStart(9)} ${'p50 ms'.padStart(7)} ${'p99 ms'.padStart(7)} ${'p99.9 ms'.padStart(8)}  ${'cpu/req'.padStart(7)}  non-200\n`,
      );
      for (const [name, s] of Object.entries(summary)) {
        process.stdout.write(`  ${name.padEnd(18)} ${fmtInt(s.rps).padStart(9)} ${fmtMs(s.p50Us, 2).padStart(7)} ${fmtMs(s.p99Us, 2).padStart(7)} ${fmtMs(s.p999Us, 2).padStart(8)}  ${`${fmtUs(s.cpuUsPerReq)}us`.padStart(7)}  ${s.non200}\n`);
      }
      const base = summary.baseline!;
      for (const [name, s] of Object.entries(summary)) {
        if (name === 'baseline') continue;
        // The target ratios are of the medians. The paired ones (the median of each round's own
        // ratio) compare runs seconds apart, so slow drift in the machine cancels out of them;
        // CPU per request does not count stolen time at all, so it is the steadiest of the three.
        const throughput = s.rps / base.rps;
        const p99 = s.p99Us / base.p99Us;
        const pairedThroughput = rounds.paired(name, 'baseline', (r) => r.rps);
        const pairedP99 = rounds.paired(name, 'baseline', (r) => r.p99Us);
        const cpuPerReq = s.cpuUsPerReq === null || base.cpuUsPerReq === null ? null : s.cpuUsPerReq / base.cpuUsPerReq;
        ratios[name] = {
          throughput: round3(throughput), p99: round3(p99),
          throughputMet: throughput >= TARGET_THROUGHPUT, p99Met: p99 <= TARGET_P99,
          pairedThroughput: round3(pairedThroughput), pairedP99: round3(pairedP99),
          cpuPerReq: cpuPerReq === null ? null : round3(cpuPerReq),
        };
        process.stdout.write(
          `  ${name} / baseline: throughput ${fmtRatio(throughput)} (target >= ${TARGET_THROUGHPUT}: ${metText(throughput >= TARGET_THROUGHPUT)}), ` +
          `p99 ${fmtRatio(p99, 2)} (target <= ${TARGET_P99}: ${metText(p99 <= TARGET_P99)})\n` +
          `    paired per round: throughput ${fmtRatio(pairedThroughput)}, p99 ${fmtRatio(pairedP99, 2)}; ` +
          `server CPU per request ${cpuPerReq === null ? '?' : fmtRatio(cpuPerReq, 2)}\n`,
        );
      }
      const steals = Object.values(perProcess.results).flat().map((r) => r.steal).filter((x): x is number => x !== null);
      if (steals.length > 0) {
        steal = round3(median(steals));
        process.stdout.write(`  CPU steal by other guests of the host, median over runs: ${pct(steal)} (max ${pct(Math.max(...steals))})\n`);
      }
    }
    if (!ok) process.stdout.write('\nFAILED: a correctness check failed or an answer was not a correct 200 (see the tables)\n');
    process.stdout.write(`${JSON.stringify({
      bench: 'GET /v1/models', ok, commit, node: process.version, cores: cpu.length, date: new Date().toISOString(),
      connections: flags.connections, rounds: flags.rounds, durationS: flags.durationS, processes: flags.processes, rpm: flags.rpm,
      medians: summary, ratios, steal,
    })}\n`);
    return ok ? 0 : 1;
  } finally {
    await cleanup();
  }
}

runMain('bench', main);
