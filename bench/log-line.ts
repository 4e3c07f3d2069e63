/**
 * CPU per access-log line (issue 18: at most 1 µs), the gateway's own Logger from dist/ writing
 * to a file, to /dev/null, and to a function that drops the text (building and buffering only).
 *
 *   npm run build && node --import tsx bench/log-line.ts [--lines 2000000] [--per-turn 64] [--rounds 5]
 *
 * Each round logs --lines access lines, --per-turn of them per event-loop turn (as requests
 * would), then waits until they are written. The CPU counted is the whole process's (user +
 * system, every thread: the writes happen on libuv's thread pool), minus the same loop with
 * no logging, divided by the lines. Prints the median per target and a final JSON line.
 */
import { mkdtempSync, openSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Logger } from '../dist/log.js';
import { int, median, parseFlags, runMain } from './cli.js';

const TARGET_NS = 1000;
/**
 * The loop below makes lines far faster than any server (millions a second), faster than a
 * disk takes them: a buffer large enough that none is dropped measures the cost of a line kept.
 */
const BUFFER = 512 * 1024 * 1024;

const flags = parseFlags('log-line.ts', {
  lines: int({ default: 2_000_000, help: 'access lines per target and round' }),
  perTurn: int({ default: 64, help: 'lines per event-loop turn' }),
  rounds: int({ default: 5, help: 'rounds' }),
});
const { lines, perTurn, rounds } = flags;

// Request ids as the gateway makes them (a fresh string per request), made before timing.
const ids = Array.from({ length: 4096 }, (_, i) => `req_${i.toString(16).padStart(24, '0')}`);
const PATHS = ['/v1/models', '/v1/chat/completions'];

function cpuNs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) * 1000;
}

/** Runs `lines` calls of `log(i)` in turns of `perTurn`, then `settle`; resolves with the CPU ns spent. */
async function timed(log: ((i: number) => void) | null, settle: () => Promise<void>): Promise<number> {
  const start = cpuNs();
  for (let i = 0; i < lines; i += perTurn) {
    const end = Math.min(lines, i + perTurn);
    if (log !== null) for (let j = i; j < end; j++) log(j);
    await new Promise<void>((r) => setImmediate(r));
  }
  await settle();
  return cpuNs() - start;
}

function accessLine(logger: Logger): (i: number) => void {
  return (i) => logger.access(ids[i & 4095]!, 'GET', PATHS[i & 1]!, 200, 0.1 + (i % 997) / 1000, 'acct_bench', null);
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-log-'));
  const file = join(dir, 'access.log');
  const results: Record<string, number[]> = { file: [], devnull: [], buffer_only: [] };
  try {
    for (let round = 0; round < rounds; round++) {
      const empty = await timed(null, async () => {});
      const targets: Array<[string, Logger]> = [
        ['file', new Logger(openSync(file, 'w'), 'info', { bufferBytes: BUFFER })],
        ['devnull', new Logger(openSync('/dev/null', 'w'), 'info', { bufferBytes: BUFFER })],
        ['buffer_only', new Logger(() => {}, 'info', { bufferBytes: BUFFER })],
      ];
      for (const [name, logger] of targets) {
        const ns = await timed(accessLine(logger), () => logger.flush(60_000));
        if (logger.dropped !== 0) throw new Error(`${name}: ${logger.dropped} lines dropped; the bench measures kept lines`);
        results[name]!.push((ns - empty) / lines);
      }
    }
    const fileBytes = statSync(file).size;
    process.stdout.write(`access-log line CPU (process, all threads), ${lines.toLocaleString('en-US')} lines x ${rounds} rounds, ${perTurn} per turn; last file ${(fileBytes / lines).toFixed(0)} bytes/line\n`);
    const medians: Record<string, number> = {};
    for (const [name, values] of Object.entries(results)) {
      medians[name] = Math.round(median(values));
      process.stdout.write(`  ${name.padEnd(12)} ${values.map((v) => `${v.toFixed(0)} ns`).join('  ')}   median ${medians[name]} ns\n`);
    }
    const worst = Math.max(...Object.values(medians));
    process.stdout.write(`target <= ${TARGET_NS} ns per line: ${worst <= TARGET_NS ? 'met' : 'NOT met'}\n`);
    process.stdout.write(`${JSON.stringify({ bench: 'log-line', lines, perTurn, rounds, medianNs: medians, targetNs: TARGET_NS })}\n`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

runMain('log-line.ts', main);
