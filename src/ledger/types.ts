/**
 * One line of an account's money history. Amounts are micro-dollars; a charge is negative.
 * `usage` records a call of a free model: it counts in usage, not in billing history.
 */
export interface LedgerEntry {
  readonly id: string;
  readonly type: 'charge' | 'credit' | 'usage';
  readonly accountId: string;
  readonly keyId: string | null;
  readonly amountMicro: number;
  /** Balance after this entry; null for a postpaid account, or when it is not known (below). */
  readonly balanceAfterMicro: number | null;
  /**
   * A prepaid charge whose balance after it is not known: the limiter's store did not confirm
   * its settlement (a Redis limiter sends it again). It is taken from the balance all the same.
   */
  readonly balanceUnknown: boolean;
  /** Epoch milliseconds. */
  readonly createdAt: number;
  readonly requestId: string | null;
  readonly model: string | null;
  readonly inputTokens: number;
  readonly outputTokens: number;
  /** True when the charge could not use the provider's usage (client gone, stream cut). */
  readonly estimated: boolean;
  readonly note: string | null;
  /** A credit's `Idempotency-Key` (admin credits), so a repeat finds it; null otherwise. */
  readonly idempotencyKey: string | null;
  /** A call's deployment: the provider id that served it (CONTRACT section 10); null for credits. */
  readonly deployment: string | null;
}

/** An account's money state as the ledger knows it (rebuilt on restart). */
export interface AccountTotals {
  /** The prepaid balance: credits, less the charges made while the account was prepaid. */
  balanceMicro: number;
  /** UTC day number (epoch ms / 86 400 000) that `spentMicro` belongs to. */
  day: number;
  /** Charges of that day. */
  spentMicro: number;
  /** Whether the account was ever credited (its one-time initial credit is then not given again). */
  credited: boolean;
}

export interface HistoryPage {
  entries: LedgerEntry[];
  hasMore: boolean;
  /** Pass as `after` for the next (older) page; null when there is none. */
  nextCursor: string | null;
}

export type GroupBy = 'day' | 'model' | 'key';

export interface UsageRow {
  date: string | null;
  model: string | null;
  keyId: string | null;
  requests: number;
  inputTokens: number;
  outputTokens: number;
  costMicro: number;
}

/**
 * The record of every charge, credit and call. The limiter holds the live money state
 * (today's spend, balances); the ledger holds history and, on restart, rebuilds that state.
 */
export interface Ledger {
  /** Records an entry; a promise means "durable when it resolves". Ordering is preserved. */
  append(entry: LedgerEntry): void | Promise<void>;
  /** Balances and day totals of every account with entries, as of the last durable entry. */
  totals(): ReadonlyMap<string, AccountTotals>;
  /** Billing history (charges and credits), newest first. Throws GatewayError on a bad cursor. */
  history(accountId: string, limit: number, after: string | null): HistoryPage | Promise<HistoryPage>;
  /** Usage between two UTC days (inclusive, day numbers), grouped. */
  usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): UsageRow[] | Promise<UsageRow[]>;
  /**
   * The durable admin credit of an account with this `Idempotency-Key` (kept CREDIT_KEY_DAYS
   * days; for ever by a shared ledger, where the key is unique), if any.
   */
  creditByKey(accountId: string, idempotencyKey: string): LedgerEntry | undefined | Promise<LedgerEntry | undefined>;
  /** The durable admin credits of the last CREDIT_KEY_DAYS days, oldest first. */
  recentCredits(): Iterable<LedgerEntry>;
  /** Whether the ledger can record (a failing disk makes the gateway not ready). */
  ready(): boolean;
  /** Flushes and closes. */
  close(): void | Promise<void>;
}
