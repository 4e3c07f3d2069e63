/** The only source of time for limiter logic; tests inject a fake one. */
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
}

export const systemClock: Clock = { now: Date.now };

export const DAY_MS = 86_400_000;

/** Start of the next UTC day after `ms`, in epoch milliseconds. */
export function nextUtcMidnight(ms: number): number {
  return (Math.floor(ms / DAY_MS) + 1) * DAY_MS;
}
