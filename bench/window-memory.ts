/**
 * Memory of the RPM window per active account, by limit (CONTRACT section 7: memory follows
 * the admissions in a window, at most one entry per clock millisecond, whatever the limit).
 *
 *   node --expose-gc --import tsx bench/window-memory.ts
 *
 * For each rpm in 60, 10^4, 10^6, 10^9, on a fake clock, with the memory limiter:
 *   - "one admission": N accounts each admitted once;
 *   - "full rate": N accounts each admitted at its limit for a whole minute, spread evenly
 *     (so a window of rpm >= 60,000 has an admission in every one of its 60,000 milliseconds:
 *     the most it can ever hold).
 * Bytes per account = growth of V8's heap plus array buffers, after a full GC, divided by N.
 * The window before this change was a Float64Array of rpm slots: 8 x rpm bytes once used.
 */
import { MemoryLimiter } from '../src/limiter/memory.js';
import type { AccountLimits, KeyLimits } from '../src/limiter/types.js';
import { fmtInt, parseFlags } from './cli.js';

parseFlags('window-memory.ts', {}); // no flags: --help, and a refusal of anything else

const gc = (globalThis as { gc?: () => void }).gc;
if (gc === undefined) {
  console.error('run with node --expose-gc');
  process.exit(1);
}

class Clock {
  t = Date.UTC(2026, 10, 23, 12);
  now(): number {
    return this.t;
  }
}

const NO_KEY: KeyLimits = { id: 'k', rpm: null, concurrency: null };

function used(): number {
  gc!();
  gc!();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

/** Bytes per account for `accounts` accounts, each admitted `perAccount` times spread over one minute. */
function measure(rpm: number, accounts: number, perAccount: number): number {
  const clock = new Clock();
  const lim = new MemoryLimiter(clock, 3_600_000);
  const limits: AccountLimits[] = Array.from({ length: accounts }, (_, i) => ({
    id: `acct_${i}`, rpm, concurrency: null, dailyCapMicro: null, prepaid: false,
  }));
  const before = used();
  // One millisecond at a time; each account's admissions spread evenly over the minute.
  const step = 60_000 / perAccount;
  let admitted = 0;
  for (let k = 0; k < perAccount; k++) {
    clock.t = Date.UTC(2026, 10, 23, 12) + Math.floor(k * step);
    for (const a of limits) if (lim.admitInstant(a, NO_KEY, null).ok) admitted++;
  }
  if (admitted !== accounts * perAccount) throw new Error(`rpm ${rpm}: ${admitted} of ${accounts * perAccount} admitted`);
  const bytes = (used() - before) / accounts;
  lim.close();
  return bytes;
}

const fmt = (bytes: number) => (bytes >= 1024 * 1024 ? `${(bytes / 1024 / 1024).toFixed(2)} MB` : bytes >= 1024 ? `${(bytes / 1024).toFixed(1)} KB` : `${Math.round(bytes)} B`);

const rows: Array<Record<string, unknown>> = [];
console.log(`node ${process.version}, ${new Date().toISOString().slice(0, 10)}`);
console.log('| rpm | before (8 B x rpm) | one admission | full rate (admissions) | full rate |');
console.log('|---|---|---|---|---|');
for (const rpm of [60, 10_000, 1_000_000, 1_000_000_000]) {
  const one = measure(rpm, 10_000, 1);
  const perAccount = Math.min(rpm, 60_000); // at most one pair per millisecond
  const accounts = perAccount >= 60_000 ? 20 : perAccount >= 10_000 ? 100 : 10_000;
  const full = measure(rpm, accounts, perAccount);
  rows.push({ rpm, before: 8 * rpm, one: Math.round(one), fullAdmissions: perAccount, full: Math.round(full) });
  console.log(`| ${fmtInt(rpm)} | ${fmt(8 * rpm)} | ${fmt(one)} | ${fmtInt(perAccount)}${perAccount < rpm ? '+' : ''} | ${fmt(full)} |`);
}
console.log(JSON.stringify({ bench: 'window-memory', rows }));
