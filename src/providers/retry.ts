/** Retry policy for upstream calls before the first byte reaches the client. */

/** Statuses retried before the first byte (plus connection errors). 429 is retried only on a short Retry-After. */
export const RETRY_STATUSES = new Set([429, 502, 503, 504, 529]);
const BASE_DELAY_MS = 200;
const MAX_DELAY_MS = 4000;

/** The longest wait a provider's Retry-After is taken at: the client is told at most this too. */
export const MAX_PROVIDER_WAIT_MS = 3_600_000;

/**
 * The provider's own wait, from `retry-after-ms` (OpenAI) or `retry-after` (seconds or an
 * HTTP date), in milliseconds, at most MAX_PROVIDER_WAIT_MS (a hostile or broken value, 1e23
 * or 400 digits, must not reach the client as `Retry-After: Infinity`); null when absent or
 * unreadable.
 */
export function retryAfterMs(headers: Record<string, string | string[] | undefined>, now: number): number | null {
  const ms = headers['retry-after-ms'];
  if (typeof ms === 'string' && /^\d+(\.\d+)?$/.test(ms)) return Math.min(Number(ms), MAX_PROVIDER_WAIT_MS);
  const value = headers['retry-after'];
  if (typeof value !== 'string' || value === '') return null;
  if (/^\d+(\.\d+)?$/.test(value)) return Math.min(Number(value) * 1000, MAX_PROVIDER_WAIT_MS);
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.min(Math.max(0, date - now), MAX_PROVIDER_WAIT_MS);
}

/** Exponential back-off with full jitter, or the provider's Retry-After when it gave one. */
export function backoffMs(attempt: number, providerWaitMs: number | null, random: () => number = Math.random): number {
  if (providerWaitMs !== null) return providerWaitMs;
  const ceiling = Math.min(MAX_DELAY_MS, BASE_DELAY_MS * 2 ** (attempt - 1));
  return Math.floor(ceiling / 2 + random() * (ceiling / 2));
}
