import { createHash, randomBytes } from 'node:crypto';
import type { RedisClientType } from 'redis';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { AccountTotals } from '../ledger/types.js';
import { checkAdmission, checkCost, checkCredit, checkEstimate } from './guard.js';
import { BatchQueue, type BatchOp } from './redis-batch.js';
import { BATCH, BATCH_LIBRARY, batchFunction, CREDIT, RENEW, RESTORE, SNAPSHOT } from './redis-scripts.js';
import {
  Rejection, type AccountLimits, type AccountSnapshot, type Decision, type InstantDecision, type KeyLimits, type Limiter,
  type RejectReason, type Settlement, type Ticket,
} from './types.js';

export interface RedisLimiterOptions {
  url: string;
  prefix: string;
  /** A command that takes longer fails the request with 503 (fail-closed). */
  timeoutMs: number;
  /** How long slots, reservations and idempotency keys outlive an instance that died. */
  leaseMs?: number;
  logger?: Logger;
  /**
   * With a shared ledger (PostgreSQL): an account's money as the ledger has it now. Redis then
   * rebuilds an account's money from it when it does not have it (after a restart without
   * persistence), once, before any script changes it.
   */
  money?: (accountId: string) => Promise<LedgerMoney>;
}

/** An account's money as a shared ledger has it, with the markers of the admin credits it holds (as `credit` names them). */
export interface LedgerMoney extends AccountTotals {
  creditIds: string[];
}

class RedisTicket implements Ticket {
  readonly ok = true as const;
  settled = false;
  released = false;
  /** Its settlement was applied, and gave the reservation back: the release need not look for it. */
  givenBack = false;
  /** When its release was first kept for a connection that was down (Date.now()), or 0. */
  unsentSince = 0;
  /**
   * A charge Redis has not confirmed yet (its settlement's answer is still out, was lost, or it
   * could not be sent), or 0. Until it is confirmed the ticket stays live (its leases renewed) and
   * its release waits: see settle.
   */
  owed = 0;
  /** Its last settlement failed without an answer: sent again (as 'S') at the next chance. */
  resend = false;
  /** Its latest settlement, settled once its outcome is handled (close waits for it). */
  attempt: Promise<void> | null = null;
  /**
   * A raise of its reservation was sent: its settlement and release then have Redis look the
   * amount up (-1), as the raise's answer may come after them, or never.
   */
  raised = false;
  constructor(
    readonly id: string,
    readonly accountId: string,
    readonly keyId: string | null,
    readonly idempotencyKey: string | null,
    readonly prepaid: boolean,
    public reservedMicro: number,
  ) {}

  /** What its settlement or release gives back: the amount, or -1 for Redis to look it up. */
  get reservedArg(): string {
    return this.raised ? '-1' : String(this.reservedMicro);
  }
}

const ADMITTED: InstantDecision = Object.freeze({ ok: true as const });
const NOTHING_SETTLED: Settlement = Object.freeze({ balanceAfterMicro: null });

interface Script {
  source: string;
  sha: string;
}
const script = (source: string): Script => ({ source, sha: createHash('sha1').update(source).digest('hex') });
const SCRIPTS = {
  batch: script(BATCH), renew: script(RENEW), credit: script(CREDIT), snapshot: script(SNAPSHOT), restore: script(RESTORE),
};
/** BATCH as a Redis function library, named after its code (see redis-scripts.ts). */
const BATCH_FUNCTION = batchFunction(createHash('sha1').update(BATCH_LIBRARY).digest('hex').slice(0, 16));
/**
 * FCALL refused as a command, before it ran anything: a Redis without the library (flushed), or
 * an ACL without FCALL. The call can be sent again as a script. (An error from inside the
 * function is never retried: it may have written half of the call.)
 */
const FCALL_REFUSED = /^ERR Function not found|^NOPERM.*'fcall'/i;

/**
 * Closes a client without waiting on a Redis that is away (a drain must end): when connected,
 * once what was sent has its answers, for at most `ms`; otherwise, or past that, the connection
 * is cut. (QUIT on a client that is reconnecting waited for a connection that never came.)
 */
