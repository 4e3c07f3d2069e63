import { DAY_MS } from '../clock.js';
import type { Logger } from '../log.js';
import { CREDIT_KEY_DAYS } from './book.js';
import { FileLedger, hasJournal } from './file.js';
import type { Ledger, LedgerEntry } from './types.js';

/** Entries sent to the target at once (its group commit takes them in one statement or a few). */
const BATCH = 500;

export interface ImportResult {
  /** Entries the target holds now (an entry it already had counts: it keeps it once). */
  imported: number;
  /** Entries the target refused or could not keep (each logged): the run should be looked at, and can be made again. */
  refused: number;
}

/**
 * Copies the books of a file ledger (its directory, locked meanwhile: no gateway may be running
 * on it) into another ledger, oldest entry first. The target keeps each entry once by its id, and
 * one admin credit per account and Idempotency-Key, so running it again, or importing the file
 * ledgers of several instances that each recorded the same credit, counts everything once. A
 * credit whose key the target already holds for another credit (a key used again after the file
 * ledger forgot it, 7 days on; PostgreSQL keeps keys for ever) cannot be kept: it is refused, so
 * the operator can credit it again under another key. Stops when the target stops taking entries.
 */
export async function importFileLedger(dir: string, target: Ledger, logger: Logger): Promise<ImportResult> {
  if (!hasJournal(dir)) throw new Error(`${dir} holds no file ledger (no journal-NNNNNNNN.log)`);
  const source = await FileLedger.open(dir, { logger });
  const result: ImportResult = { imported: 0, refused: 0 };
  const refuse = (entry: LedgerEntry, why: string) => {
    result.refused++;
    logger.error(`import: ${why}`, { entry_id: entry.id, type: entry.type, account_id: entry.accountId, amount_micro: entry.amountMicro });
  };
  try {
    let batch: Array<{ entry: LedgerEntry; appended: Promise<void> }> = [];
    const send = async () => {
      for (const { entry, appended } of batch) {
        try {
          await appended;
        } catch (err) {
          refuse(entry, `the target refused an entry: ${String(err)}`);
          continue;
        }
        if (entry.type === 'credit' && entry.idempotencyKey !== null && !(await keptAs(target, entry))) {
          refuse(entry, `the target holds Idempotency-Key "${entry.idempotencyKey}" for another credit: this one is not kept; credit it again under another key`);
          continue;
        }
        result.imported++;
      }
      batch = [];
      if (result.refused > 0 && !target.ready()) throw new Error('the target stopped taking entries; run the import again once it answers (entries already copied are kept once)');
    };
    for (const entry of source.entries()) {
      let appended: Promise<void>;
      try {
        appended = Promise.resolve(target.append(entry));
      } catch (err) {
        appended = Promise.reject(err);
      }
      appended.catch(() => {}); // handled in send
      batch.push({ entry, appended });
      if (batch.length >= BATCH) await send();
    }
    await send();
  } finally {
    await source.close();
  }
  return result;
}

/** Whether the credit the target keeps under `entry`'s Idempotency-Key is this one (or another instance's copy of it). */
async function keptAs(target: Ledger, entry: LedgerEntry): Promise<boolean> {
  const kept = await target.creditByKey(entry.accountId, entry.idempotencyKey!);
  if (kept === undefined) return false;
  if (kept.id === entry.id) return true;
  return kept.amountMicro === entry.amountMicro && kept.note === entry.note && Math.abs(kept.createdAt - entry.createdAt) <= CREDIT_KEY_DAYS * DAY_MS;
}
