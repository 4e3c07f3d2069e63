/**
 * The ledger benchmark: billable `POST /v1/chat/completions` on the gateway with the file
 * ledger (every charge fsynced before the answer's final bytes, group commit) against the
 * same gateway with the memory ledger, plus the commit costs measured in-process.
 *
 *   npm run build && node --import tsx bench/ledger.ts
 *     [--rounds 3] [--duration 5] [--connections 32] [--warmup 2] [--sync 300] [--concurrent 10000]
 *     [--store file|postgres]
 *
 * `--store postgres` measures the PostgreSQL ledger instead of the file ledger (target 0.70x the
 * memory ledger): a fresh schema in MG_BENCH_PG_URL (default: the machine's
 * postgres://postgres@127.0.0.1:5432/test), dropped after; the checks count its entries table.
 *
 * 1. Starts dist/main.js twice as child processes on 127.0.0.1 (memory ledger; file ledger in a
 *    fresh temp dir), stdout and stderr to files (the access log never blocks the gateway).
 * 2. Checks the first answer of each (rawhttp.ts's `once`, load.ts's `checkChat`): a correct 200
 *    chat completion.
 * 3. Loads them alternately, `rounds` x [memory, file] for `duration` s each after a warmup
 *    (cli.ts's `runRounds`, this order every round), with rawhttp.ts's closed loop: raw keep-alive
 *    `node:net` sockets, one precomputed request Buffer (node's http client would measure itself
 *    on a 2-core box). One request in flight per connection.
 * 4. Records per group commit in the gateway itself: both gateways run with a small preload
 *    (`-r probe.cjs`, written to the temp dir) that keeps the FileLedger `FileLedger.open`
 *    returns and prints its `stats` to stderr on SIGUSR2; read before and after each timed
 *    window. Nothing else in the gateway changes. After the run, the journal lines are counted
 *    and compared with the 200 answers the file gateway gave (+1 for the account's credit).
 * 5. In-process (this process, gateways stopped): a FileLedger in a temp dir, `sync` sequential
 *    single appends (each its own write+fdatasync) -> ms per commit; `concurrent` appends at
 *    once -> commits used and records per commit.
 * Columns: cpu/req = server CPU (all its threads) per answered request; cpu srv/gen/other/steal =
 * the server, this load generator, everything else in the VM (other processes, kernel threads,
 * softirq), and CPU the hypervisor stole, each in % of one core over the window. A round where
 * other > 25% or steal > 10% is flagged: the machine was shared and the figures are disturbed.
 * Prints per-round tables, a summary and a final JSON line. Exits 1 when an answer is not a
 * correct 200 or the journal does not hold every charge; a missed target is reported, not an error.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { FileLedger } from '../src/ledger/file.js';
import { PostgresLedger } from '../src/ledger/postgres.js';
import type { LedgerEntry } from '../src/ledger/types.js';
import {
  choice, fmtInt, fmtMs, fmtRatio, fmtUs, int, median, metText, num, parseFlags, pct, round3, runMain, runRounds, statusText, type FlagValues,
} from './cli.js';
import { checkChat, type CheckResult } from './load.js';
import { closedLoop, once, rawRequest, sleep, startChild, stopChild, type Child } from './rawhttp.js';

export const ROOT = resolve(__dirname, '..');
/** Durable-ledger req/s as a share of the memory ledger's: file >= 0.80x, PostgreSQL >= 0.70x. */
const TARGETS = { file: 0.8, postgres: 0.7 } as const;
const PG_URL = process.env.MG_BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const psql = (sql: string) => spawnSync('psql', [PG_URL, '-Atqc', sql], { encoding: 'utf8' }).stdout.trim();
const KEY = 'sk-bench';
const PROMPT = 'hello there, bench';
const BODY = JSON.stringify({ model: 'paid', messages: [{ role: 'user', content: PROMPT }] });

const FLAGS = {
  rounds: int({ default: 3, max: 20, help: 'rounds of [memory, durable]' }),
  durationS: num({ name: 'duration', default: 5, min: 1, max: 120, help: 'seconds per timed run' }),
  connections: int({ default: 32, max: 100_000, help: 'keep-alive connections' }),
  warmupS: num({ name: 'warmup', default: 2, min: 0, max: 60, help: 'seconds of warmup per gateway (0: none)' }),
  sync: int({ default: 300, max: 100_000, help: 'in-process sequential single appends' }),
  concurrent: int({ default: 10_000, max: 100_000, help: 'in-process concurrent appends' }),
  store: choice({ choices: ['file', 'postgres'], default: 'file', help: 'the durable ledger measured against the memory ledger' }),
};
type Flags = FlagValues<typeof FLAGS>;

