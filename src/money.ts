/**
 * Money inside the program is integer micro-dollars (1e-6 USD); never floats.
 * Prices are micro-dollars per million tokens, so a cost is tokens * price / 1e6, rounded up.
 */

export const MICRO_PER_USD = 1_000_000;

/** The longest amount text taken: far above any amount a safe integer of micro-dollars holds. */
const MAX_AMOUNT_CHARS = 64;

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
    if (text.includes('e')) {
      // JavaScript writes an amount below 1e-6 with an exponent: not zero, it has more than 6
      // decimals (toFixed would round 4e-8 to 0, and a cap of 4e-8 would be a cap of 0).
      if (Math.abs(value) < 1) return 'has more than 6 decimal places (the unit is one micro-dollar)';
      text = value.toFixed(7).replace(/0+$/, '');
    }
  } else if (typeof value === 'string') {
    text = value.trim();
  } else {
    return 'must be a number of US dollars (or a decimal string)';
  }
  // Longer than any amount of micro-dollars below 2^53 with its decimals: refused before the
  // regular expressions (found in review: stripping 100,000 zeros took the event loop 10 s).
  if (text.length > MAX_AMOUNT_CHARS) return 'is too long to be an amount of US dollars';
  const match = /^(-?)(\d+)(?:\.(\d*))?$/.exec(text);
  if (match === null) return `must be a decimal amount of US dollars, got ${JSON.stringify(value)}`;
  const fraction = (match[3] ?? '').replace(/0+$/, '');
  if (fraction.length > 6) return 'has more than 6 decimal places (the unit is one micro-dollar)';
  const micro = Number(match[2]) * MICRO_PER_USD + Number(fraction.padEnd(6, '0') || '0');
  if (!Number.isSafeInteger(micro)) return 'is too large';
  return match[1] === '-' && micro !== 0 ? -micro : micro;
}

/**
 * Micro-dollars to USD for a JSON answer: the closest number, which JSON writes with its 6
 * decimals exactly up to about $4 billion (2^32 dollars); above, a double cannot hold every
 * micro-dollar, and the last decimal may be off by one (the ledger's integers stay exact).
 */
export function microToUsd(micro: number): number {
  return micro / MICRO_PER_USD;
}

/** Prices of a model, micro-dollars per million tokens. */
export interface Price {
  readonly input: number;
  readonly output: number;
  readonly cacheRead: number;
  readonly cacheWrite: number;
  /** Cache writes kept for an hour (Anthropic bills them at twice the input price, against 1.25x for five minutes). */
  readonly cacheWrite1h: number;
  /** Web searches a model ran (Anthropic's server tool, the Responses API's), micro-dollars per thousand. */
  readonly webSearchPerThousand: number;
  /**
   * Web searches billed for every call the provider had, whatever its answer says (OpenAI's
   * Chat search models search on every call, and their usage does not say): 0 for most models.
   */
  readonly webSearchesPerCall: number;
  /**
   * Audio tokens in and out (OpenAI bills them at many times the text prices); null when the
   * config sets none: a request for audio is then refused, as nothing can price it.
   */
  readonly audioInput: number | null;
  readonly audioOutput: number | null;
}

export const FREE: Price = Object.freeze({ input: 0, output: 0, cacheRead: 0, cacheWrite: 0, cacheWrite1h: 0, webSearchPerThousand: 0, webSearchesPerCall: 0, audioInput: 0, audioOutput: 0 });

export function isFree(price: Price): boolean {
  return price.input === 0 && price.output === 0 && price.cacheRead === 0 && price.cacheWrite === 0 && price.cacheWrite1h === 0 &&
    price.webSearchPerThousand === 0 && (price.audioInput ?? 0) === 0 && (price.audioOutput ?? 0) === 0;
}

/**
 * The most a price may be: USD 100,000 per million tokens (far above any model's), so that a
 * call's cost, with token counts bounded by MAX_TOKENS, stays a safe integer of micro-dollars.
 */
export const MAX_PRICE_MICRO = 100_000 * MICRO_PER_USD;

