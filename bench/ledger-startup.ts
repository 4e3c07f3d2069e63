/**
 * The ledger start-up benchmark: how long a restart takes with a long file-ledger history.
 *
 *   npm run build && node --import tsx bench/ledger-startup.ts
 *     [--records 5000000] [--accounts 1000] [--models 4] [--days 30] [--batch 20000]
 *     [--opens 5] [--starts 3] [--keep] [--dir DIR]
 *
 * 1. Generates a ledger directory under /tmp with `records` historical records through
 *    FileLedger.append itself (so the files are exactly what the gateway writes: 16 MB sealed
 *    segments, their indexes, the snapshot), `batch` concurrent appends at a time (one group
 *    commit each): one credit per account, then charges spread over `accounts` accounts (two
 *    keys each), `models` models and the last `days` days, in time order. `--dir DIR` uses an
 *    existing ledger directory instead (never deleted, not generated).
 * 2. Times `FileLedger.open(dir)` in a fresh child process each time (nothing cached in a JS
 *    heap; the OS page cache is warm), median of `opens`, and the whole gateway start-up
 *    (spawn of `node dist/main.js --config ...` to its "listening" line on stdout) with
 *    ledger.dir pointing at the directory, median of `starts`; a memory-ledger gateway start
 *    is timed alongside for reference (node and the gateway without any ledger work).
 * 3. Then the worst case: the open segment (the only one replayed) is topped up with charges
 *    to just under the 16 MB seal size, and both are timed again.
 * Target: start-up under 2 s. Prints a table and a final JSON line; deletes the generated data
 * at the end unless --keep. Exits 1 when something fails (not when the target is missed).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { FileLedger } from '../src/ledger/file.js';
import { encodeRecord } from '../src/ledger/record.js';
import type { LedgerEntry } from '../src/ledger/types.js';
import { bool, fmtInt, int, median, metText, parseFlags, round3, runMain, str, type FlagValues } from './cli.js';
import { journalStats, ROOT } from './ledger.js';
import { rng } from '../test/helpers/fake-clock.js';
import { machineCpu, sleep } from './rawhttp.js';

const TARGET_MS = 2000;
const SEGMENT_BYTES = 16 * 1024 * 1024; // FileLedger's default maxSegmentBytes
const DAY_MS = 86_400_000;
const MODELS: Array<{ id: string; inputPerMillion: number; outputPerMillion: number }> = [
  { id: 'gpt-4o-mini', inputPerMillion: 0.15, outputPerMillion: 0.6 },
  { id: 'gpt-4o', inputPerMillion: 2.5, outputPerMillion: 10 },
  { id: 'claude-haiku', inputPerMillion: 0.8, outputPerMillion: 4 },
  { id: 'claude-sonnet', inputPerMillion: 3, outputPerMillion: 15 },
  { id: 'embed-small', inputPerMillion: 0.02, outputPerMillion: 0 },
  { id: 'o3-mini', inputPerMillion: 1.1, outputPerMillion: 4.4 },
  { id: 'mistral-small', inputPerMillion: 0.2, outputPerMillion: 0.6 },
  { id: 'llama-70b', inputPerMillion: 0.6, outputPerMillion: 0.6 },
];

const FLAGS = {
  records: int({ default: 5_000_000, max: 50_000_000, help: 'records to generate (at least --accounts)' }),
  accounts: int({ default: 1000, help: 'accounts, two keys each' }),
  models: int({ default: 4, max: MODELS.length, help: 'models the charges use' }),
  days: int({ default: 30, help: 'days the history spans' }),
  batch: int({ default: 20_000, help: 'concurrent appends per group commit while generating' }),
  opens: int({ default: 5, max: 50, help: 'timed FileLedger.open runs' }),
  starts: int({ default: 3, max: 50, help: 'timed gateway start-ups' }),
  keep: bool({ help: 'keep the generated data' }),
  dir: str({ default: null, arg: 'DIR', help: 'time an existing ledger directory instead (not modified by generation)' }),
};
export type Flags = FlagValues<typeof FLAGS>;

// ---------------------------------------------------------------------------------------------
// Generation
// ---------------------------------------------------------------------------------------------

const accountId = (a: number) => `acct_${String(a).padStart(4, '0')}`;
const keyId = (a: number, k: number) => `key_${String(a).padStart(4, '0')}_${k === 0 ? 'a' : 'b'}`;
const INITIAL_CREDIT_MICRO = 1_000_000 * 1_000_000; // 1,000,000 USD: no account runs dry

export class History {
  private readonly random = rng(42) // deterministic: every run generates the same history;
  private readonly balances: number[];
  private next = 0;
  private readonly start: number;
  private readonly spanMs: number;

  constructor(readonly flags: Flags, now: number) {
    this.balances = new Array<number>(flags.accounts).fill(0);
    this.spanMs = flags.days * DAY_MS;
    this.start = now - this.spanMs;
  }

  /** Record number `next`: the first `accounts` are the initial credits, the rest charges in time order. */
  entry(): LedgerEntry {
    const i = this.next++;
    const n = this.flags.accounts;
    if (i < n) {
      this.balances[i]! += INITIAL_CREDIT_MICRO;
      return {
        id: `le_${i.toString(36).padStart(10, '0')}`, type: 'credit', accountId: accountId(i), keyId: null, amountMicro: INITIAL_CREDIT_MICRO,
        balanceAfterMicro: this.balances[i]!, balanceUnknown: false, createdAt: this.start, requestId: null, model: null, inputTokens: 0, outputTokens: 0,
        estimated: false, note: 'initial balance', idempotencyKey: null, deployment: null,
      };
    }
    // Skewed towards low account numbers (a few heavy users), like real traffic.
    const a = Math.min(n - 1, Math.floor(n * this.random() ** 2));
    const m = MODELS[Math.floor(this.random() * this.flags.models)]!;
    const inputTokens = 20 + Math.floor(this.random() * 4000);
    const outputTokens = m.outputPerMillion === 0 ? 0 : 5 + Math.floor(this.random() * 1000);
    const cost = Math.ceil(inputTokens * m.inputPerMillion + outputTokens * m.outputPerMillion); // micro-dollars
    this.balances[a]! -= cost;
    return {
      id: `le_${i.toString(36).padStart(10, '0')}`, type: 'charge', accountId: accountId(a), keyId: keyId(a, this.random() < 0.7 ? 0 : 1),
      amountMicro: -cost, balanceAfterMicro: this.balances[a]!, balanceUnknown: false,
      createdAt: this.start + Math.floor(Math.min(1, (i - n) / Math.max(1, this.flags.records - n)) * this.spanMs), // top-ups: now
      requestId: `req_${i.toString(36).padStart(10, '0')}`, model: m.id, inputTokens, outputTokens, estimated: this.random() < 0.001, note: null, idempotencyKey: null, deployment: 'mock',
    };
  }
}

