/**
 * Redis's time per call of the limiter's BATCH script, by INFO commandstats: as a script
 * (EVALSHA) and as a Redis function (FCALL), in calls shaped like the billable chat bench's:
 * each call has --ops admissions (new ids, with a reservation), --ops settlements (of the call
 * before) and --ops releases (of the call before that), so the account's sets stay small, as
 * under load. One client, one call at a time: this times the script in Redis, not the gateway.
 *
 *   npm run build && node --import tsx bench/redis-script.ts [--calls 4000] [--ops 7] [--rounds 3]
 *
 * Starts its own redis-server on a free port (no persistence). Prints µs per call for each
 * round and the medians, then a JSON line.
 */
import { spawnSync } from 'node:child_process';
import { createClient } from 'redis';
import { BATCH, BATCH_LIBRARY, batchFunction } from '../dist/limiter/redis-scripts.js';
import { RedisServer } from '../test/helpers/redis-server.js';
import { fmtUs, int, median, parseFlags, runMain } from './cli.js';

const flags = parseFlags('redis-script.ts', {
  calls: int({ default: 4000, min: 10, help: 'calls per mode and round' }),
  ops: int({ default: 7, min: 1, max: 80, help: 'admissions (and settlements, and releases) per call' }),
  rounds: int({ default: 3, min: 1, help: 'rounds (each times both modes)' }),
});

const MODES = ['script', 'function'] as const;

async function main(): Promise<void> {
  const server = await new RedisServer().start();
  const cli = (...args: string[]) => spawnSync('redis-cli', ['-p', String(server.port), ...args], { encoding: 'utf8' }).stdout;
  const client = createClient({ url: server.url });
  await client.connect();
  try {
    const sha = await client.scriptLoad(BATCH);
    const fn = batchFunction('bench');
    await client.sendCommand(['FUNCTION', 'LOAD', 'REPLACE', fn.code]);
    const keys = ['b{a}:wt', 'b{a}:wn', 'b{a}:s', 'b{a}:m', 'b{a}:r'];
    await client.hSet('b{a}:m', { bal: '1000000000000', src: '1' });
    let seq = 0;
    const call = (mode: (typeof MODES)[number]) => {
      const at = seq++;
      const args = ['0', '30000'];
      for (let j = 0; j < flags.ops; j++) {
        args.push('a', `x${at}-${j}`, '2000000,100000,-1,-1,1000000000000', String(5000 + j), '10');
        if (at >= 1) args.push('s', `x${at - 1}-${j}`, '30', '1', String(5000 + j));
        if (at >= 2) args.push('r', `x${at - 2}-${j}`, '0');
      }
      return mode === 'script'
        ? client.sendCommand(['EVALSHA', sha, String(keys.length), ...keys, ...args])
        : client.sendCommand(['FCALL', fn.name, String(keys.length), ...keys, ...args]);
    };
    const usPerCall = (mode: (typeof MODES)[number]) => {
      const line = cli('info', 'commandstats').split(/\r?\n/).find((l) => l.startsWith(mode === 'script' ? 'cmdstat_evalsha:' : 'cmdstat_fcall:'));
      const m = /calls=(\d+),usec=(\d+)/.exec(line ?? '');
      return m === null ? NaN : Number(m[2]) / Number(m[1]);
    };
    process.stdout.write(`BATCH in Redis: ${flags.ops} admissions + ${flags.ops} settlements + ${flags.ops} releases per call, ${flags.calls} calls per mode and round (library ${BATCH_LIBRARY.length} characters)\n`);
    const results: Record<string, number[]> = { script: [], function: [] };
    for (let r = 1; r <= flags.rounds; r++) {
      const row: string[] = [];
      for (const mode of MODES) {
        for (let i = 0; i < 50; i++) await call(mode); // warm
        cli('config', 'resetstat');
        for (let i = 0; i < flags.calls; i++) await call(mode);
        const us = usPerCall(mode);
        results[mode]!.push(us);
        row.push(`${mode} ${fmtUs(us)} µs/call`);
      }
      process.stdout.write(`  round ${r}: ${row.join(', ')}\n`);
    }
    const med = { script: median(results.script!), function: median(results.function!) };
    process.stdout.write(`  median: script ${fmtUs(med.script)} µs, function ${fmtUs(med.function)} µs per call (function / script ${(med.function / med.script).toFixed(3)})\n`);
    process.stdout.write(`${JSON.stringify({ bench: 'redis-script', ops: flags.ops, calls: flags.calls, usPerCall: med })}\n`);
  } finally {
    await client.quit();
    await server.stop();
  }
}

runMain('redis-script.ts', main);
