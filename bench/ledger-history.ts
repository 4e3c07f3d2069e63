/**
 * Billing history on a long file-ledger journal: time per page and how long the event loop
 * is blocked, for the build before back pointers and this one, on the same journal.
 *
 *   npm run build && node --import tsx bench/ledger-history.ts --before OLD_DIST
 *     [--records 10000000] [--accounts 1000] [--pages 20] [--keep] [--dir DIR]
 *
 * 1. Generates `records` records through this build's FileLedger.append (bench/ledger-startup.ts's
 *    history: one credit per account, then charges skewed towards a few heavy accounts), in
 *    16 MB segments, then writes each sealed segment's `.idx` as the build before back pointers
 *    did, so both builds read the same directory (`--dir DIR` reuses one; `--keep` keeps it).
 *    Before the rest, one credit for `acct_light`: an account with one entry, at the very start
 *    of the journal (the case the build before walked every segment for).
 * 2. For each build, in its own child process (`FileLedger` from its dist/): opens the ledger,
 *    then asks history (limit 20) `pages` times each for: acct_light's only page,
 *    the heaviest account's first page, and the heaviest account's 50th page (cursors taken
 *    from the pages before); per call the time and the event loop's longest stall while it
 *    ran (the longest gap between ticks of a 1 ms interval running across the call).
 * Prints a table and a final JSON line.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { FileLedger } from '../src/ledger/file.js';
import { decodeRecord } from '../src/ledger/record.js';
import { generate, History, type Flags as StartupFlags } from './ledger-startup.js';
import { bool, fmtInt, int, median, parseFlags, path, runMain } from './cli.js';

const ROOT = resolve(__dirname, '..');

const FLAGS = {
  before: path({ arg: 'OLD_DIST', help: 'the dist/ of the build before back pointers, to compare' }),
  records: int({ default: 10_000_000, help: 'records to generate' }),
  accounts: int({ default: 1000, help: 'accounts the charges go to' }),
  pages: int({ default: 20, help: 'history calls of each kind' }),
  keep: bool({ help: 'keep the generated directory' }),
  dir: path({ help: 'use this ledger directory instead of generating one' }),
};

/** Writes each sealed segment's `.idx` (account -> [offset, length, ...]) as the build before back pointers did. */
function writeLegacyIndexes(dir: string): void {
  const segments = readdirSync(dir).filter((f) => /^journal-\d{8}\.log$/.test(f)).sort();
  for (const name of segments.slice(0, -1)) {
    const data = readFileSync(join(dir, name));
    const index = new Map<string, number[]>();
    for (let at = 0; at < data.length;) {
      const nl = data.indexOf(10, at);
      const d = decodeRecord(data.toString('utf8', at, nl))!;
      if (d.entry.type !== 'usage') {
        let positions = index.get(d.entry.accountId);
        if (positions === undefined) index.set(d.entry.accountId, (positions = []));
        positions.push(at, nl + 1 - at);
      }
      at = nl + 1;
    }
    writeFileSync(join(dir, name.replace(/\.log$/, '.idx')), JSON.stringify([...index]));
  }
}

/** The child: opens the ledger with a build's FileLedger and times history calls. */
const CHILD = `
const { performance } = require('node:perf_hooks');
const [dist, dir, light, heavy, pages] = process.argv.slice(1);
const { FileLedger } = require(dist + '/ledger/file.js');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
(async () => {
  const t0 = performance.now();
  const ledger = await FileLedger.open(dir);
  const openMs = performance.now() - t0;
  // The event loop's longest stall during a call: the longest gap between ticks of a 1 ms interval
  // running across it (a block that starts with the call and ends with it included).
  let lastTick = 0;
  let maxGap = 0;
  const tick = setInterval(() => {
    const now = performance.now();
    if (now - lastTick > maxGap) maxGap = now - lastTick;
    lastTick = now;
  }, 1);
  const timed = async (account, after) => {
    await sleep(3);
    lastTick = performance.now();
    maxGap = 0;
    const t = performance.now();
    const page = await ledger.history(account, 20, after);
    const ms = performance.now() - t;
    await sleep(3);
    return { ms, stallMs: maxGap, page };
  };
  // The heaviest account's cursor for its 50th page.
  let after = null;
  for (let i = 0; i < 49; i++) after = (await ledger.history(heavy, 20, after)).nextCursor;
  const out = { openMs, light: [], heavy: [], deep: [] };
  for (let i = 0; i < Number(pages); i++) {
    for (const [key, account, cursor] of [['light', light, null], ['heavy', heavy, null], ['deep', heavy, after]]) {
      const r = await timed(account, cursor);
      if (r.page.entries.length === 0) throw new Error('empty page for ' + account);
      out[key].push([r.ms, r.stallMs]);
    }
  }
  clearInterval(tick);
  await ledger.close();
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { process.stderr.write(String(e && e.stack || e)); process.exit(1); });
`;

