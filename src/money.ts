/**
 * Money inside the program is integer micro-dollars (1e-6 USD); never floats.
 * Prices are micro-dollars per million tokens, so a cost is tokens * price / 1e6, rounded up.
 */

export const MICRO_PER_USD = 1_000_000;

/**
 * Parses a USD amount given as a JSON number or a decimal string into micro-dollars.
 * Returns a message instead when the value is not an amount with at most 6 decimals.
 */
export function parseUsd(value: unknown): number | string {
  let text: string;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) return 'must be a finite amount';
    // Going through the shortest decimal text avoids binary float error (0.15 * 1e6 !== 150000).
    text = String(value);
    if (text.includes('e')) text = value.toFixed(7).replace(/0+$/, '');
  } else if (typeof value === 'string') {
    text = value.trim();
  } else {
    return 'must be a number of US dollars (or a decimal string)';
  }
  const match = /^(-?)(\d+)(?:\.(\d*))?$/.exec(text);
  if (match === null) return `must be a decimal amount of US dollars, got ${JSON.stringify(value)}`;
  const fraction = (match[3] ?? '').replace(/0+$/, '');
  if (fraction.length > 6) return 'has more than 6 decimal places (the unit is one micro-dollar)';
  const micro = Number(match[2]) * MICRO_PER_USD + Number(fraction.padEnd(6, '0') || '0');
  if (!Number.isSafeInteger(micro)) return 'is too large';
  return match[1] === '-' && micro !== 0 ? -micro : micro;
}

/** Micro-dollars to USD for a JSON answer (6 decimals, exact for integers below 2^53). */
export function microToUsd(micro: number): number {
  return micro / MICRO_PER_USD;
}

/** Prices of a model, micro-dollars per million tokens. */
export interface Price {
  readonly input: number;
  readonly output: number;
  readonly cacheRead: number;
  readonly cacheWrite: number;
}

export const FREE: Price = Object.freeze({ input: 0, output: 0, cacheRead: 0, cacheWrite: 0 });

export function isFree(price: Price): boolean {
  return price.input === 0 && price.output === 0 && price.cacheRead === 0 && price.cacheWrite === 0;
}

/** Token counts of one model call. */
export interface Usage {
  inputTokens: number;
  outputTokens: number;
  cacheReadTokens: number;
  cacheWriteTokens: number;
}

/** Cost in micro-dollars, rounded up so a charge is never under-billed by rounding. */
export function costMicro(price: Price, usage: Usage): number {
  const scaled = usage.inputTokens * price.input + usage.outputTokens * price.output +
    usage.cacheReadTokens * price.cacheRead + usage.cacheWriteTokens * price.cacheWrite;
  return Math.ceil(scaled / 1_000_000);
}
