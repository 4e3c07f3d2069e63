/**
 * The file ledger's snapshot at a seal: the longest the event loop is held while it is built,
 * as one JSON text (how versions 1 and 2 wrote it) against lines written a chunk at a time
 * (version 3), for a book of --cells usage cells (2,000 accounts, one model and key, a cell a
 * day each).
 *
 *   npm run build && node --max-old-space-size=16000 --import tsx bench/ledger-snapshot.ts [--cells 720000] [--rounds 3]
 *
 * "one text" is a single stretch (JSON.stringify of the whole book); "lines" is the longest
 * stretch between two 256 KiB chunks (the writer awaits a write after each). Past some 5.5
 * million cells the one text cannot be made at all (V8's longest string).
 */
import { LedgerBook } from '../dist/ledger/book.js';
import type { LedgerEntry } from '../dist/ledger/types.js';
import { fmtInt, int, median, parseFlags, runMain } from './cli.js';

const flags = parseFlags('ledger-snapshot.ts', {
  cells: int({ default: 720_000, min: 1, help: 'usage cells in the book' }),
  rounds: int({ default: 3, min: 1, help: 'rounds' }),
});

runMain('ledger-snapshot.ts', async () => {
  const book = new LedgerBook();
  const T0 = Date.UTC(2026, 0, 1);
  for (let i = 0; i < flags.cells; i++) {
    book.apply({
      id: `t${i}`, type: 'charge', accountId: `acct_${i % 2000}`, keyId: 'k1', amountMicro: -5, balanceAfterMicro: null, balanceUnknown: false,
      createdAt: T0 + Math.floor(i / 2000) * 86_400_000, requestId: `r${i}`, model: 'm1', inputTokens: 10, outputTokens: 5,
      estimated: false, note: null, idempotencyKey: null, deployment: 'p',
    } satisfies LedgerEntry);
  }
  const oneText: number[] = [];
  const longest: number[] = [];
  for (let r = 0; r < flags.rounds; r++) {
    let t = performance.now();
    try {
      JSON.stringify(book.save());
      oneText.push(performance.now() - t);
    } catch {
      oneText.push(Number.NaN); // too long for one string
    }
    let chunk = '';
    let max = 0;
    t = performance.now();
    for (const line of book.saveLines()) {
      chunk += line;
      if (chunk.length >= 1 << 18) {
        const now = performance.now();
        max = Math.max(max, now - t);
        t = now;
        chunk = '';
      }
    }
    longest.push(Math.max(max, performance.now() - t));
  }
  const one = median(oneText);
  const lines = median(longest);
  console.log(`${fmtInt(flags.cells)} cells: one text ${Number.isNaN(one) ? 'failed' : `${one.toFixed(1)} ms`}; lines: longest stretch ${lines.toFixed(2)} ms (medians of ${flags.rounds})`);
  console.log(JSON.stringify({ bench: 'ledger snapshot', cells: flags.cells, oneTextMs: one, linesLongestMs: lines }));
});
