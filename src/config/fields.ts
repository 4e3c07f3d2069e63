import { parseUsd } from '../money.js';
import type { Limit } from './types.js';

/**
 * The rules for the fields of plans, accounts and keys, one place for both the config file
 * (config/validate.ts, which reports every problem by JSON path) and the admin API
 * (routes/admin.ts, which answers the first with `error.param`): the two cannot drift apart.
 */

/** The largest limit (rpm, concurrency) a plan, account or key may set; larger is "unlimited". */
export const MAX_LIMIT = 1_000_000_000;

/** Ids of plans, accounts and keys: they are path segments of the admin API, so no `/`. */
export const ENTITY_ID = /^[A-Za-z0-9._:@-]{1,128}$/;
export const ENTITY_ID_RULE = 'must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -';
/** Ids of models and providers: a model id may name an upstream's model, as `meta/llama-3`. */
export const NAME_ID = /^[A-Za-z0-9._:@/-]{1,128}$/;
export const NAME_ID_RULE = 'must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / -';

export type Field<T> = { ok: true; value: T } | { ok: false; message: string };

const ok = <T>(value: T): Field<T> => ({ ok: true, value });
const no = <T>(message: string): Field<T> => ({ ok: false, message });

/** rpm, concurrency: an integer from 0 to MAX_LIMIT, or "unlimited" (null). */
export function limitField(value: unknown): Field<Limit> {
  if (value === null || value === 'unlimited') return ok(null);
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > MAX_LIMIT) {
    return no(`must be an integer from 0 to ${MAX_LIMIT}, or "unlimited"`);
  }
  return ok(value);
}

/** A USD amount (number or decimal string) as micro-dollars, not negative. */
export function amountField(value: unknown): Field<number> {
  const micro = parseUsd(value);
  if (typeof micro === 'string') return no(micro);
  if (micro < 0) return no('must not be negative');
  return ok(micro);
}

/** A daily cap: an amount, or "unlimited" (null). */
export function capField(value: unknown): Field<Limit> {
  if (value === null || value === 'unlimited') return ok(null);
  return amountField(value);
}

export function boolField(value: unknown): Field<boolean> {
  return typeof value === 'boolean' ? ok(value) : no('must be true or false');
}

/** A key's allowed models: an array of known model ids. `index` names the first bad element. */
export function modelsField(value: unknown, known: ReadonlyMap<string, unknown>): Field<string[]> & { index?: number } {
  if (!Array.isArray(value)) return no('must be an array of model ids');
  for (let i = 0; i < value.length; i++) {
    const m = value[i] as unknown;
    if (typeof m !== 'string' || !known.has(m)) return { ok: false, message: `unknown model ${JSON.stringify(m)}`, index: i };
  }
  return ok(value as string[]);
}