function runChild(dist: string, dir: string, light: string, heavy: string, pages: number): Promise<{ openMs: number; light: number[][]; heavy: number[][]; deep: number[][] }> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(process.execPath, ['-e', CHILD, dist, dir, light, heavy, String(pages)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => { out += d; });
    child.stderr.on('data', (d: Buffer) => { err += d; });
    child.on('exit', (code) => (code === 0 ? resolvePromise(JSON.parse(out)) : reject(new Error(`${dist}: ${err}`))));
  });
}

async function main(): Promise<void> {
  const flags = parseFlags('ledger-history.ts', FLAGS);
  const dir = flags.dir ?? mkdtempSync(join(tmpdir(), 'mg-bench-history-'));
  try {
    if (flags.dir === null) {
      const startup: StartupFlags = {
        records: flags.records, accounts: flags.accounts, models: 4, days: 30, batch: 20_000, opens: 1, starts: 1, keep: true, dir: null,
      };
      process.stdout.write(`generating ${fmtInt(flags.records)} records in ${dir}\n`);
      const first = await FileLedger.open(dir);
      await first.append({
        id: 'le_light', type: 'credit', accountId: 'acct_light', keyId: null, amountMicro: 1_000_000, balanceAfterMicro: 1_000_000, balanceUnknown: false,
        createdAt: Date.now() - 31 * 86_400_000, requestId: null, model: null, inputTokens: 0, outputTokens: 0, estimated: false, note: null,
        idempotencyKey: null, deployment: null,
      });
      await first.close();
      const g = await generate(dir, startup, new History(startup, Date.now()));
      process.stdout.write(`  ${(g.ms / 1000).toFixed(1)} s, ${g.commits} commits; writing the indexes of the build before back pointers\n`);
      writeLegacyIndexes(dir);
    }
    // Charges are skewed towards low account numbers: acct_0000 is the heaviest.
    const light = 'acct_light';
    const heavy = 'acct_0000';
    const size = execFileSync('du', ['-sh', dir], { encoding: 'utf8' }).split('\t')[0];
    process.stdout.write(`journal: ${size}; light account ${light}, heavy account ${heavy}; ${flags.pages} calls each, limit 20\n\n`);
    const builds: Array<[string, string]> = [];
    if (flags.before !== null) builds.push(['before', flags.before]);
    builds.push(['after', join(ROOT, 'dist')]);
    const rows: Record<string, unknown> = {};
    process.stdout.write('| build | open ms | light p50 / max ms | light stall max ms | heavy p50 ms | deep (50th page) p50 ms | stall max ms (heavy, deep) |\n|---|---|---|---|---|---|---|\n');
    for (const [label, dist] of builds) {
      const r = await runChild(dist, dir, light, heavy, flags.pages);
      const p50 = (xs: number[][]) => median(xs.map((x) => x[0]!));
      const max = (xs: number[][], i: number) => Math.max(...xs.map((x) => x[i]!));
      rows[label] = { openMs: r.openMs, light: { p50: p50(r.light), max: max(r.light, 0), stall: max(r.light, 1) },
        heavy: { p50: p50(r.heavy), stall: max(r.heavy, 1) }, deep: { p50: p50(r.deep), stall: max(r.deep, 1) } };
      process.stdout.write(`| ${label} | ${r.openMs.toFixed(0)} | ${p50(r.light).toFixed(2)} / ${max(r.light, 0).toFixed(1)} | ${max(r.light, 1).toFixed(1)} | ` +
        `${p50(r.heavy).toFixed(2)} | ${p50(r.deep).toFixed(2)} | ${max(r.heavy, 1).toFixed(1)}, ${max(r.deep, 1).toFixed(1)} |\n`);
    }
    process.stdout.write(`${JSON.stringify({ bench: 'ledger history', node: process.version, date: new Date().toISOString(), records: flags.records, accounts: flags.accounts, rows })}\n`);
  } finally {
    if (flags.dir === null && !flags.keep) rmSync(dir, { recursive: true, force: true });
  }
}

runMain('ledger-history bench', main);