// ---------------------------------------------------------------------------------------------
// Small shared helpers (bench/ledger-startup.ts uses them too)
// ---------------------------------------------------------------------------------------------

/** Sum of the sizes of the journal segments and the number of lines (records) in them. */
export function journalStats(dir: string): { segments: number; bytes: number; lines: number } {
  let bytes = 0;
  let lines = 0;
  let segments = 0;
  for (const name of readdirSync(dir)) {
    if (!/^journal-\d{8}\.log$/.test(name)) continue;
    const data = readFileSync(join(dir, name));
    segments++;
    bytes += data.length;
    for (let i = data.indexOf(10); i !== -1; i = data.indexOf(10, i + 1)) lines++;
  }
  return { segments, bytes, lines };
}

// ---------------------------------------------------------------------------------------------
// Gateways as child processes
// ---------------------------------------------------------------------------------------------

/**
 * The preload both gateways run with: keeps the durable ledger (file or PostgreSQL) the gateway
 * opens and prints its group-commit counters to stderr on SIGUSR2. Plain CommonJS, written to
 * the temp dir.
 */
function probeSource(): string {
  const file = JSON.stringify(join(ROOT, 'dist', 'ledger', 'file.js'));
  const postgres = JSON.stringify(join(ROOT, 'dist', 'ledger', 'postgres.js'));
  return `'use strict';
let ledger = null;
for (const [path, name] of [[${file}, 'FileLedger'], [${postgres}, 'PostgresLedger']]) {
  const mod = require(path);
  const open = mod[name].open;
  mod[name].open = async function (...args) {
    ledger = await open.apply(this, args);
    return ledger;
  };
}
let n = 0;
process.on('SIGUSR2', () => {
  const s = ledger === null ? null : ledger.stats;
  process.stderr.write(JSON.stringify({ probe: 'ledger-stats', n: ++n, commits: s ? s.commits : null, records: s ? s.records : null }) + '\\n');
});
`;
}

interface CommitStats {
  commits: number;
  records: number;
}

const probeSeen = new Map<number, number>();

