import type { AccountEntry } from '../directory.js';
import { GatewayError } from '../errors.js';
import { creditEntry, creditMarker } from '../billing/entries.js';
import type { Ledger, LedgerEntry } from '../ledger/types.js';
import type { Limiter } from '../limiter/types.js';
import type { Logger } from '../log.js';
import { addMicro } from '../money.js';
import { DAY_MS } from '../clock.js';
import { CREDIT_KEY_DAYS } from '../ledger/book.js';

/** What a credit needs of the gateway. */
export interface CreditContext {
  readonly ledger: Ledger;
  readonly limiter: Limiter;
  readonly logger: Logger;
  now(): number;
}

export interface CreditRequest {
  account: AccountEntry;
  amountMicro: number;
  note: string | null;
  /** The admin request's `Idempotency-Key`, or null. */
  idempotencyKey: string | null;
  requestId: string;
}

/** How often a credit that is durable but not yet live (the limiter store was away) is retried. */
const LIVE_RETRY_MS = 1000;

/**
 * Prepaid credits from the admin API. A credit is durable before it is live: its ledger entry
 * is written (and fsynced) first, then the limiter's balance is raised, so a failed write
 * credits nothing and a crash in between is made good at the next start (the memory store is
 * rebuilt from the ledger; a shared store applies each credit once by its entry id, retried in
 * the background until it answers). With an `Idempotency-Key` a repeat answers the same entry
 * and credits once, also across restarts (the ledger remembers keys for CREDIT_KEY_DAYS).
 */
export class Credits {
  /** `account \n key` -> the credit being made, so a concurrent repeat waits for it. */
  private readonly making = new Map<string, Promise<LedgerEntry>>();
  /**
   * account -> the last credit being made for it: an account's credits are made one after the
   * other, so each reads the balance the one before it left (two at once both showed the same
   * `balance_after`). Another instance's, made at the same moment, can still show the same.
   */
  private readonly lastMade = new Map<string, Promise<unknown>>();

  constructor(private readonly ctx: CreditContext) {}

  async credit(request: CreditRequest): Promise<LedgerEntry> {
    const { account, idempotencyKey } = request;
    if (idempotencyKey === null) return this.make(request);
    const slot = `${account.id}\n${idempotencyKey}`;
    const inProgress = this.making.get(slot);
    let earlier: LedgerEntry | undefined | Promise<LedgerEntry | undefined> = inProgress ?? this.ctx.ledger.creditByKey(account.id, idempotencyKey);
    // A shared ledger is asked over the network: a repeat may start making it meanwhile. (With
    // a local one nothing is awaited between this check and `making.set` below.)
    if (inProgress === undefined && earlier instanceof Promise) earlier = (await earlier) ?? this.making.get(slot);
    const entry = earlier === undefined ? undefined : await earlier;
    if (entry !== undefined) return this.repeat(entry, request);
    const making = this.make(request);
    this.making.set(slot, making);
    try {
      return await making;
    } finally {
      this.making.delete(slot);
    }
  }

  /** A credit asked again with its Idempotency-Key: the same one, answered with the credit it made. */
  private async repeat(entry: LedgerEntry, request: CreditRequest): Promise<LedgerEntry> {
    if (entry.amountMicro !== request.amountMicro || entry.note !== request.note) {
      throw new GatewayError('invalid_request', {
        message: 'This Idempotency-Key was used for a different credit (amount or note).', fields: { param: 'Idempotency-Key' },
      });
    }
    // The store may not have it yet: a shared one was away when the credit was made, or the
    // ledger's answer was lost though it recorded the credit (the first request got a 503).
    // Applied once by its id; not past the days a store remembers applied credits: it would
    // apply an old one again.
    const recent = entry.createdAt >= this.ctx.now() - CREDIT_KEY_DAYS * DAY_MS;
    if (recent) await this.goLive(entry);
    return entry;
  }

  private make(request: CreditRequest): Promise<LedgerEntry> {
    const id = request.account.id;
    const previous = this.lastMade.get(id) ?? Promise.resolve();
    const made = previous.then(() => this.makeNow(request), () => this.makeNow(request));
    const settled = made.catch(() => {});
    this.lastMade.set(id, settled);
    void settled.then(() => {
      if (this.lastMade.get(id) === settled) this.lastMade.delete(id);
    });
    return made;
  }

  private async makeNow(request: CreditRequest): Promise<LedgerEntry> {
    const { account, amountMicro } = request;
    const before = await this.ctx.limiter.snapshot(account);
    if (!Number.isSafeInteger((before.balanceMicro ?? 0) + amountMicro)) {
      throw new GatewayError('invalid_request', {
        message: 'The balance after this credit would be over 9,007,199,254 USD, more than the gateway counts.', fields: { param: 'amountUsd' },
      });
    }
    const entry = creditEntry({
      accountId: account.id, amountMicro, balanceAfterMicro: addMicro(before.balanceMicro ?? 0, amountMicro), at: this.ctx.now(),
      requestId: request.requestId, note: request.note, idempotencyKey: request.idempotencyKey,
    });
    try {
      await this.ctx.ledger.append(entry); // durable first: if this fails, nothing was credited
    } catch (err) {
      this.ctx.logger.error('credit not recorded: the ledger refused the write', { account_id: account.id, error: String(err) });
      throw new GatewayError('ledger_unavailable', { retryAfterS: 5 });
    }
    if (request.idempotencyKey !== null) {
      // A shared ledger keeps one credit per key: another instance's, made at the same moment,
      // may be the one it kept. Then that one is the answer, and the one applied.
      const kept = await this.ctx.ledger.creditByKey(account.id, request.idempotencyKey);
      if (kept !== undefined && kept.id !== entry.id) return this.repeat(kept, request);
    }
    try {
      await this.goLive(entry);
    } catch (err) {
      this.ctx.logger.warn('credit recorded; the limiter store is away, it becomes spendable when it answers', {
        account_id: account.id, entry_id: entry.id, error: String(err),
      });
      this.retryLive(entry);
    }
    return entry;
  }

  /**
   * Gives a shared store the recent credits again (at start): each is applied once by its
   * entry id, so this only makes good a credit whose instance died before it went live.
   */
  resume(): void {
    if (this.ctx.limiter.restoresFromLedger) return;
    for (const entry of this.ctx.ledger.recentCredits()) this.goLive(entry).catch(() => this.retryLive(entry));
  }

  /**
   * A shared store applies each credit once by its id (creditMarker): so the same credit asked
   * of two instances, each with its own ledger, raises the shared balance once. A credit an
   * older version applied under its bare entry id is not applied again.
   */
  private async goLive(entry: LedgerEntry): Promise<void> {
    await this.ctx.limiter.credit(entry.accountId, entry.amountMicro, creditMarker(entry), entry.id);
  }

  private retryLive(entry: LedgerEntry): void {
    setTimeout(() => {
      this.goLive(entry).catch(() => this.retryLive(entry));
    }, LIVE_RETRY_MS).unref();
  }
}