/**
 * The most tokens one field of one call may count (input estimate, a provider's reported
 * usage): a billion, far above any model's context. A provider reporting more is not believed
 * (its usage is treated as missing, and the call is charged an estimate).
 */
export const MAX_TOKENS = 1_000_000_000;

/** Token counts of one model call: integers from 0 to MAX_TOKENS. */
export interface Usage {
  inputTokens: number;
  outputTokens: number;
  cacheReadTokens: number;
  cacheWriteTokens: number;
  /** Of `cacheWriteTokens`, those written for an hour (Anthropic's `cache_creation` breakdown); absent: none. */
  cacheWrite1hTokens?: number;
  /** Web searches the provider ran for the call (Anthropic's `server_tool_use`); absent: none. */
  webSearches?: number;
  /** Of `inputTokens` and `outputTokens`, the audio ones (OpenAI's `*_tokens_details.audio_tokens`); absent: none. */
  audioInputTokens?: number;
  audioOutputTokens?: number;
}

/** A value the limiter engine may hold: a safe integer of micro-dollars, not negative. */
export function isMicro(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) >= 0;
}

/**
 * Cost in micro-dollars, rounded up so a charge is never under-billed by rounding. Exact:
 * below 2^53 the products and their sum are exact doubles and the division is done on
 * integers; above it (only for absurdly large calls) the same sum is done in BigInt. The
 * result is always a safe integer (saturating at 2^53 - 1, which no real call reaches).
 */
export function costMicro(price: Price, usage: Usage): number {
  const hour = usage.cacheWrite1hTokens ?? 0; // at most cacheWriteTokens (messagesUsage)
  const audioIn = usage.audioInputTokens ?? 0; // at most inputTokens, audioOut at most outputTokens (chatUsage)
  const audioOut = usage.audioOutputTokens ?? 0;
  // Searches are priced per thousand: in millionths of a micro-dollar, as the tokens are, so
  // the call is rounded up once (found in review: rounded apart, a fraction of each could add 1).
  const searches = usage.webSearches ?? 0;
  // Audio a provider reported for a model without audio prices (it was not asked for): at the text prices.
  const audioInPrice = price.audioInput ?? price.input;
  const audioOutPrice = price.audioOutput ?? price.output;
  const scaled = (usage.inputTokens - audioIn) * price.input + audioIn * audioInPrice + (usage.outputTokens - audioOut) * price.output +
    audioOut * audioOutPrice + usage.cacheReadTokens * price.cacheRead + (usage.cacheWriteTokens - hour) * price.cacheWrite + hour * price.cacheWrite1h +
    searches * price.webSearchPerThousand * 1000;
  if (scaled <= Number.MAX_SAFE_INTEGER) {
    const rest = scaled % 1_000_000;
    return (scaled - rest) / 1_000_000 + (rest > 0 ? 1 : 0);
  }
  const big = BigInt(usage.inputTokens - audioIn) * BigInt(price.input) + BigInt(audioIn) * BigInt(audioInPrice) +
    BigInt(usage.outputTokens - audioOut) * BigInt(price.output) + BigInt(audioOut) * BigInt(audioOutPrice) +
    BigInt(usage.cacheReadTokens) * BigInt(price.cacheRead) + BigInt(usage.cacheWriteTokens - hour) * BigInt(price.cacheWrite) +
    BigInt(hour) * BigInt(price.cacheWrite1h) + BigInt(searches) * BigInt(price.webSearchPerThousand) * 1000n;
  const cost = (big + 999_999n) / 1_000_000n;
  return cost > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(cost);
}

/** A sum of micro-dollar amounts that stays a safe integer: saturates instead of losing precision. */
export function addMicro(a: number, b: number): number {
  const sum = a + b;
  if (sum > Number.MAX_SAFE_INTEGER) return Number.MAX_SAFE_INTEGER;
  if (sum < -Number.MAX_SAFE_INTEGER) return -Number.MAX_SAFE_INTEGER;
  return sum;
}
