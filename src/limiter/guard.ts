import { isMicro } from '../money.js';
import type { AccountLimits, KeyLimits } from './types.js';

/**
 * The engine's door: every number that reaches limiter state is checked here, in both stores,
 * so no request (and no bug upstream of the engine) can put NaN, Infinity, a fraction or an
 * unsafe integer into a window, a reservation, a spend or a balance. A bad value is a fault
 * (a RangeError), never a decision: the routes validate what clients send before this.
 */

const isLimit = (v: unknown): boolean => v === null || (Number.isSafeInteger(v) && (v as number) >= 0);

function fault(what: string, value: unknown): RangeError {
  return new RangeError(`limiter: ${what} must be ${what === 'credit' ? 'a positive' : 'a non-negative'} safe integer, got ${typeof value === 'string' ? JSON.stringify(value) : String(value)}`);
}

/** Checks the limits of an admission and its estimate (null: not billable). */
export function checkAdmission(account: AccountLimits, key: KeyLimits, estimateMicro: number | null): void {
  if (!isLimit(account.rpm)) throw fault('rpm', account.rpm);
  if (!isLimit(account.concurrency)) throw fault('concurrency', account.concurrency);
  if (!isLimit(account.dailyCapMicro)) throw fault('daily cap', account.dailyCapMicro);
  if (!isLimit(key.rpm)) throw fault('key rpm', key.rpm);
  if (!isLimit(key.concurrency)) throw fault('key concurrency', key.concurrency);
  if (estimateMicro !== null && !isMicro(estimateMicro)) throw fault('estimate', estimateMicro);
}

export function checkEstimate(estimateMicro: number): void {
  if (!isMicro(estimateMicro)) throw fault('estimate', estimateMicro);
}

export function checkCost(costMicro: number): void {
  if (!isMicro(costMicro)) throw fault('cost', costMicro);
}

export function checkCredit(amountMicro: number): void {
  if (!isMicro(amountMicro) || amountMicro === 0) throw fault('credit', amountMicro);
}

/** A restored balance may be negative (a prepaid account that settled above its estimate). */
export function checkRestore(balanceMicro: number, day: number, spentMicro: number): void {
  if (!Number.isSafeInteger(balanceMicro)) throw fault('balance', balanceMicro);
  if (!Number.isSafeInteger(day) || day < 0) throw fault('day', day);
  if (!isMicro(spentMicro)) throw fault('spend', spentMicro);
}
