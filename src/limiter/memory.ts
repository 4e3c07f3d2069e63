import { DAY_MS, nextUtcMidnight, type Clock } from '../clock.js';
import { CREDIT_KEY_DAYS } from '../ledger/book.js';
import { addMicro } from '../money.js';
import { checkAdmission, checkCost, checkCredit, checkEstimate, checkRestore } from './guard.js';
import {
  Rejection, type AccountLimits, type AccountSnapshot, type Decision, type InstantDecision, type KeyLimits, type Limiter,
  type Settlement, type Ticket,
} from './types.js';
import { SlidingWindow } from './window.js';

/** RPM window and in-flight count of one account or one key. */
class RateState {
  window: SlidingWindow | null = null;
  inFlight = 0;
}

/** Today's spend, in-flight reservations and prepaid balance of one account. */
class MoneyState {
  day = 0;
  spentMicro = 0;
  reservedMicro = 0;
  balanceMicro = 0;
}

class MemoryTicket implements Ticket {
  readonly ok = true as const;
  settled = false;
  released = false;
  constructor(
    readonly accountId: string,
    readonly account: RateState,
    readonly key: RateState | null,
    readonly money: MoneyState | null,
    readonly prepaid: boolean,
    readonly idempotencyId: string | null,
    public reservedMicro: number,
  ) {}
}

const ADMITTED: InstantDecision = Object.freeze({ ok: true as const });
const NOTHING_SETTLED: Settlement = Object.freeze({ balanceAfterMicro: null });
const CONCURRENCY_RETRY_MS = 1000;

/**
 * Walks a map a few entries at a time and drops idle ones: memory returns after traffic
 * stops without a timer per key (state also expires on access).
 */
class Sweeper<V> {
  private cursor: Iterator<[string, V]> | null = null;
  constructor(private readonly map: Map<string, V>, private readonly idle: (value: V, now: number) => boolean) {}

  step(now: number, budget: number): void {
    for (let i = 0; i < budget; i++) {
      if (this.cursor === null) this.cursor = this.map.entries();
      const next = this.cursor.next();
      if (next.done === true) {
        this.cursor = null;
        return;
      }
      if (this.idle(next.value[1], now)) this.map.delete(next.value[0]);
    }
  }
}

const rateIdle = (s: RateState, now: number) => s.inFlight === 0 && (s.window === null || s.window.idle(now));
const moneyIdle = (s: MoneyState, now: number) =>
  s.reservedMicro === 0 && s.balanceMicro === 0 && (s.spentMicro === 0 || s.day < Math.floor(now / DAY_MS));

/**
 * Why a call reserving `estimateMicro` more is refused, given the reservations `reservedMicro`,
 * or null. A cap is "reached", not predicted: the call's own estimate is not added.
 */
function moneyRefusal(
  account: Pick<AccountLimits, 'dailyCapMicro' | 'prepaid'>, money: MoneyState, reservedMicro: number, estimateMicro: number, now: number,
): Rejection | null {
  if (account.dailyCapMicro !== null && money.spentMicro + reservedMicro >= account.dailyCapMicro) {
    return new Rejection('daily_cap_exceeded', 0, nextUtcMidnight(now));
  }
  if (account.prepaid && money.balanceMicro - reservedMicro <= 0) return new Rejection('insufficient_balance', 0);
  // Reservations stay a safe integer: a sum past 2^53 (thousands of calls of a million
  // dollars each, which no real traffic reaches) is refused rather than rounded.
  if (reservedMicro + estimateMicro > Number.MAX_SAFE_INTEGER) {
    return account.dailyCapMicro !== null ? new Rejection('daily_cap_exceeded', 0, nextUtcMidnight(now)) : new Rejection('insufficient_balance', 0);
  }
  return null;
}

/**
 * The in-process limiter: every decision synchronous and O(1), time from an injected clock.
 * Memory is bounded by active accounts and keys (idle ones are swept) plus prepaid balances.
 */
export class MemoryLimiter implements Limiter {
  private readonly accounts = new Map<string, RateState>();
  private readonly keys = new Map<string, RateState>();
  private readonly money = new Map<string, MoneyState>();
  /** Accounts whose initial credit is given (here, or before a restart by the ledger). */
  private readonly credited = new Set<string>();
  /** `account \n credit id` of the admin credits applied (here, or in a balance restored from the ledger) -> when: each once. */
  private readonly appliedCredits = new Map<string, number>();
  readonly restoresFromLedger = true;
  /** `accountId \n Idempotency-Key` of requests still executing. */
  private readonly inFlightIds = new Set<string>();
  private readonly sweepAccounts = new Sweeper(this.accounts, rateIdle);
  private readonly sweepKeys = new Sweeper(this.keys, rateIdle);
  private readonly sweepMoney = new Sweeper(this.money, moneyIdle);
  private admissions = 0;

  private readonly sweepTimer: NodeJS.Timeout;

