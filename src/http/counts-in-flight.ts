/**
 * Token counts in flight on this instance, per account. A count holds no concurrency slot
 * (CONTRACT section 8), and its body is bounded by bytes, not by number: without this, one key
 * could send thousands of small counts to a slow provider and fill its origin's 256 count
 * connections, and every other account's counts (and the calls counted before they go up:
 * files, stored contexts) would wait behind them until they timed out (found in review).
 */
export const MAX_COUNTS_PER_ACCOUNT = 32;

export class CountsInFlight {
  private readonly byAccount = new Map<string, number>();

  /** Takes one for `account`; false (nothing taken) when it has MAX_COUNTS_PER_ACCOUNT already. */
  take(account: string): boolean {
    const mine = this.byAccount.get(account) ?? 0;
    if (mine >= MAX_COUNTS_PER_ACCOUNT) return false;
    this.byAccount.set(account, mine + 1);
    return true;
  }

  give(account: string): void {
    const left = (this.byAccount.get(account) ?? 0) - 1;
    if (left > 0) this.byAccount.set(account, left);
    else this.byAccount.delete(account);
  }

  /** Counts in flight now, in all: for tests. */
  get held(): number {
    let n = 0;
    for (const v of this.byAccount.values()) n += v;
    return n;
  }
}