/** Asks the gateway for its FileLedger counters (SIGUSR2) and waits for the answer (<= 2 s). */
async function readProbe(server: Child): Promise<CommitStats | null> {
  const pid = server.child.pid!;
  const before = probeSeen.get(pid) ?? 0;
  server.child.kill('SIGUSR2');
  const deadline = performance.now() + 2000;
  while (performance.now() < deadline) {
    const lines = readFileSync(server.stderrFile, 'utf8').split('\n').filter((l) => l.includes('"probe":"ledger-stats"'));
    const last = lines.at(-1);
    if (last !== undefined) {
      const p = JSON.parse(last) as { n: number; commits: number | null; records: number | null };
      if (p.n > before) {
        probeSeen.set(pid, p.n);
        return p.commits === null || p.records === null ? null : { commits: p.commits, records: p.records };
      }
    }
    await sleep(5);
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// The POST load generator
// ---------------------------------------------------------------------------------------------

/** The load's exact request: a billable chat call (the mock provider echoes the prompt). */
const requestBytes = (port: number) => rawRequest('POST', port, '/v1/chat/completions', { 'x-api-key': KEY, 'content-type': 'application/json' }, BODY);

/** Sends the load's exact request once and checks the answer: a correct 200 chat completion. */
async function checkFirst(port: number): Promise<CheckResult> {
  return checkChat(await once(port, requestBytes(port)), 'paid', PROMPT);
}

interface LoadResult {
  rps: number;
  requests: number;
  elapsedS: number;
  p50Us: number;
  p99Us: number;
  maxUs: number;
  /** Every answer by status, the drain after the window included. */
  statuses: Record<string, number>;
  /** All 200 answers (window and drain): each is one charge in the ledger. */
  ok200: number;
  badBodies: number;
  errors: number;
  loaderCpu: number;
  serverCpu: number | null;
  /**
   * CPU used meanwhile by everything else in this VM, in cores: other processes, kernel threads
   * and softirq (loopback networking, the file system's journal: some of it caused by this run).
   */
  otherCpu: number | null;
  /** CPU time stolen by the hypervisor for other guests of the host meanwhile, in cores. */
  stealCpu: number | null;
  /** Server CPU time (user + system, all its threads) per answered request, in microseconds. */
  cpuUsPerReq: number | null;
}

async function postLoad(server: Child, connections: number, durationS: number, expectedBytes: number): Promise<LoadResult> {
  const r = await closedLoop({
    port: server.port, requests: [requestBytes(server.port)], durationS, connections, expectBytes: expectedBytes,
    watch: { server: server.child.pid! },
  });
  const serverS = r.cpuS.server ?? null;
  const serverCpu = serverS === null ? null : serverS / r.elapsedS;
  const loaderCpu = r.loaderCpuS / r.elapsedS;
  let otherCpu: number | null = null;
  let stealCpu: number | null = null;
  if (r.machine !== null && serverCpu !== null) {
    const cores = cpus().length;
    const total = Math.max(1, r.machine.total);
    otherCpu = Math.max(0, (r.machine.busy / total) * cores - serverCpu - loaderCpu);
    stealCpu = (r.machine.steal / total) * cores;
  }
  return {
    rps: r.rps, requests: r.requests, elapsedS: r.elapsedS,
    p50Us: r.total.quantileUs(0.5), p99Us: r.total.quantileUs(0.99), maxUs: r.total.maxUs,
    statuses: Object.fromEntries(Object.entries(r.statuses).sort((a, b) => Number(a[0]) - Number(b[0]))),
    ok200: r.statuses['200'] ?? 0,
    badBodies: r.badBodies, errors: r.errors,
    loaderCpu, serverCpu, otherCpu, stealCpu,
    cpuUsPerReq: serverS === null || r.requests === 0 ? null : (serverS * 1e6) / r.requests,
  };
}

const isClean = (r: LoadResult) => r.requests > 0 && r.badBodies === 0 && r.errors === 0 && Object.keys(r.statuses).every((s) => s === '200');

// ---------------------------------------------------------------------------------------------
// In-process commit costs
// ---------------------------------------------------------------------------------------------

export function sampleEntry(i: number, accountId: string, createdAt: number, balanceAfterMicro: number | null): LedgerEntry {
  return {
    id: `le_${i.toString(36).padStart(10, '0')}`, type: 'charge', accountId, keyId: 'key_bench', amountMicro: -7,
    balanceAfterMicro, balanceUnknown: false, createdAt, requestId: `req_${i.toString(36).padStart(8, '0')}`, model: 'paid',
    inputTokens: 6, outputTokens: 5, estimated: false, note: null, idempotencyKey: null, deployment: 'mock',
  };
}

interface CommitCost {
  syncAppends: number;
  msPerSyncCommit: number;
  syncCommits: number;
  concurrentAppends: number;
  concurrentMs: number;
  concurrentCommits: number;
  recordsPerCommit: number;
}

async function commitCost(dir: string, syncN: number, concurrentN: number, store: Flags['store'], schema: string): Promise<CommitCost> {
  const ledger = store === 'file' ? await FileLedger.open(dir) : await PostgresLedger.open({ url: PG_URL, schema });
  let i = 0;
  // Warm the file and the code path a little before timing.
  for (let w = 0; w < 20; w++) await ledger.append(sampleEntry(i++, 'acct_bench', Date.now(), null));
  let s0 = { ...ledger.stats };
  const t0 = performance.now();
  let done = 0;
  for (; done < syncN && performance.now() - t0 < 20_000; done++) await ledger.append(sampleEntry(i++, 'acct_bench', Date.now(), null));
  const syncMs = performance.now() - t0;
  const syncCommits = ledger.stats.commits - s0.commits;

  s0 = { ...ledger.stats };
  const t1 = performance.now();
  const now = Date.now();
  await Promise.all(Array.from({ length: concurrentN }, () => ledger.append(sampleEntry(i++, 'acct_bench', now, null))));
  const concurrentMs = performance.now() - t1;
  const commits = ledger.stats.commits - s0.commits;
  const records = ledger.stats.records - s0.records;
  await ledger.close();
  return {
    syncAppends: done, msPerSyncCommit: syncMs / Math.max(1, syncCommits), syncCommits,
    concurrentAppends: records, concurrentMs, concurrentCommits: commits, recordsPerCommit: records / Math.max(1, commits),
  };
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

/** The two gateways: the memory ledger, and the durable one (`--store`), called `file` in the summary. */
const SIDES = ['memory', 'file'] as const;
type Side = (typeof SIDES)[number];
type Run = LoadResult & { commits: number | null; commitRecords: number | null };

async function main(): Promise<number> {
  process.stdout.on('error', () => {}); // a closed pipe (| head) must not skip the clean-up
  const flags = parseFlags('ledger.ts', FLAGS);
  const dir = mkdtempSync(join(tmpdir(), 'mg-ledger-bench-'));
  const ledgerDir = join(dir, 'ledger');
  const schema = `mg_bench_${randomBytes(4).toString('hex')}`;
  const store = flags.store;
  const target = TARGETS[store];
  const servers: Child[] = [];
  const dropSchemas = () => {
    if (store === 'postgres') for (const s of [schema, `${schema}_inproc`]) psql(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
  };
  const cleanup = async () => {
    await Promise.all(servers.map((s) => stopChild(s.child, 10_000))); // the file ledger drains and closes
    rmSync(dir, { recursive: true, force: true });
    dropSchemas();
  };
  // Everything stops by itself: a watchdog well past the planned time.
  const plannedS = 2 * (flags.warmupS + flags.rounds * flags.durationS) + 120;
  const watchdog = setTimeout(() => {
    process.stderr.write(`ledger bench: watchdog after ${plannedS} s, stopping\n`);
    for (const s of servers) s.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    dropSchemas();
    process.exit(1);
  }, plannedS * 1000);
  watchdog.unref();
  process.once('SIGINT', () => {
    void cleanup().finally(() => process.exit(130));
  });

  try {
    const probe = join(dir, 'probe.cjs');
    writeFileSync(probe, probeSource());
    const config = (ledger: Record<string, string>) => ({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      ledger,
      plans: { bench: { rpm: 5_000_000, concurrency: 100_000 } },
      accounts: { acct_bench: { plan: 'bench', balanceUsd: 1_000_000 } },
      keys: { key_bench: { account: 'acct_bench', key: KEY } },
      models: { paid: { provider: 'mock', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } } },
      providers: { mock: { protocol: 'mock' } },
    });
    writeFileSync(join(dir, 'memory.json'), JSON.stringify(config({ store: 'memory' })));
    writeFileSync(join(dir, 'file.json'), JSON.stringify(config(store === 'file' ? { store: 'file', dir: ledgerDir } : { store: 'postgres', url: PG_URL, schema })));
    const memory = await startChild('memory', process.execPath, ['-r', probe, 'dist/main.js', '--config', join(dir, 'memory.json'), '--port', '0'], dir, { cwd: ROOT });
    servers.push(memory);
    const file = await startChild(store, process.execPath, ['-r', probe, 'dist/main.js', '--config', join(dir, 'file.json'), '--port', '0'], dir, { cwd: ROOT });
    servers.push(file);

    const cpu = cpus();
    process.stdout.write(
      `POST /v1/chat/completions (billable mock model): memory ledger ${memory.url}, ${store} ledger ${file.url} (${store === 'file' ? ledgerDir : `schema ${schema}`})\n` +
      `node ${process.version}, ${cpu.length} cores (${cpu[0]?.model ?? '?'}), load average ${loadavg().map((x) => x.toFixed(2)).join(' ')}\n` +
      `${flags.connections} connections, ${flags.rounds} rounds x [memory ${flags.durationS} s, ${store} ${flags.durationS} s], warmup ${flags.warmupS} s each\n`,
    );

    let ok = true;
    let file200 = 0;
    const checks = new Map<string, CheckResult>();
    for (const s of [memory, file]) {
      const c = await checkFirst(s.port);
      checks.set(s.name, c);
      if (s === file && c.ok) file200++;
      if (!c.ok) {
        ok = false;
        process.stdout.write(`  ${s.name}: correctness check FAILED\n    ${c.problems.join('\n    ')}\n`);
      }
    }
    if (!ok) return 1;
    process.stdout.write(`first answer checked on both: 200 chat completion, ${checks.get(store)!.bodyBytes} body bytes\n`);

    const serverOf = { memory, file };
    const runOne = async (t: Side, durationS: number): Promise<Run> => {
      const s = serverOf[t];
      const before = s === file ? await readProbe(s) : null;
      const r = await postLoad(s, flags.connections, durationS, checks.get(s.name)!.bodyBytes);
      const after = s === file ? await readProbe(s) : null;
      if (s === file) file200 += r.ok200;
      if (!isClean(r)) ok = false;
      const commits = before !== null && after !== null ? after.commits - before.commits : null;
      const commitRecords = before !== null && after !== null ? after.records - before.records : null;
      return { ...r, commits, commitRecords };
    };

    const HEADER = `  ${'ledger'.padEnd(7)} ${'req/s'.padStart(8)} ${'p50 ms'.padStart(7)} ${'p99 ms'.padStart(7)} ${'max ms'.padStart(7)} ` +
      `${'cpu/req'.padStart(7)}  ${'cpu srv/gen/other/steal'.padEnd(23)} ${'commits'.padStart(8)} ${'rec/commit'.padStart(10)}  statuses`;
    const nameOf = (t: Side) => (t === 'memory' ? 'memory' : store.slice(0, 7));
    const row = (t: Side, r: Run) => {
      const cpuText = `${pct(r.serverCpu)}/${pct(r.loaderCpu)}/${pct(r.otherCpu)}/${pct(r.stealCpu)}`;
      const perCommit = r.commits && r.commitRecords !== null ? (r.commitRecords / r.commits).toFixed(2) : '';
      return `  ${nameOf(t).padEnd(7)} ${fmtInt(r.rps).padStart(8)} ${fmtMs(r.p50Us, 2).padStart(7)} ${fmtMs(r.p99Us, 2).padStart(7)} ${fmtMs(r.maxUs, 2).padStart(7)} ` +
        `${`${fmtUs(r.cpuUsPerReq)}us`.padStart(7)}  ${cpuText.padEnd(23)} ${(r.commits === null ? '' : fmtInt(r.commits)).padStart(8)} ${perCommit.padStart(10)}  ${statusText(r)}`;
    };

    // Always memory then the durable ledger in a round, as bench/LEDGER.md describes the runs.
    if (flags.warmupS > 0) process.stdout.write(`\nwarmup\n${HEADER}\n`);
    const rounds = await runRounds({
      targets: SIDES, rounds: flags.rounds, rotate: false, stop: () => !ok,
      ...(flags.warmupS > 0 ? { warmup: async (t: Side) => process.stdout.write(`${row(t, await runOne(t, flags.warmupS))}\n`) } : {}),
      run: (t) => runOne(t, flags.durationS),
      onRound: (i, got) => process.stdout.write(`\nround ${i + 1}: ${store}/memory ${fmtRatio(got.file.rps / got.memory.rps)}\n${HEADER}\n${row('memory', got.memory)}\n${row('file', got.file)}\n`),
    });
    const finalProbe = await readProbe(file);

    // Stop both (SIGTERM: the gateway drains and closes the ledger), then read the journal.
    await Promise.all(servers.map((s) => stopChild(s.child, 10_000))); // the file ledger drains and closes
    const journal = store === 'file' ? journalStats(ledgerDir) : { segments: 0, bytes: 0, lines: Number(psql(`SELECT count(*) FROM "${schema}".entries`)) };
    const expectedLines = file200 + 1; // every 200 is one charge, plus the account's one-time credit
    const journalOk = journal.lines === expectedLines;
    if (!journalOk) ok = false;

    process.stdout.write(`\nin-process ${store === 'file' ? 'FileLedger' : 'PostgresLedger'} commit cost (gateways stopped)\n`);
    const cost = await commitCost(join(dir, 'inproc'), flags.sync, flags.concurrent, store, `${schema}_inproc`);
    process.stdout.write(
      `  ${cost.syncAppends} sequential single appends: ${cost.syncCommits} commits, ${cost.msPerSyncCommit.toFixed(3)} ms per ${store === 'file' ? 'write+fdatasync' : 'INSERT'} commit\n` +
      `  ${fmtInt(cost.concurrentAppends)} concurrent appends: ${cost.concurrentCommits} commit(s), ${cost.recordsPerCommit.toFixed(0)} records per commit, ${cost.concurrentMs.toFixed(1)} ms in all\n`,
    );

    const n = rounds.count;
    const side = (t: Side) => {
      const rs = rounds.results[t];
      const med = (pick: (r: Run) => number) => rounds.median(t, pick);
      const medOrNull = (pick: (r: Run) => number | null) => (rs.every((r) => pick(r) !== null) ? round3(med((r) => pick(r)!)) : null);
      return {
        rps: Math.round(med((r) => r.rps)), p50Ms: round3(med((r) => r.p50Us) / 1000), p99Ms: round3(med((r) => r.p99Us) / 1000),
        cpuUsPerReq: medOrNull((r) => r.cpuUsPerReq), otherCpu: medOrNull((r) => r.otherCpu), stealCpu: medOrNull((r) => r.stealCpu),
      };
    };
    const summary = n === 0 ? null : { memory: side('memory'), file: side('file') };
    const perCommit = rounds.results.file.filter((r) => r.commits !== null && r.commits > 0).map((r) => r.commitRecords! / r.commits!);
    const ratio = summary === null ? null : summary.file.rps / summary.memory.rps;
    const pairedRatio = n === 0 ? null : rounds.paired('file', 'memory', (r) => r.rps);
    if (summary !== null) {
      process.stdout.write(
        `\nsummary: medians of ${n} rounds, ${flags.connections} connections\n` +
        `  ${'ledger'.padEnd(7)} ${'req/s'.padStart(8)} ${'p50 ms'.padStart(7)} ${'p99 ms'.padStart(7)} ${'cpu/req'.padStart(7)}  other/steal cpu\n` +
        ([['memory', summary.memory], [store, summary.file]] as const).map(([name, x]) => `  ${name.padEnd(7)} ${fmtInt(x.rps).padStart(8)} ${x.p50Ms.toFixed(2).padStart(7)} ` +
          `${x.p99Ms.toFixed(2).padStart(7)} ${`${fmtUs(x.cpuUsPerReq)}us`.padStart(7)}  ${pct(x.otherCpu)}/${pct(x.stealCpu)}\n`).join('') +
        `  ${store}/memory throughput ${fmtRatio(ratio!)} (target >= ${target}: ${metText(ratio! >= target)}); ` +
        `paired per round ${fmtRatio(pairedRatio!)}\n` +
        `  ${store} ledger under load: ${perCommit.length > 0 ? median(perCommit).toFixed(2) : '?'} records per group commit (median of rounds)` +
        `${finalProbe === null ? '' : `; whole run ${fmtInt(finalProbe.records)} records in ${fmtInt(finalProbe.commits)} commits`}\n`,
      );
    }
    const disturbed = (x: LoadResult) => (x.otherCpu !== null && x.otherCpu > 0.25) || (x.stealCpu !== null && x.stealCpu > 0.1);
    const contended = rounds.results.memory.flatMap((m, i) => (disturbed(m) || disturbed(rounds.results.file[i]!) ? [i + 1] : []));
    if (contended.length > 0) {
      process.stdout.write(`  NOTE: round(s) ${contended.join(', ')} shared the CPU (other processes > 25% of a core, or hypervisor steal > 10%): ` +
        'those figures are disturbed; rerun when the machine and its host are quiet\n');
    }
    process.stdout.write(
      `  ${store === 'file' ? `journal: ${journal.segments} segment(s), ` : 'entries table: '}${fmtInt(journal.lines)} records${store === 'file' ? `, ${fmtInt(journal.bytes)} bytes` : ''}; ` +
      `expected ${fmtInt(expectedLines)} (200 answers + 1 credit): ${journalOk ? 'match' : 'MISMATCH'}\n`,
    );
    if (!ok) process.stdout.write('\nFAILED: an answer was not a correct 200, or the journal does not hold every charge (see above)\n');
    process.stdout.write(`${JSON.stringify({
      bench: `ledger: POST /v1/chat/completions, ${store} vs memory ledger`, ok, store, node: process.version, cores: cpu.length,
      date: new Date().toISOString(), connections: flags.connections, rounds: n, durationS: flags.durationS,
      medians: summary, ratio: ratio === null ? null : round3(ratio), pairedRatio: pairedRatio === null ? null : round3(pairedRatio),
      ratioMet: ratio === null ? null : ratio >= target,
      contendedRounds: contended,
      recordsPerCommitUnderLoad: perCommit.length > 0 ? round3(median(perCommit)) : null,
      wholeRun: finalProbe, journal: { ...journal, expected: expectedLines, match: journalOk },
      inProcess: {
        ...cost, msPerSyncCommit: round3(cost.msPerSyncCommit), concurrentMs: round3(cost.concurrentMs), recordsPerCommit: round3(cost.recordsPerCommit),
      },
    })}\n`);
    return ok ? 0 : 1;
  } finally {
    await cleanup();
    clearTimeout(watchdog);
  }
}

if (require.main === module) runMain('ledger bench', main);
