import { randomBytes } from 'node:crypto';

/** Ledger entry ids: a random per-process prefix plus a counter, unique across instances and restarts. */
const ENTRY_PREFIX = `txn_${randomBytes(5).toString('hex')}`;
let entryCounter = 0;

export function newEntryId(): string {
  return `${ENTRY_PREFIX}${(++entryCounter).toString(36).padStart(5, '0')}`;
}
