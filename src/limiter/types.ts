import type { Limit } from '../config/types.js';

/** What the engine needs to know of an account: ids and limits only, nothing of HTTP. */
export interface AccountLimits {
  readonly id: string;
  readonly rpm: Limit;
  readonly concurrency: Limit;
  readonly dailyCapMicro: Limit;
  readonly prepaid: boolean;
}

/** Per-key limits, counted in addition to the account's. */
export interface KeyLimits {
  readonly id: string;
  readonly rpm: Limit;
  readonly concurrency: Limit;
}

export type RejectReason =
  | 'idempotency_conflict'
  | 'daily_cap_exceeded'
  | 'insufficient_balance'
  | 'rate_limit_exceeded'
  | 'concurrency_limit_exceeded';

/** A denial is a value, not an exception (faults of a store are exceptions and map to 503). */
export class Rejection {
  readonly ok = false as const;
  constructor(
    readonly reason: RejectReason,
    /** The honest wait before a retry can succeed; 0 when waiting does not help. */
    readonly retryAfterMs: number,
    /** For `daily_cap_exceeded`: when the cap resets (next 00:00 UTC), epoch ms. */
    readonly resetsAtMs: number = 0,
  ) {}
}

/**
 * A held admission: a concurrency slot and idempotency key (given back by `release`) and a
 * spend reservation (turned into a charge by `settle`). Each happens once per ticket.
 */
export interface Ticket {
  readonly ok: true;
  readonly accountId: string;
  readonly reservedMicro: number;
  /** Admitted as prepaid: its charge is taken from the balance. */
  readonly prepaid: boolean;
}

export type Decision = Ticket | Rejection;

/** An instant admission (the request completes synchronously): counted, nothing held. */
export type InstantDecision = { readonly ok: true } | Rejection;

export interface Settlement {
  /** The account's balance after the charge; null for a postpaid account. */
  readonly balanceAfterMicro: number | null;
}

export interface AccountSnapshot {
  readonly balanceMicro: number | null;
  readonly spentTodayMicro: number;
  readonly reservedMicro: number;
  readonly inFlight: number;
  /** Start of the next UTC day in the store's clock, epoch ms. */
  readonly resetsAtMs: number;
}

type MaybeAsync<T> = T | Promise<T>;

/**
 * The limiter: every admission decision and the money state it needs (today's spend,
 * reservations, prepaid balances). The memory store answers synchronously; a remote store
 * (Redis) answers with one round trip per call. Checks run in the contract's order:
 * idempotency, daily cap, balance, RPM, concurrency; a rejection consumes nothing.
 */
export interface Limiter {
  /**
   * Admits a request that holds resources until `release`: a concurrency slot, its
   * idempotency key, and (when `estimateMicro` is not null: a billable call) a reservation
   * until `settle`.
   */
  admit(account: AccountLimits, key: KeyLimits, idempotencyKey: string | null, estimateMicro: number | null): MaybeAsync<Decision>;
  /**
   * Admits a request that completes synchronously: the same checks minus money, counted
   * toward RPM, holding nothing afterwards (equivalent to admit then release at once).
   */
  admitInstant(account: AccountLimits, key: KeyLimits, idempotencyKey: string | null): MaybeAsync<InstantDecision>;
  /**
   * Raises the ticket's reservation to `estimateMicro` once the provider counted the call's
   * input above its estimate (a file, a stored context), before the call is sent: the cap and
   * balance are checked again as at admission, with the others' reservations (the raised ones
   * of calls counted meanwhile included) and not its own. A rejection changes nothing (the
   * call is then refused, free); an estimate not above the reservation, or a ticket settled or
   * released, changes nothing and is no rejection.
   */
  raise(ticket: Ticket, account: AccountLimits, estimateMicro: number): MaybeAsync<Rejection | null>;
  /**
   * Replaces the ticket's reservation with the real charge `costMicro` (today's spend and,
   * if prepaid, the balance). Done before the answer's final bytes, so the next request sees
   * it. Only the first call per ticket counts (a later one, or one after `release`, charges
   * nothing and answers a null balance). Settling is not releasing: the slot and the
   * idempotency key stay held until `release`.
   */
  settle(ticket: Ticket, costMicro: number): MaybeAsync<Settlement>;
  /**
   * Gives back the slot and idempotency key (and any reservation not settled: a call released
   * unsettled is charged nothing). Done when the response is closed. Idempotent.
   */
  release(ticket: Ticket): void;
  /**
   * True when the store's money state is rebuilt from the ledger at start (`restore`); false
   * for a shared store that keeps its own (which then ignores `restore`).
   */
  readonly restoresFromLedger: boolean;
  /**
   * Seeds an account's money state from the ledger at start-up: its prepaid balance (credits
   * and the charges made while prepaid), its spend on UTC day `day`, whether it was ever
   * credited (its one-time initial credit is then not given again), and the `credit` ids of the
   * recent admin credits that balance includes, with their times (not to be applied again).
   */
  restore(accountId: string, balanceMicro: number, day: number, spentMicro: number, credited: boolean, credits?: ReadonlyArray<readonly [string, number]>): void;
  /**
   * Adds prepaid credit to an account, once per `creditId` (remembered for CREDIT_KEY_DAYS: a
   * repeat of a credit whose first answer was lost makes it live, once), or not at all when it
   * was applied under `formerId` (the name an older version gave it); resolves to the balance
   * after.
   */
  credit(accountId: string, amountMicro: number, creditId: string, formerId?: string): MaybeAsync<number>;
  /**
   * The one-time initial credit of a prepaid account: given only if the account was never
   * credited (or restored) before; resolves to the balance after, or null when not given.
   * `attempt` names one attempt: its retry (after a timeout that hid a success) is answered
   * as given, so the credit is recorded; any other attempt gets null.
   */
  creditOnce(accountId: string, amountMicro: number, attempt?: string): MaybeAsync<number | null>;
  snapshot(account: AccountLimits): MaybeAsync<AccountSnapshot>;
  /** Whether the store can make decisions now (for /readyz). */
  ready(): boolean;
  close(): MaybeAsync<void>;
}