export async function closeRedisClient(client: Pick<RedisClientType, 'isOpen' | 'isReady' | 'close' | 'destroy'>, ms: number): Promise<void> {
  if (!client.isOpen) return;
  if (!client.isReady) return client.destroy();
  let timer: NodeJS.Timeout | undefined;
  const closed = client.close().then(() => true, () => false);
  const inTime = await Promise.race([closed, new Promise<boolean>((resolve) => { timer = setTimeout(() => resolve(false), ms); })]);
  clearTimeout(timer);
  if (!inTime) client.destroy();
}

/** Loads the optional `redis` package only when the config asks for it. */
export function loadRedis(): typeof import('redis') {
  try {
    return require('redis') as typeof import('redis');
  } catch {
    throw new Error('limiter.store "redis" needs the "redis" package: run `npm install redis` beside the gateway');
  }
}

/**
 * The limiter shared by every gateway instance through Redis. Admissions (every check in the
 * contract's order), settlements and releases are queued per account and sent at the end of
 * the event loop's turn: one call of the BATCH script per account and turn (FCALL of it as a
 * Redis function; EVALSHA on a Redis that cannot), which runs each op as its own script would
 * (redis-batch.ts, redis-scripts.ts). Slots,
 * reservations and idempotency keys are leases renewed while a request lives, so a crashed
 * instance's holdings return by themselves within `leaseMs`. Fail-closed: no offline queue
 * (but releases, which decide nothing, are kept for the connection's return while their leases
 * last), a tight deadline per command (per batch: one for all the calls sent together), and a
 * store that does not answer is a 503 for every op waiting on it.
 */
export class RedisLimiter implements Limiter {
  private readonly client: RedisClientType;
  private readonly prefix: string;
  private readonly timeoutMs: number;
  readonly leaseMs: number;
  private readonly logger: Logger | undefined;
  /** Tickets still holding leases here: renewed together, one batch per interval. */
  private readonly live = new Set<RedisTicket>();
  private readonly renewTimer: NodeJS.Timeout;
  private readonly idPrefix = randomBytes(6).toString('hex');
  private counter = 0;
  private lastError = 0;
  readonly restoresFromLedger = false;
  private readonly money: ((accountId: string) => Promise<LedgerMoney>) | null;
  /** '1' when money is read from a shared ledger (the scripts' needsrc flag). */
  private readonly needsrc: '0' | '1';
  /** Rebuilds under way, one per account. */
  private readonly restoring = new Map<string, Promise<void>>();
  /** Releases that could not be sent (Redis away), sent when it is back (see keepUnsent). */
  private unsent: RedisTicket[] = [];
  /** Admissions, settlements and releases waiting for the end of the turn, per account. */
  private readonly batch: BatchQueue;
  /**
   * BATCH runs as a Redis function (FCALL) once its library is loaded: at every connection the
   * instance loads it (FUNCTION LOAD, before any call sent after), and runs BATCH as a script
   * (EVALSHA) until it is in, or for good on this connection when Redis refuses it.
   */
  private functions = false;
  private loading = false;

