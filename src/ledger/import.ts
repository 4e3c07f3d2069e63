import type { Logger } from '../log.js';
import { FileLedger } from './file.js';
import type { Ledger } from './types.js';

/** Entries sent to the target at once (its group commit takes them in one statement or a few). */
const BATCH = 500;

export interface ImportResult {
  /** Entries the target took (an entry it already had counts: it keeps it once). */
  imported: number;
  /** Entries the target refused (each logged). */
  refused: number;
}

/**
 * Copies the books of a file ledger (its directory, locked meanwhile: no gateway may be running
 * on it) into another ledger, oldest entry first. The target keeps each entry once by its id, and
 * one admin credit per account and Idempotency-Key, so running it again, or importing the file
 * ledgers of several instances that each recorded the same credit, counts everything once.
 */
export async function importFileLedger(dir: string, target: Ledger, logger: Logger): Promise<ImportResult> {
  const source = await FileLedger.open(dir, { logger });
  const result: ImportResult = { imported: 0, refused: 0 };
  try {
    let batch: Promise<void>[] = [];
    const send = async () => {
      for (const outcome of await Promise.allSettled(batch)) {
        if (outcome.status === 'fulfilled') result.imported++;
        else result.refused++;
      }
      batch = [];
    };
    for (const entry of source.entries()) {
      let appended: void | Promise<void>;
      try {
        appended = target.append(entry);
      } catch (err) {
        appended = Promise.reject(err);
      }
      batch.push(Promise.resolve(appended).catch((err: unknown) => {
        logger.error('import: the target refused an entry', { entry_id: entry.id, account_id: entry.accountId, error: String(err) });
        throw err;
      }));
      if (batch.length >= BATCH) await send();
    }
    await send();
  } finally {
    await source.close();
  }
  return result;
}
