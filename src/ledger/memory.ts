import { GatewayError } from '../errors.js';
import { LedgerBook } from './book.js';
import type { AccountTotals, GroupBy, HistoryPage, Ledger, LedgerEntry, UsageRow } from './types.js';

/** A ledger that lives as long as the process: for the demo, tests and stateless deployments. */
export class MemoryLedger implements Ledger {
  private readonly book = new LedgerBook();
  /** Billing history (charges and credits) per account, oldest first. */
  private readonly billing = new Map<string, LedgerEntry[]>();

  append(entry: LedgerEntry): void {
    this.book.apply(entry);
    if (entry.type === 'usage') return;
    let list = this.billing.get(entry.accountId);
    if (list === undefined) {
      list = [];
      this.billing.set(entry.accountId, list);
    }
    list.push(entry);
  }

  totals(): ReadonlyMap<string, AccountTotals> {
    return this.book.totals;
  }

  /** The cursor is the position of the last entry returned: stable while new entries arrive. */
  history(accountId: string, limit: number, after: string | null): HistoryPage {
    const list = this.billing.get(accountId) ?? [];
    let end = list.length;
    if (after !== null) {
      if (!/^m\d+$/.test(after) || Number(after.slice(1)) > list.length) {
        throw new GatewayError('invalid_request', { message: 'The cursor "after" is not valid.', fields: { param: 'after' } });
      }
      end = Number(after.slice(1));
    }
    const start = Math.max(0, end - limit);
    const entries = list.slice(start, end).reverse();
    return { entries, hasMore: start > 0, nextCursor: start > 0 ? `m${start}` : null };
  }

  usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): UsageRow[] {
    return this.book.usage(accountId, startDay, endDay, groupBy);
  }

  /** Every billing entry of an account, oldest first (tests). */
  entries(accountId: string): readonly LedgerEntry[] {
    return this.billing.get(accountId) ?? [];
  }

  ready(): boolean {
    return true;
  }

  close(): void {}
}
