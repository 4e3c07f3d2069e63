import { GatewayError } from '../errors.js';
import { LedgerBook } from './book.js';
import type { AccountTotals, GroupBy, HistoryPage, Ledger, LedgerEntry, UsageRow } from './types.js';

/** Billing entries kept per account; the oldest go first, in batches of a quarter of this. */
export const MEMORY_HISTORY_PER_ACCOUNT = 10_000;

/** One account's most recent billing entries, oldest first; `dropped` older ones are gone. */
interface Kept {
  entries: LedgerEntry[];
  dropped: number;
}

/**
 * A ledger that lives as long as the process: for the demo, tests and stateless deployments.
 * Balances and usage totals are exact; billing history keeps each account's latest
 * MEMORY_HISTORY_PER_ACCOUNT entries (up to a quarter more between trims), so memory does not
 * grow with traffic. The file ledger keeps all of it.
 */
export class MemoryLedger implements Ledger {
  private readonly book = new LedgerBook();
  private readonly billing = new Map<string, Kept>();

  constructor(private readonly keepPerAccount = MEMORY_HISTORY_PER_ACCOUNT) {}

  append(entry: LedgerEntry): void {
    this.book.apply(entry);
    if (entry.type === 'usage') return;
    let kept = this.billing.get(entry.accountId);
    if (kept === undefined) {
      kept = { entries: [], dropped: 0 };
      this.billing.set(entry.accountId, kept);
    }
    kept.entries.push(entry);
    const excess = kept.entries.length - this.keepPerAccount;
    if (excess >= Math.max(1, this.keepPerAccount >> 2)) {
      kept.entries.splice(0, excess); // in batches, so trimming costs O(1) per entry
      kept.dropped += excess;
    }
  }

  totals(): ReadonlyMap<string, AccountTotals> {
    return this.book.totals;
  }

  /**
   * The cursor is the position (counted from the account's first entry ever) of the last entry
   * returned: stable while new entries arrive and old ones are trimmed.
   */
  history(accountId: string, limit: number, after: string | null): HistoryPage {
    const { entries: list, dropped } = this.billing.get(accountId) ?? { entries: [], dropped: 0 };
    let end = dropped + list.length;
    if (after !== null) {
      if (!/^m\d+$/.test(after) || Number(after.slice(1)) > end) {
        throw new GatewayError('invalid_request', { message: 'The cursor "after" is not valid.', fields: { param: 'after' } });
      }
      end = Number(after.slice(1));
    }
    const start = Math.max(dropped, end - limit);
    const entries = list.slice(Math.max(0, start - dropped), Math.max(0, end - dropped)).reverse();
    return { entries, hasMore: start > dropped, nextCursor: start > dropped ? `m${start}` : null };
  }

  usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): UsageRow[] {
    return this.book.usage(accountId, startDay, endDay, groupBy);
  }

  creditByKey(accountId: string, idempotencyKey: string): LedgerEntry | undefined {
    return this.book.creditByKey(accountId, idempotencyKey);
  }

  recentCredits(): Iterable<LedgerEntry> {
    return this.book.recentCredits();
  }

  /** Every billing entry of an account, oldest first (tests). */
  entries(accountId: string): readonly LedgerEntry[] {
    return this.billing.get(accountId)?.entries ?? [];
  }

  ready(): boolean {
    return true;
  }

  close(): void {}
}