  constructor(options: RedisLimiterOptions) {
    const { createClient } = loadRedis();
    this.prefix = options.prefix;
    this.timeoutMs = options.timeoutMs;
    this.leaseMs = options.leaseMs ?? 30_000;
    this.logger = options.logger;
    this.money = options.money ?? null;
    this.needsrc = this.money === null ? '0' : '1';
    this.client = createClient({
      url: options.url,
      disableOfflineQueue: true, // never queue a decision behind an outage
      // The client's own per-command timer (an AbortSignal per command, 5 s by default) is
      // switched off: eval() below and the batch queue keep their own deadline, at timeoutMs.
      commandOptions: { timeout: 0 },
      socket: {
        connectTimeout: Math.max(options.timeoutMs, 1000),
        reconnectStrategy: (retries: number) => Math.min(50 * 2 ** retries, 1000),
      },
    }) as RedisClientType;
    this.client.on('error', (err: Error) => this.warn('redis limiter store error', err));
    this.client.on('ready', () => {
      this.loadFunctions();
      this.renewAll(); // renewals first, then the settlements owed (see renewAll)
      const unsent = this.unsent;
      this.unsent = [];
      // Past its lease a holding has freed itself: nothing is left to send for it.
      const since = Date.now() - this.leaseMs;
      for (const t of unsent) if (t.unsentSince >= since) this.sendRelease(t);
    });
    this.client.connect().catch(() => { /* reconnects by itself; requests fail closed meanwhile */ });
    this.batch = new BatchQueue((keys, ops) => this.sendBatch(keys, ops), this.timeoutMs, (cause) => {
      if (cause !== null) this.warn('redis limiter command failed', cause);
      return new GatewayError('limiter_unavailable', { retryAfterS: 1 });
    }, (message) => {
      this.warn('redis limiter command failed', new Error(message));
      const err = new GatewayError('limiter_unavailable', { retryAfterS: 1 });
      REFUSED.add(err);
      return err;
    }, () => {
      // A PING (one per turn, ~0.2 us in Redis) so that the client's write follows the flush in
      // this check phase: about 4 % more billable calls per second (5 s runs, alternated, 7 pairs).
      if (this.client.isReady) this.client.sendCommand(['PING']).catch(ignore);
    });
    this.renewTimer = setInterval(() => this.renewAll(), Math.max(100, Math.floor(this.leaseMs / 3)));
    this.renewTimer.unref();
  }

