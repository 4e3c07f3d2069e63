/**
 * CPU per access-log line (issue 18: at most 1 µs), the gateway's own Logger from dist/ with
 * its default buffer, writing to a file, to /dev/null, and to a function that drops the text
 * (building and buffering only).
 *
 *   npm run build && node --import tsx bench/log-line.ts [--rate 100000] [--seconds 3] [--rounds 5]
 *
 * Each round logs access lines at --rate lines a second (twice what this machine's fastest
 * route answers), in one-millisecond event-loop turns as a server's requests would arrive, for
 * --seconds, then waits until they are written. (Logging as fast as the CPU allows measures
 * something no server does: the text then piles up faster than any disk takes it.) The CPU
 * counted is the whole process's (user + system, every thread: the writes happen on libuv's
 * thread pool), minus the same loop with no logging, divided by the lines. Prints the median
 * per target and a final JSON line; a line dropped fails the run.
 */
import { mkdtempSync, openSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Logger } from '../dist/log.js';
import { int, median, num, parseFlags, runMain } from './cli.js';

const TARGET_NS = 1000;

const flags = parseFlags('log-line.ts', {
  rate: int({ default: 100_000, help: 'access lines per second' }),
  seconds: num({ default: 3, help: 'seconds per target and round' }),
  rounds: int({ default: 5, help: 'rounds' }),
});
const { rate, rounds } = flags;
const lines = Math.round(rate * flags.seconds);

// Request ids as the gateway makes them (a fresh string per request), made before timing.
const ids = Array.from({ length: 4096 }, (_, i) => `req_${i.toString(16).padStart(24, '0')}`);
const PATHS = ['/v1/models', '/v1/chat/completions'];

function cpuNs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) * 1000;
}

/**
 * Calls `log(i)` for `lines` lines at `rate` a second, in turns a millisecond apart (each makes
 * the lines due by then), then `settle`; resolves with the CPU ns spent.
 */
async function timed(log: ((i: number) => void) | null, settle: () => Promise<void>): Promise<number> {
  const start = cpuNs();
  const t0 = performance.now();
  let i = 0;
  while (i < lines) {
    const due = Math.min(lines, Math.floor(((performance.now() - t0) * rate) / 1000));
    if (log !== null) for (; i < due; i++) log(i);
    else i = due;
    await new Promise<void>((r) => setTimeout(r, 1));
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
        ['file', new Logger(openSync(file, 'w'), 'info')],
        ['devnull', new Logger(openSync('/dev/null', 'w'), 'info')],
        ['buffer_only', new Logger(() => {}, 'info')],
      ];
      for (const [name, logger] of targets) {
        const ns = await timed(accessLine(logger), () => logger.flush(60_000));
        if (logger.dropped !== 0) throw new Error(`${name}: ${logger.dropped} lines dropped; the bench measures kept lines`);
        results[name]!.push((ns - empty) / lines);
      }
    }
    const fileBytes = statSync(file).size;
    process.stdout.write(`access-log line CPU (process, all threads), ${lines.toLocaleString('en-US')} lines at ${rate.toLocaleString('en-US')}/s x ${rounds} rounds; last file ${(fileBytes / lines).toFixed(0)} bytes/line\n`);
    const medians: Record<string, number> = {};
    for (const [name, values] of Object.entries(results)) {
      medians[name] = Math.round(median(values));
      process.stdout.write(`  ${name.padEnd(12)} ${values.map((v) => `${v.toFixed(0)} ns`).join('  ')}   median ${medians[name]} ns\n`);
    }
    const worst = Math.max(...Object.values(medians));
    process.stdout.write(`target <= ${TARGET_NS} ns per line: ${worst <= TARGET_NS ? 'met' : 'NOT met'}\n`);
    process.stdout.write(`${JSON.stringify({ bench: 'log-line', lines, rate, rounds, medianNs: medians, targetNs: TARGET_NS })}\n`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

runMain('log-line.ts', main);
