import type { Ledger, LedgerEntry } from './types.js';

/** A ledger that lives as long as the process: for the demo, tests and stateless deployments. */
export class MemoryLedger implements Ledger {
  private readonly byAccount = new Map<string, LedgerEntry[]>();

  knowsAccount(accountId: string): boolean {
    return this.byAccount.has(accountId);
  }

  append(entry: LedgerEntry): void {
    let list = this.byAccount.get(entry.accountId);
    if (list === undefined) {
      list = [];
      this.byAccount.set(entry.accountId, list);
    }
    list.push(entry);
  }

  entries(accountId: string): readonly LedgerEntry[] {
    return this.byAccount.get(accountId) ?? [];
  }

  close(): void {}
}