  /**
   * @param sweepIntervalMs how often idle state is also swept without traffic (one timer for
   *   the whole limiter, not one per key), so memory returns after the windows of idle accounts pass.
   */
  constructor(private readonly clock: Clock, sweepIntervalMs = 5000) {
    this.sweepTimer = setInterval(() => this.sweepIdle(4096), sweepIntervalMs);
    this.sweepTimer.unref();
  }

  /** Looks at up to `budget` entries of each map and drops the idle ones. */
  sweepIdle(budget: number): void {
    const now = this.clock.now();
    this.sweepAccounts.step(now, budget);
    this.sweepKeys.step(now, budget);
    this.sweepMoney.step(now, budget);
  }

  admit(account: AccountLimits, key: KeyLimits, idempotencyKey: string | null, estimateMicro: number | null): Decision {
    checkAdmission(account, key, estimateMicro);
    const now = this.clock.now();
    this.sweep(now);
    const idempotencyId = idempotencyKey === null ? null : `${account.id}\n${idempotencyKey}`;
    if (idempotencyId !== null && this.inFlightIds.has(idempotencyId)) return new Rejection('idempotency_conflict', 0);

    let money: MoneyState | null = null;
    if (estimateMicro !== null) {
      money = this.moneyOf(account.id, now);
      const refused = moneyRefusal(account, money, money.reservedMicro, estimateMicro, now);
      if (refused !== null) return refused;
    }

    const a = this.rateOf(this.accounts, account.id);
    const k = key.rpm !== null || key.concurrency !== null ? this.rateOf(this.keys, key.id) : null;
    const denial = checkRate(now, account, a, key, k);
    if (denial !== null) return denial;

    // Every check passed: only now take anything.
    if (account.rpm !== null) a.window!.record(now);
    a.inFlight++;
    if (k !== null) {
      if (key.rpm !== null) k.window!.record(now);
      k.inFlight++;
    }
    if (idempotencyId !== null) this.inFlightIds.add(idempotencyId);
    const reserved = estimateMicro ?? 0;
    if (money !== null) money.reservedMicro += reserved;
    return new MemoryTicket(account.id, a, k, money, account.prepaid, idempotencyId, reserved);
  }

  admitInstant(account: AccountLimits, key: KeyLimits, idempotencyKey: string | null): InstantDecision {
    checkAdmission(account, key, null);
    const now = this.clock.now();
    this.sweep(now);
    if (idempotencyKey !== null && this.inFlightIds.has(`${account.id}\n${idempotencyKey}`)) {
      return new Rejection('idempotency_conflict', 0);
    }
    const a = this.rateOf(this.accounts, account.id);
    const k = key.rpm !== null || key.concurrency !== null ? this.rateOf(this.keys, key.id) : null;
    const denial = checkRate(now, account, a, key, k);
    if (denial !== null) return denial;
    if (account.rpm !== null) a.window!.record(now);
    if (k !== null && key.rpm !== null) k.window!.record(now);
    return ADMITTED;
  }

  raise(ticket: Ticket, account: AccountLimits, estimateMicro: number): Rejection | null {
    checkEstimate(estimateMicro);
    const t = ticket as MemoryTicket;
    if (t.settled || t.money === null || estimateMicro <= t.reservedMicro) return null;
    const now = this.clock.now();
    // Reservations are the ticket's own state's (as settle and release use), spend and balance today's.
    const others = t.money.reservedMicro - t.reservedMicro;
    const refused = moneyRefusal({ dailyCapMicro: account.dailyCapMicro, prepaid: t.prepaid }, this.moneyOf(t.accountId, now), others, estimateMicro, now);
    if (refused !== null) return refused;
    t.money.reservedMicro = others + estimateMicro;
    t.reservedMicro = estimateMicro;
    return null;
  }

  settle(ticket: Ticket, costMicro: number): Settlement {
    checkCost(costMicro);
    const t = ticket as MemoryTicket;
    if (t.settled) return NOTHING_SETTLED;
    t.settled = true;
    if (t.money !== null) t.money.reservedMicro -= t.reservedMicro;
    if (costMicro === 0 && !t.prepaid) return { balanceAfterMicro: null };
    // Spend counts on the UTC day it settles; the state may have rolled over since admission.
    const money = this.moneyOf(t.accountId, this.clock.now());
    money.spentMicro = addMicro(money.spentMicro, costMicro);
    if (!t.prepaid) return { balanceAfterMicro: null };
    money.balanceMicro = addMicro(money.balanceMicro, -costMicro);
    return { balanceAfterMicro: money.balanceMicro };
  }

  release(ticket: Ticket): void {
    const t = ticket as MemoryTicket;
    if (t.released) return;
    t.released = true;
    if (!t.settled) {
      t.settled = true;
      if (t.money !== null) t.money.reservedMicro -= t.reservedMicro;
    }
    t.account.inFlight--;
    if (t.key !== null) t.key.inFlight--;
    if (t.idempotencyId !== null) this.inFlightIds.delete(t.idempotencyId);
  }

