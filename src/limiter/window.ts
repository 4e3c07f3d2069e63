/** The rolling window RPM is counted over. */
export const WINDOW_MS = 60_000;

const MIN_SLOTS = 4;

/**
 * An exact sliding window whose memory follows its use, not its limit: admissions are kept as
 * (millisecond, count) pairs in a ring, one pair per clock millisecond that admitted anything
 * in the last 60 s (so at most 60,000 pairs, 12 bytes each), however large the limit. The ring
 * doubles when full and halves (as often as it can) when under a quarter full.
 *
 * A new admission at `now` is allowed when fewer than `limit` admissions lie in
 * (now - 60 s, now]. When the window is full, the wait is exactly the time until enough of the
 * oldest admissions leave it: so no rolling 60 s window ever holds more than `limit`
 * admissions, also after the limit was lowered, and a lone client that waits that long is
 * admitted. O(1) per check and record (amortised; a lowered limit scans the oldest pairs once).
 */
export class SlidingWindow {
  private times = new Float64Array(MIN_SLOTS);
  private counts = new Uint32Array(MIN_SLOTS);
  private head = 0;
  /** Pairs in the ring. */
  private size = 0;
  /** Admissions in the ring (the sum of its counts). */
  private total = 0;

  /** Milliseconds until one more admission fits under `limit`; 0 when it fits now. */
  waitMs(now: number, limit: number): number {
    if (limit === 0) return WINDOW_MS; // nothing is ever admitted; a minute is as honest as it gets
    this.expire(now);
    if (this.total < limit) return 0;
    // The oldest (total - limit + 1) admissions must leave before the next one fits.
    let leaving = this.total - limit + 1;
    const mask = this.times.length - 1;
    for (let i = 0; i < this.size; i++) {
      const at = (this.head + i) & mask;
      leaving -= this.counts[at]!;
      if (leaving <= 0) return this.times[at]! + WINDOW_MS - now;
    }
    return WINDOW_MS; // not reached: total is the sum of the counts
  }

  /** Records an admission; call only after `waitMs` returned 0. */
  record(now: number): void {
    const mask = this.times.length - 1;
    // Whole milliseconds, never earlier than the newest pair: a clock that steps back keeps
    // the ring in order, and an admission then leaves the window a little later, never sooner.
    const at = Math.ceil(now);
    if (this.size > 0) {
      const newest = (this.head + this.size - 1) & mask;
      const last = this.times[newest]!;
      if (at <= last) {
        this.counts[newest]!++;
        this.total++;
        return;
      }
    }
    if (this.size === this.times.length) this.resize(this.times.length * 2);
    const slot = (this.head + this.size) & (this.times.length - 1);
    this.times[slot] = at;
    this.counts[slot] = 1;
    this.size++;
    this.total++;
  }

  /** Admissions in the window ending at `now`. */
  count(now: number): number {
    this.expire(now);
    return this.total;
  }

  /** True when no admission lies in the window ending at `now` (the state can be dropped). */
  idle(now: number): boolean {
    return this.count(now) === 0;
  }

  /** Pairs held (for tests and the memory bench). */
  get pairs(): number {
    return this.size;
  }

  /** Bytes of the ring's arrays (for the memory bench). */
  get bytes(): number {
    return this.times.byteLength + this.counts.byteLength;
  }

  /** Drops the pairs that have left the window ending at `now`. */
  private expire(now: number): void {
    const mask = this.times.length - 1;
    const edge = now - WINDOW_MS;
    while (this.size > 0 && this.times[this.head]! <= edge) {
      this.total -= this.counts[this.head]!;
      this.head = (this.head + 1) & mask;
      this.size--;
    }
    if (this.size === 0) this.head = 0;
    let slots = this.times.length;
    while (slots > MIN_SLOTS && this.size < slots >> 2) slots >>= 1;
    if (slots !== this.times.length) this.resize(slots);
  }

  /** Copies the pairs, oldest first, into a ring of `slots` (a power of two). */
  private resize(slots: number): void {
    const times = new Float64Array(slots);
    const counts = new Uint32Array(slots);
    const mask = this.times.length - 1;
    for (let i = 0; i < this.size; i++) {
      const from = (this.head + i) & mask;
      times[i] = this.times[from]!;
      counts[i] = this.counts[from]!;
    }
    this.times = times;
    this.counts = counts;
    this.head = 0;
  }
}