interface DirInfo {
  files: number;
  bytes: number;
  segments: number;
  snapshotBytes: number;
  indexBytes: number;
  /** The last (open) segment: the only one a start-up replays. */
  openSegment: string;
  openSegmentBytes: number;
}

function dirInfo(dir: string): DirInfo {
  const info: DirInfo = { files: 0, bytes: 0, segments: 0, snapshotBytes: 0, indexBytes: 0, openSegment: '', openSegmentBytes: 0 };
  for (const name of readdirSync(dir).sort()) {
    const size = statSync(join(dir, name)).size;
    info.files++;
    info.bytes += size;
    if (/^journal-\d{8}\.log$/.test(name)) {
      info.segments++;
      info.openSegment = name;
      info.openSegmentBytes = size;
    } else if (name.endsWith('.idx')) info.indexBytes += size;
    else if (name === 'snapshot.json') info.snapshotBytes = size;
  }
  return info;
}

async function appendAll(ledger: FileLedger, entries: LedgerEntry[]): Promise<void> {
  await Promise.all(entries.map((e) => ledger.append(e)));
}

export async function generate(dir: string, flags: Flags, history: History): Promise<{ ms: number; commits: number }> {
  const ledger = await FileLedger.open(dir);
  const t0 = performance.now();
  let nextReport = 0.1;
  for (let done = 0; done < flags.records;) {
    const count = Math.min(flags.batch, flags.records - done);
    const entries = new Array<LedgerEntry>(count);
    for (let j = 0; j < count; j++) entries[j] = history.entry();
    await appendAll(ledger, entries);
    done += count;
    if (done / flags.records >= nextReport) {
      process.stdout.write(`  generated ${fmtInt(done)} records (${Math.round((done / flags.records) * 100)}%), ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
      nextReport += 0.1;
    }
  }
  await ledger.close();
  return { ms: performance.now() - t0, commits: ledger.stats.commits };
}

/** Appends charges until the open segment is just under the seal size (it stays open). */
async function topUp(dir: string, history: History): Promise<number> {
  const ledger = await FileLedger.open(dir);
  let size = dirInfo(dir).openSegmentBytes;
  let added = 0;
  for (;;) {
    const entries: LedgerEntry[] = [];
    for (;;) {
      const e = history.entry();
      const bytes = Buffer.byteLength(encodeRecord(e));
      // Sealing happens once a commit leaves the segment at >= SEGMENT_BYTES; stay 1 KB below.
      if (size + bytes >= SEGMENT_BYTES - 1024 || entries.length === 20_000) {
        if (size + bytes < SEGMENT_BYTES - 1024) {
          entries.push(e);
          size += bytes;
        }
        break;
      }
      entries.push(e);
      size += bytes;
    }
    if (entries.length === 0) break;
    await appendAll(ledger, entries);
    added += entries.length;
    if (entries.length < 20_000) break;
  }
  await ledger.close();
  return added;
}

// ---------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------

/** Runs `node args...` and resolves with its stdout; rejects on a non-zero exit or after `timeoutMs`. */
function runNode(args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => { out += s; });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { err += s; });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(`node ${args.join(' ')} ${signal ?? `exited ${code}`}\n${err}`));
    });
  });
}

interface OpenTiming {
  ms: number;
  accounts: number;
  rssMb: number;
}

/** FileLedger.open(dir) in a fresh process (the compiled dist/ the gateway runs). */
async function timeOpen(dir: string): Promise<OpenTiming> {
  const script = `
const { performance } = require('node:perf_hooks');
const { FileLedger } = require(${JSON.stringify(join(ROOT, 'dist', 'ledger', 'file.js'))});
(async () => {
  const t0 = performance.now();
  const ledger = await FileLedger.open(${JSON.stringify(dir)});
  const ms = performance.now() - t0;
  const accounts = ledger.totals().size;
  await ledger.close();
  process.stdout.write(JSON.stringify({ ms, accounts, rssMb: process.memoryUsage().rss / 1048576 }) + '\\n');
})().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\\n'); process.exit(1); });
`;
  return JSON.parse(await runNode(['-e', script], 60_000)) as OpenTiming;
}

/**
 * Spawns the gateway and resolves with the ms from spawn to its "listening" line on stdout,
 * then stops it (SIGTERM; SIGKILL after 10 s). Rejects if it does not listen within 30 s.
 */
function timeGatewayStart(configFile: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(process.execPath, ['dist/main.js', '--config', configFile, '--port', '0'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let startMs: number | null = null;
    child.stderr.setEncoding('utf8').on('data', (s: string) => { err += s; });
    child.stdout.setEncoding('utf8').on('data', (s: string) => {
      if (startMs !== null) return; // keep draining
      out += s;
      if (out.includes('"msg":"listening"')) {
        startMs = performance.now() - t0;
        clearTimeout(timer);
        const kill = setTimeout(() => child.kill('SIGKILL'), 10_000);
        child.once('exit', () => clearTimeout(kill));
        child.kill('SIGTERM');
      }
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (startMs !== null) resolve(startMs);
      else reject(new Error(`gateway did not listen: ${signal ?? `exited ${code}`}\n${err}${out}`));
    });
  });
}

function writeConfigs(tmp: string, ledgerDir: string, flags: Flags): { file: string; memory: string } {
  const models = Object.fromEntries(MODELS.slice(0, flags.models).map((m) => [m.id, {
    provider: 'mock', price: { inputPerMillion: m.inputPerMillion, outputPerMillion: m.outputPerMillion },
  }]));
  // Every configured account is one the ledger knows, so the start-up credits nobody (writes nothing).
  const n = Math.min(flags.accounts, 20);
  const config = (ledger: Record<string, string>) => ({
    server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
    ledger,
    plans: { bench: { rpm: 6000, concurrency: 100 } },
    accounts: Object.fromEntries(Array.from({ length: n }, (_, a) => [accountId(a), { plan: 'bench', balanceUsd: 1_000_000 }])),
    keys: Object.fromEntries(Array.from({ length: n }, (_, a) => [keyId(a, 0), { account: accountId(a), key: `sk-startup-${a}` }])),
    models,
    providers: { mock: { protocol: 'mock' } },
  });
  const file = join(tmp, 'gateway-file.json');
  const memory = join(tmp, 'gateway-memory.json');
  writeFileSync(file, JSON.stringify(config({ store: 'file', dir: ledgerDir })));
  writeFileSync(memory, JSON.stringify(config({ store: 'memory' })));
  return { file, memory };
}

/** CPU the machine spends over `ms` (nothing of ours running): other processes, in cores; null where unknown. */
async function backgroundCores(ms: number): Promise<number | null> {
  const a = machineCpu();
  await sleep(ms);
  const b = machineCpu();
  if (a === null || b === null) return null;
  return ((b.busy - a.busy + b.steal - a.steal) / Math.max(1, b.total - a.total)) * cpus().length;
}

interface Breakdown {
  readSnapshotMs: number;
  parseSnapshotMs: number;
  loadBookMs: number;
  readSegmentMs: number;
  decodeMs: number;
  applyMs: number;
  segmentRecords: number;
}

/**
 * Where an open's time goes, re-done step by step in a fresh process from the files and the
 * compiled LedgerBook and decodeRecord (FileLedger.open does these plus each account's newest position).
 */
async function breakdown(dir: string, openSegment: string): Promise<Breakdown> {
  const script = `
const { performance } = require('node:perf_hooks');
const { readFileSync } = require('node:fs');
const { LedgerBook } = require(${JSON.stringify(join(ROOT, 'dist', 'ledger', 'book.js'))});
const { decodeRecord } = require(${JSON.stringify(join(ROOT, 'dist', 'ledger', 'record.js'))});
let t = performance.now();
const lap = () => { const now = performance.now(); const d = now - t; t = now; return d; };
const text = readFileSync(${JSON.stringify(join(dir, 'snapshot.json'))}, 'utf8');
const readSnapshotMs = lap();
// Version 3: a header line, then the book's lines, positions ('l') and an end line.
const lines = text.split('\\n').filter((l) => l !== '').map((l) => JSON.parse(l));
const parseSnapshotMs = lap();
const book = new LedgerBook();
for (const line of lines.slice(1)) if (line[0] !== 'l' && line[0] !== 'end') book.loadLine(line);
const loadBookMs = lap();
const data = readFileSync(${JSON.stringify(join(dir, openSegment))});
const readSegmentMs = lap();
const entries = [];
for (let at = 0; at < data.length;) {
  const nl = data.indexOf(10, at);
  entries.push(decodeRecord(data.toString('utf8', at, nl)).entry);
  at = nl + 1;
}
const decodeMs = lap();
for (const e of entries) book.apply(e);
const applyMs = lap();
process.stdout.write(JSON.stringify({ readSnapshotMs, parseSnapshotMs, loadBookMs, readSegmentMs, decodeMs, applyMs, segmentRecords: entries.length }) + '\\n');
`;
  return JSON.parse(await runNode(['-e', script], 60_000)) as Breakdown;
}

interface Measure {
  label: string;
  records: number;
  dir: DirInfo;
  openMs: number[];
  gatewayMs: number[];
  memoryGatewayMs: number[];
  accounts: number;
  rssMb: number;
  /** Other processes' CPU in the 0.5 s before each timed run, in cores. */
  background: number[];
  breakdown: Breakdown | null;
}

async function measure(label: string, ledgerDir: string, configs: { file: string; memory: string }, flags: Flags): Promise<Measure> {
  const records = journalStats(ledgerDir).lines; // counted, not assumed
  const m: Measure = {
    label, records, dir: dirInfo(ledgerDir), openMs: [], gatewayMs: [], memoryGatewayMs: [], accounts: 0, rssMb: 0, background: [], breakdown: null,
  };
  const quiet = async () => {
    const c = await backgroundCores(500);
    if (c !== null) m.background.push(c);
  };
  for (let i = 0; i < flags.opens; i++) {
    await quiet();
    const t = await timeOpen(ledgerDir);
    m.openMs.push(t.ms);
    m.accounts = t.accounts;
    m.rssMb = t.rssMb;
  }
  for (let i = 0; i < flags.starts; i++) {
    await quiet();
    m.gatewayMs.push(await timeGatewayStart(configs.file));
    await quiet();
    m.memoryGatewayMs.push(await timeGatewayStart(configs.memory));
  }
  if (m.dir.snapshotBytes > 0 && m.dir.openSegment !== '') m.breakdown = await breakdown(ledgerDir, m.dir.openSegment);
  const after = dirInfo(ledgerDir);
  if (after.bytes !== m.dir.bytes || after.files !== m.dir.files) throw new Error(`the ledger directory changed while timing start-up (${m.dir.bytes} -> ${after.bytes} bytes)`);
  const f = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(', ');
  process.stdout.write(
    `\n${label}: ${fmtInt(records)} records, ${m.dir.segments} segments, open segment ${m.dir.openSegment} ${(m.dir.openSegmentBytes / 1048576).toFixed(1)} MB, ` +
    `snapshot ${(m.dir.snapshotBytes / 1048576).toFixed(1)} MB, ${m.accounts} accounts\n` +
    `  FileLedger.open, fresh process:     median ${median(m.openMs).toFixed(0)} ms  (runs: ${f(m.openMs)}; rss after open ${m.rssMb.toFixed(0)} MB)\n` +
    `  gateway spawn -> listening (file):   median ${median(m.gatewayMs).toFixed(0)} ms  (runs: ${f(m.gatewayMs)})  target < ${TARGET_MS} ms: ${metText(median(m.gatewayMs) < TARGET_MS)}\n` +
    `  gateway spawn -> listening (memory): median ${median(m.memoryGatewayMs).toFixed(0)} ms  (runs: ${f(m.memoryGatewayMs)})  reference: no ledger to read\n` +
    (m.breakdown === null ? '' : `  open, step by step: read snapshot ${m.breakdown.readSnapshotMs.toFixed(0)} ms, JSON.parse ${m.breakdown.parseSnapshotMs.toFixed(0)} ms, ` +
      `LedgerBook.load ${m.breakdown.loadBookMs.toFixed(0)} ms; open segment: read ${m.breakdown.readSegmentMs.toFixed(0)} ms, ` +
      `decode ${fmtInt(m.breakdown.segmentRecords)} records ${m.breakdown.decodeMs.toFixed(0)} ms, apply ${m.breakdown.applyMs.toFixed(0)} ms (+ index, not timed)\n`) +
    (m.background.length === 0 ? '' : `  other processes' CPU just before each run: median ${Math.round(median(m.background) * 100)}%, max ${Math.round(Math.max(...m.background) * 100)}% of a core` +
      `${Math.max(...m.background) > 0.25 ? '  (NOTE: not a quiet machine; figures disturbed)' : ''}\n`),
  );
  return m;
}

const summarize = (m: Measure) => ({
  records: m.records, segments: m.dir.segments, dirBytes: m.dir.bytes, snapshotBytes: m.dir.snapshotBytes, indexBytes: m.dir.indexBytes,
  openSegmentBytes: m.dir.openSegmentBytes, accounts: m.accounts,
  openMs: round3(median(m.openMs)), openRuns: m.openMs.map(round3), openRssMb: round3(m.rssMb),
  gatewayStartMs: round3(median(m.gatewayMs)), gatewayRuns: m.gatewayMs.map(round3),
  memoryGatewayStartMs: round3(median(m.memoryGatewayMs)),
  breakdown: m.breakdown === null ? null : Object.fromEntries(Object.entries(m.breakdown).map(([k, v]) => [k, round3(v)])),
  backgroundCores: m.background.length === 0 ? null : { median: round3(median(m.background)), max: round3(Math.max(...m.background)) },
  targetMet: median(m.gatewayMs) < TARGET_MS,
});

async function main(): Promise<number> {
  process.stdout.on('error', () => {}); // a closed pipe (| head) must not skip the clean-up
  const flags = parseFlags('ledger-startup.ts', FLAGS, { check: (f) => (f.records < f.accounts ? '--records must be at least --accounts' : null) });
  const tmp = mkdtempSync(join(tmpdir(), 'mg-ledger-startup-'));
  const ledgerDir = flags.dir ?? join(tmp, 'ledger');
  const remove = () => {
    if (flags.keep) {
      process.stdout.write(`kept: ${tmp}\n`);
      return;
    }
    rmSync(tmp, { recursive: true, force: true });
  };
  // Bounded: generation runs at well over 20,000 records/s; allow plenty, then stop.
  const limitS = 600 + Math.ceil(flags.records / 10_000);
  const watchdog = setTimeout(() => {
    process.stderr.write(`ledger-startup bench: watchdog after ${limitS} s, stopping\n`);
    remove();
    process.exit(1);
  }, limitS * 1000);
  watchdog.unref();
  process.once('SIGINT', () => {
    remove();
    process.exit(130);
  });

  try {
    const cpu = cpus();
    process.stdout.write(
      `ledger start-up: node ${process.version}, ${cpu.length} cores (${cpu[0]?.model ?? '?'})\n` +
      `ledger dir ${ledgerDir}${flags.dir === null ? ` (generated: ${fmtInt(flags.records)} records, ${flags.accounts} accounts x 2 keys, ` +
        `${flags.models} models, ${flags.days} days, batches of ${fmtInt(flags.batch)} concurrent appends)` : ' (existing, not modified by generation)'}\n`,
    );
    const history = new History(flags, Date.now());
    let generation: { ms: number; commits: number } | null = null;
    if (flags.dir === null) {
      generation = await generate(ledgerDir, flags, history);
      const info = dirInfo(ledgerDir);
      process.stdout.write(
        `generated in ${(generation.ms / 1000).toFixed(1)} s (${fmtInt(flags.records / (generation.ms / 1000))} records/s, ` +
        `${generation.commits} commits): ${info.files} files, ${(info.bytes / 1048576).toFixed(1)} MB\n`,
      );
    }
    const configs = writeConfigs(tmp, ledgerDir, flags);
    const results: Measure[] = [];
    results.push(await measure(flags.dir === null ? 'as generated' : 'existing directory', ledgerDir, configs, flags));
    if (flags.dir === null) {
      const added = await topUp(ledgerDir, history);
      results.push(await measure(`worst case (open segment topped up with ${fmtInt(added)} charges to just under 16 MB)`, ledgerDir, configs, flags));
    }
    const met = results.every((m) => median(m.gatewayMs) < TARGET_MS);
    process.stdout.write(`\ntarget: gateway start-up < ${TARGET_MS} ms: ${metText(met)}\n`);
    process.stdout.write(`${JSON.stringify({
      bench: 'ledger start-up', node: process.version, cores: cpu.length, date: new Date().toISOString(),
      generated: flags.dir === null ? { records: flags.records, accounts: flags.accounts, models: flags.models, days: flags.days, batch: flags.batch,
        ms: round3(generation!.ms), commits: generation!.commits } : null,
      asGenerated: summarize(results[0]!), worstCase: results[1] === undefined ? null : summarize(results[1]), targetMs: TARGET_MS, targetMet: met,
    })}\n`);
    return 0;
  } finally {
    remove();
    clearTimeout(watchdog);
  }
}

if (require.main === module) runMain('ledger-startup bench', main);