  restore(accountId: string, balanceMicro: number, day: number, spentMicro: number, credited: boolean, credits: ReadonlyArray<readonly [string, number]> = []): void {
    checkRestore(balanceMicro, day, spentMicro);
    const now = this.clock.now();
    const money = this.moneyOf(accountId, now);
    money.balanceMicro = balanceMicro;
    // A later day than the clock's (charges made while it was ahead): kept, as the day only moves forward.
    if (day >= money.day) {
      money.day = day;
      money.spentMicro = spentMicro;
    }
    if (credited) this.credited.add(accountId);
    for (const [id, at] of credits) this.appliedCredits.set(`${accountId}\n${id}`, at);
  }

  creditOnce(accountId: string, amountMicro: number, _attempt?: string): number | null {
    if (amountMicro !== 0) checkCredit(amountMicro);
    if (this.credited.has(accountId)) return null;
    this.credited.add(accountId);
    const money = this.moneyOf(accountId, this.clock.now());
    money.balanceMicro = addMicro(money.balanceMicro, amountMicro);
    return money.balanceMicro;
  }

  credit(accountId: string, amountMicro: number, creditId: string, formerId?: string): number {
    checkCredit(amountMicro);
    const now = this.clock.now();
    const money = this.moneyOf(accountId, now);
    // Per account, as Redis keeps them: two accounts' credits may share an Idempotency-Key. For
    // as long as the ledger remembers a credit's key (from its time): a key used again later is
    // a new credit.
    const since = now - CREDIT_KEY_DAYS * DAY_MS;
    const applied = `${accountId}\n${creditId}`;
    const former = formerId === undefined ? undefined : this.appliedCredits.get(`${accountId}\n${formerId}`);
    if ((this.appliedCredits.get(applied) ?? -Infinity) >= since || (former ?? -Infinity) >= since) return money.balanceMicro;
    this.appliedCredits.delete(applied); // re-inserted last: the map stays in time order
    this.appliedCredits.set(applied, now);
    for (const [id, at] of this.appliedCredits) {
      if (at >= since) break;
      this.appliedCredits.delete(id);
    }
    money.balanceMicro = addMicro(money.balanceMicro, amountMicro);
    return money.balanceMicro;
  }

  snapshot(account: AccountLimits): AccountSnapshot {
    const now = this.clock.now();
    const money = this.money.get(account.id);
    const today = Math.floor(now / DAY_MS);
    return {
      balanceMicro: account.prepaid ? (money?.balanceMicro ?? 0) : null,
      spentTodayMicro: money !== undefined && money.day >= today ? money.spentMicro : 0,
      reservedMicro: money?.reservedMicro ?? 0,
      inFlight: this.accounts.get(account.id)?.inFlight ?? 0,
      resetsAtMs: nextUtcMidnight(now),
    };
  }

  ready(): boolean {
    return true;
  }

  close(): void {
    clearInterval(this.sweepTimer);
  }

  /** Sizes of the internal maps (for tests and metrics: they must not grow without bound). */
  sizes(): { accounts: number; keys: number; money: number; idempotency: number } {
    return { accounts: this.accounts.size, keys: this.keys.size, money: this.money.size, idempotency: this.inFlightIds.size };
  }

  /** Every 32nd admission looks at a few dozen entries: about two per admission, amortised. */
  private sweep(now: number): void {
    if ((++this.admissions & 31) !== 0) return;
    this.sweepAccounts.step(now, 32);
    this.sweepKeys.step(now, 16);
    this.sweepMoney.step(now, 16);
  }

  private rateOf(map: Map<string, RateState>, id: string): RateState {
    let state = map.get(id);
    if (state === undefined) {
      state = new RateState();
      map.set(id, state);
    }
    return state;
  }

  private moneyOf(accountId: string, now: number): MoneyState {
    const day = Math.floor(now / DAY_MS);
    let state = this.money.get(accountId);
    if (state === undefined) {
      state = new MoneyState();
      state.day = day;
      this.money.set(accountId, state);
    } else if (state.day < day) {
      state.day = day; // expire on access: a new UTC day starts with no spend
      state.spentMicro = 0;
    } // A clock stepped back across 00:00 keeps the later day and its spend (forgetting it would lift the cap).
    return state;
  }
}

/** The RPM and concurrency checks for an account and (if it has limits) its key. Nothing is taken. */
function checkRate(now: number, account: AccountLimits, a: RateState, key: KeyLimits, k: RateState | null): Rejection | null {
  let wait = 0;
  if (account.rpm !== null) wait = (a.window ??= new SlidingWindow()).waitMs(now, account.rpm);
  if (k !== null && key.rpm !== null) wait = Math.max(wait, (k.window ??= new SlidingWindow()).waitMs(now, key.rpm));
  if (wait > 0) return new Rejection('rate_limit_exceeded', wait);
  if ((account.concurrency !== null && a.inFlight >= account.concurrency) ||
      (k !== null && key.concurrency !== null && k.inFlight >= key.concurrency)) {
    return new Rejection('concurrency_limit_exceeded', CONCURRENCY_RETRY_MS);
  }
  return null;
}