  /** Resolves once connected, and Redis answered the library's load (or rejects after `ms`): for start-up and tests. */
  async whenReady(ms: number): Promise<void> {
    const until = Date.now() + ms;
    while (!this.client.isReady || this.loading) {
      if (Date.now() > until) throw new Error('redis is not reachable');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  admit(account: AccountLimits, key: KeyLimits, idempotencyKey: string | null, estimateMicro: number | null): Promise<Decision> {
    try {
      checkAdmission(account, key, estimateMicro);
    } catch (err) {
      return Promise.reject(err);
    }
    const id = this.nextId();
    return this.run(account, key, idempotencyKey, estimateMicro, false, id).then((reason) => {
      if (reason !== null) return reason;
      const ticket = new RedisTicket(id, account.id, hasKeyLimits(key) ? key.id : null, idempotencyKey, account.prepaid, estimateMicro ?? 0);
      this.live.add(ticket);
      return ticket;
    });
  }

  admitInstant(account: AccountLimits, key: KeyLimits, idempotencyKey: string | null): Promise<InstantDecision> {
    try {
      checkAdmission(account, key, null);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.run(account, key, idempotencyKey, null, true, this.nextId()).then((reason) => reason ?? ADMITTED);
  }

  /**
   * Turns the reservation into the charge; the slot and idempotency key stay held until release.
   * A charge counts in Redis's money exactly once: when the settlement fails without Redis's
   * answer (deadline, connection lost, Redis away), the promise rejects (the call is recorded in
   * the ledger meanwhile) and the charge stays owed: a late answer confirms it, or it is sent
   * again as 'S' (which applies it only if the first did not) when Redis is back and at each
   * lease renewal, while the ticket keeps its leases and its release waits.
   */
  settle(ticket: Ticket, costMicro: number): Promise<Settlement> {
    try {
      checkCost(costMicro);
    } catch (err) {
      return Promise.reject(err);
    }
    const t = ticket as RedisTicket;
    if (t.settled || t.released) return Promise.resolve(NOTHING_SETTLED);
    t.settled = true;
    // A free call owes nothing: if its settlement is lost, the release gives the reservation back.
    t.owed = costMicro;
    return this.sendSettle(t, 's').then((balance) => ({ balanceAfterMicro: t.prepaid ? Number(balance) : null }));
  }

  /**
   * Raises the reservation after a count (see Limiter.raise), as an op of the account's batch.
   * A raise whose answer is lost fails the call (503, nothing sent upstream); either way the
   * ticket's settlement and release look the amount up, so what Redis reserved is given back.
   */
  raise(ticket: Ticket, account: AccountLimits, estimateMicro: number): Promise<Rejection | null> {
    try {
      checkEstimate(estimateMicro);
    } catch (err) {
      return Promise.reject(err);
    }
    const t = ticket as RedisTicket;
    if (t.settled || t.released || estimateMicro <= t.reservedMicro) return Promise.resolve(null);
    t.raised = true;
    const cap = account.dailyCapMicro === null ? '-1' : String(account.dailyCapMicro);
    const args = ['u', t.id, String(estimateMicro), cap, t.prepaid ? '1' : '0'];
    return this.withMoney(t.accountId, () => this.queue(t.accountId, NO_KEYS, args)).then((r) => {
      if (r !== 'ok') {
        const [reason, wait, resetsAt] = r as [string, number, number];
        return new Rejection(reason as RejectReason, Number(wait), Number(resetsAt));
      }
      // Kept for its lease renewals, which take the reservation again should the lease be lost.
      if (estimateMicro > t.reservedMicro) t.reservedMicro = estimateMicro;
      return null;
    });
  }

  private sendSettle(t: RedisTicket, kind: 's' | 'S'): Promise<unknown> {
    t.resend = false;
    const args = [kind, t.id, String(t.owed), t.prepaid ? '1' : '0', t.reservedArg];
    // An answer that comes after the deadline failed the op: applied (a balance) or not (an error, 'restore').
    const late = (reply: unknown) => {
      if (typeof reply === 'number') this.settled(t, true);
    };
    const sent = this.withMoney(t.accountId, () => this.queue(t.accountId, NO_KEYS, args, late));
    t.attempt = sent.then(() => this.settled(t, true), (err: unknown) => {
      if (t.owed === 0) return;
      if (REFUSED.has(err as Error)) {
        // Redis refused its arguments: it would refuse them again.
        this.logger?.error('redis refused a settlement; its charge is in the ledger only', { ticket: t.id, error: (err as Error).message });
        return this.settled(t, false);
      }
      t.resend = true;
    });
    return sent;
  }

  /**
   * Its charge is in Redis's money (`applied`, which gave the reservation back), or never will
   * be: a release that waited for it goes now.
   */
  private settled(t: RedisTicket, applied: boolean): void {
    if (applied) t.givenBack = true;
    if (t.owed === 0) return;
    t.owed = 0;
    t.resend = false;
    if (t.released) this.sendOrKeepRelease(t);
  }

  /** Sends again the settlements that failed without an answer (Redis back, or a lease renewal). */
  private resendSettlements(): void {
    if (!this.client.isReady) return;
    for (const t of this.live) if (t.resend) this.sendSettle(t, 'S').catch(ignore);
  }

  /** Settlements not confirmed yet, resent now: settled once each has its outcome, or after `ms`. */
  private async settleOwed(ms: number): Promise<void> {
    this.resendSettlements();
    const attempts: Promise<void>[] = [];
    for (const t of this.live) if (t.owed > 0 && t.attempt !== null) attempts.push(t.attempt);
    if (attempts.length === 0) return;
    this.batch.flushAll();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(attempts), new Promise((r) => { timer = setTimeout(r, ms); })]);
    clearTimeout(timer);
  }

  /**
   * Gives the slot and idempotency key back (and a reservation never settled). Queued after any
   * settlement of the same ticket (in the same batch, or on the same connection after it), so
   * Redis runs the two in order. One that cannot be sent (Redis away, or the connection lost
   * under it) is sent again when Redis is back, on another connection, so maybe before a
   * settlement that was lost too: harmless, as a reservation is given back only by the op that
   * removes its entry, whichever comes first.
   */
  release(ticket: Ticket): void {
    const t = ticket as RedisTicket;
    if (t.released) return;
    t.released = true;
    // After its settlement: the release must not give back a reservation the charge took.
    if (t.owed === 0) this.sendOrKeepRelease(t);
  }

  private sendOrKeepRelease(t: RedisTicket): void {
    this.live.delete(t);
    if (!this.client.isReady) return this.keepUnsent(t);
    this.sendRelease(t);
  }

  /**
   * Keeps a release for the connection's return, while its leases last (they free what it holds
   * by then anyway) and up to MAX_UNSENT of them. Sending a release again is harmless: each of its
   * steps acts only on what is still there under the ticket's own id.
   */
  private keepUnsent(t: RedisTicket): void {
    if (t.unsentSince === 0) t.unsentSince = Date.now();
    if (this.unsent.length < MAX_UNSENT) this.unsent.push(t);
  }

  private sendRelease(t: RedisTicket): void {
    const a = this.tag(t.accountId);
    const keys = t.keyId !== null ? [`${a}:ks:${t.keyId}`] : [];
    if (t.idempotencyKey !== null) keys.push(`${a}:i:${t.idempotencyKey}`);
    const kind = t.keyId !== null ? (t.idempotencyKey !== null ? 'rki' : 'rk') : t.idempotencyKey !== null ? 'ri' : 'r';
    // A settlement that answered gave the reservation back: 0 spares the script a lookup. One
    // still out, or lost, may have given it too: the script then finds nothing to give.
    const reserved = t.givenBack ? '0' : t.reservedArg;
    // Lost with the connection (or never sent): kept for its return.
    const reject = () => {
      if (!this.client.isReady) this.keepUnsent(t);
    };
    this.batch.push(t.accountId, () => this.accountKeys(a), { keys, args: [kind, t.id, reserved], resolve: ignore, reject });
  }

  restore(): void {
    // Redis holds the shared money state itself.
  }

  credit(accountId: string, amountMicro: number, creditId: string, formerId?: string): Promise<number> {
    try {
      checkCredit(amountMicro);
    } catch (err) {
      return Promise.reject(err);
    }
    const a = this.tag(accountId);
    const keys = [`${a}:m`, `${a}:c:${creditId}`];
    if (formerId !== undefined) keys.push(`${a}:c:${formerId}`);
    return this.withMoney(accountId, () => this.eval(SCRIPTS.credit, keys, [String(amountMicro), 'id', '', this.needsrc], accountId))
      .then((r) => Number((r as unknown[])[1]));
  }

  creditOnce(accountId: string, amountMicro: number, attempt = ''): Promise<number | null> {
    try {
      if (amountMicro !== 0) checkCredit(amountMicro);
    } catch (err) {
      return Promise.reject(err);
    }
    const a = this.tag(accountId);
    const token = attempt || randomBytes(8).toString('hex');
    return this.withMoney(accountId, () => this.eval(SCRIPTS.credit, [`${a}:m`, `${a}:c:`], [String(amountMicro), 'once', token, this.needsrc], accountId))
      .then((r) => ((r as unknown[])[0] === 1 ? Number((r as unknown[])[1]) : null));
  }

  snapshot(account: AccountLimits): Promise<AccountSnapshot> {
    const a = this.tag(account.id);
    return this.withMoney(account.id, () => this.eval(SCRIPTS.snapshot, [`${a}:m`, `${a}:s`, `${a}:r`, `${a}:x`], [this.needsrc], account.id)).then((r) => {
      const [bal, spent, resv, inFlight, now] = (r as unknown[]).map(Number) as [number, number, number, number, number];
      return {
        balanceMicro: account.prepaid ? bal : null, spentTodayMicro: spent, reservedMicro: resv, inFlight,
        resetsAtMs: (Math.floor(now / 86_400_000) + 1) * 86_400_000,
      };
    });
  }

  ready(): boolean {
    return this.client.isReady;
  }

  async close(): Promise<void> {
    clearInterval(this.renewTimer);
    // Charges still owed get their last chance, and the releases that waited for them go too.
    await this.settleOwed(this.timeoutMs);
    this.batch.flushAll();
    await closeRedisClient(this.client, this.timeoutMs);
    let owed = 0;
    for (const t of this.live) if (t.owed > 0) owed++;
    if (owed > 0) this.logger?.error('closed with charges redis never confirmed: they are in the ledger only', { settlements: owed });
  }

  private nextId(): string {
    return `${this.idPrefix}${(++this.counter).toString(36)}`;
  }

  private tag(accountId: string): string {
    return `${this.prefix}{${accountId}}`;
  }

  private run(
    account: AccountLimits, key: KeyLimits, idempotencyKey: string | null, estimateMicro: number | null, instant: boolean, id: string,
  ): Promise<Rejection | null> {
    const a = this.tag(account.id);
    const limited = hasKeyLimits(key);
    const k = limited ? key.id : '';
    // The BATCH script's admission: its kind names the keys that follow (k: the key's limits, i: an Idempotency-Key).
    const keys = limited ? [`${a}:kwt:${k}`, `${a}:kwn:${k}`, `${a}:ks:${k}`] : [];
    if (idempotencyKey !== null) keys.push(`${a}:i:${idempotencyKey}`);
    const kind = limited ? (idempotencyKey !== null ? 'aki' : 'ak') : idempotencyKey !== null ? 'ai' : 'a';
    const n = (v: number | null) => (v === null ? '-1' : String(v));
    const args = [
      kind, id,
      `${n(account.rpm)},${n(account.concurrency)},${n(limited ? key.rpm : null)},${n(limited ? key.concurrency : null)},${n(account.dailyCapMicro)}`,
      n(estimateMicro), `${account.prepaid ? '1' : '0'}${instant ? '1' : '0'}`,
    ];
    // Should the reply miss the deadline or be lost with the connection (the request then gets a
    // 503) and say admitted, or never come, what the admission may have taken is given back at
    // once, not when its leases run out: releasing an id Redis never admitted changes nothing.
    const late = instant ? undefined : (reply: unknown) => {
      if (reply === 'ok' || reply === undefined) this.release(new RedisTicket(id, account.id, limited ? k : null, idempotencyKey, account.prepaid, estimateMicro ?? 0));
    };
    return this.withMoney(account.id, () => this.queue(account.id, keys, args, late)).then((r) => {
      if (r === 'ok') return null;
      const [reason, wait, resetsAt] = r as [string, number, number];
      return new Rejection(reason as RejectReason, Number(wait), Number(resetsAt));
    });
  }

  /**
   * Runs a script that reads or changes an account's money; when it answers 'restore' (Redis
   * does not have the money, and a shared ledger does), rebuilds it from the ledger and runs
   * the script again.
   */
  private withMoney(accountId: string, run: () => Promise<unknown>): Promise<unknown> {
    if (this.money === null) return run();
    return run().then((r) => (isRestore(r) ? this.restoreMoney(accountId).then(run) : r)).then((r) => {
      if (isRestore(r)) throw new GatewayError('limiter_unavailable', { retryAfterS: 1 });
      return r;
    });
  }

  /** Reads the account's money from the ledger and gives it to Redis (which keeps the first it gets). */
  private restoreMoney(accountId: string): Promise<void> {
    let restoring = this.restoring.get(accountId);
    if (restoring === undefined) {
      const a = this.tag(accountId);
      restoring = this.money!(accountId).then((t) => this.eval(SCRIPTS.restore, [`${a}:m`, `${a}:r`, ...t.creditIds.map((id) => `${a}:c:${id}`)], [
        String(t.balanceMicro), String(t.day), String(t.spentMicro), t.credited ? '1' : '0',
      ], accountId)).then((set) => {
        if (set === 1) this.logger?.info('account money rebuilt from the ledger', { account_id: accountId });
      }, (err: unknown) => {
        this.warn('rebuilding an account\'s money from the ledger failed', err as Error);
        throw new GatewayError('limiter_unavailable', { retryAfterS: 1 });
      }).finally(() => this.restoring.delete(accountId));
      this.restoring.set(accountId, restoring);
    }
    return restoring;
  }

  /**
   * EVALSHA (loading the script on NOSCRIPT) with a deadline of `timeoutMs` (the client's own
   * command timeout does not cover a Redis that stops answering mid-connection). Any failure
   * is a 503 limiter_unavailable.
   */
  private eval(s: Script, keys: string[], args: string[], accountId?: string): Promise<unknown> {
    if (!this.client.isReady) return Promise.reject(new GatewayError('limiter_unavailable', { retryAfterS: 1 }));
    // The account's batched ops made before this command go first, as they would unbatched.
    if (accountId !== undefined) this.batch.flushAccount(accountId);
    const call = this.command(s, keys, args);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new GatewayError('limiter_unavailable', { retryAfterS: 1 })), this.timeoutMs);
      call.then((value) => {
        clearTimeout(timer);
        resolve(value);
      }, (err: Error) => {
        clearTimeout(timer);
        this.warn('redis limiter command failed', err);
        reject(new GatewayError('limiter_unavailable', { retryAfterS: 1 }));
      });
    });
  }

  /** EVALSHA of a script (see evalWords). */
  private command(s: Script, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    return this.evalWords(s, ['EVALSHA', s.sha, String(keys.length), ...keys, ...args]);
  }

  /**
   * Sends `words` (EVALSHA sha numkeys keys... args...), and again as EVAL with the script's
   * source when Redis does not have it (NOSCRIPT: flushed, or restarted). No deadline: the
   * callers keep it.
   */
  private evalWords(s: Script, words: string[]): Promise<unknown> {
    return this.client.sendCommand(words).catch((err: Error) => {
      if (!String(err.message).startsWith('NOSCRIPT')) throw err;
      words[0] = 'EVAL';
      words[1] = s.source;
      return this.client.sendCommand(words);
    });
  }

  /**
   * Queues an op in its account's batch (sent at the end of the turn, see redis-batch.ts);
   * resolves to the op's own reply. Fails closed like `eval`: at once when Redis is away, and
   * at the batch's deadline when it does not answer.
   */
  private queue(accountId: string, keys: readonly string[], args: readonly string[], late?: (reply: unknown) => void): Promise<unknown> {
    if (!this.client.isReady) return Promise.reject(new GatewayError('limiter_unavailable', { retryAfterS: 1 }));
    return new Promise((resolve, reject) => {
      this.batch.push(accountId, () => this.accountKeys(this.tag(accountId)), { keys, args, resolve, reject, late });
    });
  }

  private accountKeys(a: string): string[] {
    return [`${a}:wt`, `${a}:wn`, `${a}:s`, `${a}:m`, `${a}:r`, `${a}:x`];
  }

  /** One account's batch as one call of the BATCH script. */
  private sendBatch(accountKeys: readonly string[], ops: readonly BatchOp[]): Promise<unknown> {
    if (!this.client.isReady) return Promise.reject(new Error('the redis connection is not ready'));
    // The command's words in one array, built once (no copies of the keys and arguments).
    const words = this.functions ? ['FCALL', BATCH_FUNCTION.name, '', ...accountKeys] : ['EVALSHA', SCRIPTS.batch.sha, '', ...accountKeys];
    for (const op of ops) for (const k of op.keys) words.push(k);
    words[2] = String(words.length - 3);
    words.push(this.needsrc, String(this.leaseMs));
    for (const op of ops) for (const v of op.args) words.push(v);
    if (words[0] === 'EVALSHA') return this.evalWords(SCRIPTS.batch, words);
    return this.client.sendCommand(words).catch((err: Error) => {
      if (!FCALL_REFUSED.test(err.message)) throw err;
      // Refused before it ran: sent again as a script (as a NOSCRIPT call is), and the library
      // loaded again when it went missing (FUNCTION FLUSH).
      this.functions = false;
      if (err.message.startsWith('ERR')) this.loadFunctions();
      else this.logger?.warn('redis refuses FCALL to the limiter; it runs BATCH as a script', { error: err.message });
      words[0] = 'EVALSHA';
      words[1] = SCRIPTS.batch.sha;
      return this.evalWords(SCRIPTS.batch, words);
    });
  }

  /**
   * Gives Redis the BATCH library (loaded by another instance first is as good), then calls it
   * with FCALL; a Redis that cannot take it (before 7.0; an ACL without FUNCTION) keeps
   * getting scripts, with a note in the log.
   */
  private loadFunctions(): void {
    if (this.loading) return;
    this.loading = true;
    this.client.sendCommand(['FUNCTION', 'LOAD', BATCH_FUNCTION.code]).then(() => true, (err: Error) => {
      if (err.message.includes('already exists')) return true;
      // (A connection lost meanwhile is no refusal: the next connection tries again.)
      if (this.client.isReady) this.logger?.info('redis does not take the limiter as a function; it runs BATCH as a script', { error: err.message });
      return false;
    }).then((loaded) => {
      this.loading = false;
      this.functions = loaded;
    });
  }

  /** At most one warning per 5 s: an outage must not flood the log. */
  private warn(msg: string, err: Error): void {
    const now = Date.now();
    // Timed from the last warning logged (found in review: from the last error, so errors
    // coming more often than every 5 s were never logged again after the first).
    if (now - this.lastError <= 5000) return;
    this.lastError = now;
    this.logger?.warn(msg, { error: err.message });
  }

  /** Extends every live ticket's leases (node-redis pipelines the calls made in one tick). */
  private renewAll(): void {
    if (!this.client.isReady) return;
    // Renewals first: a lease that ran out is taken again before a settlement sent again
    // asks whether it is held.
    for (const t of this.live) this.renew(t);
    this.resendSettlements();
  }

  private renew(t: RedisTicket): void {
    const a = this.tag(t.accountId);
    // What it still holds reserved: nothing once a settlement was sent (it may have taken it).
    const reserved = t.settled || t.givenBack ? '0' : String(t.reservedMicro);
    this.client.sendCommand([
      'EVALSHA', SCRIPTS.renew.sha, '6', `${a}:s`, `${a}:ks:${t.keyId ?? ''}`, `${a}:i:${t.idempotencyKey ?? ''}`, `${a}:r`, `${a}:m`, `${a}:x`,
      t.id, String(this.leaseMs), t.keyId !== null ? '1' : '0', t.idempotencyKey !== null ? '1' : '0', reserved, this.needsrc,
    ]).then((reply) => {
      // Redis lost the account's money (shared ledger): read it back, then renew again, so the
      // call counts again at once (found in review: until a billable call read it back, which a
      // free model's calls never do, its slot and key were free to others).
      if (isRestore(reply) && !t.settled) this.restoreMoney(t.accountId).then(() => { if (this.live.has(t)) this.renew(t); }, ignore);
    }, (err: Error) => {
      // Never sent again as EVAL: it would reach Redis after what was sent meanwhile, a
      // release of its ticket (as FCALL) included, and take the lease again (found in
      // review). The script is loaded for the next renewal, a third of a lease later.
      if (String(err.message).startsWith('NOSCRIPT')) this.client.sendCommand(['SCRIPT', 'LOAD', SCRIPTS.renew.source]).catch(ignore);
    });
  }
}

const NO_KEYS: readonly string[] = [];
/** Errors of ops Redis refused (their arguments): sending them again would not help. */
const REFUSED = new WeakSet<Error>();
/** Releases kept for Redis's return, at most; beyond them, the leases free what they hold. */
const MAX_UNSENT = 10_000;
const ignore = (): void => {};

function hasKeyLimits(key: KeyLimits): boolean {
  return key.rpm !== null || key.concurrency !== null;
}

/** A script's answer that the account's money must be read from the ledger first. */
function isRestore(reply: unknown): boolean {
  return reply === 'restore' || (Array.isArray(reply) && reply[0] === 'restore');
}
