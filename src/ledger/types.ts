/** One line of an account's money history. Amounts are micro-dollars; a charge is negative. */
export interface LedgerEntry {
  readonly id: string;
  readonly type: 'charge' | 'credit';
  readonly accountId: string;
  readonly keyId: string | null;
  readonly amountMicro: number;
  /** Balance after this entry; null for a postpaid account. */
  readonly balanceAfterMicro: number | null;
  /** Epoch milliseconds. */
  readonly createdAt: number;
  readonly requestId: string | null;
  readonly model: string | null;
  readonly inputTokens: number;
  readonly outputTokens: number;
  /** True when the charge could not use the provider's usage (client gone, stream cut). */
  readonly estimated: boolean;
  readonly note: string | null;
}

/**
 * The record of every charge and credit. The limiter holds the live money state (today's
 * spend, balances); the ledger holds history and, on restart, rebuilds that state.
 */
export interface Ledger {
  /** Whether the account has any entry yet (its one-time initial credit is given otherwise). */
  knowsAccount(accountId: string): boolean;
  /** Records an entry; a promise means "durable when it resolves". */
  append(entry: LedgerEntry): void | Promise<void>;
  /** The account's entries, oldest first. */
  entries(accountId: string): readonly LedgerEntry[];
  close(): void | Promise<void>;
}
