/** The rolling window RPM is counted over. */
export const WINDOW_MS = 60_000;

const MIN_SLOTS = 4;

/**
 * An exact sliding window whose memory follows its use, not its limit: admissions are kept as
 * (millisecond, count) pairs in a ring, one pair per clock millisecond that admitted anything
 * in the last 60 s, so at most 60,000 pairs of 8 bytes however large the limit, and never more
 * pairs than the limit admits. The ring grows by half when full (up to the limit) and shrinks
 * when under a quarter full.
 *
 * A new admission at `now` is allowed when fewer than `limit` admissions lie in
 * (now - 60 s, now]. When the window is full, the wait is exactly the time until enough of the
 * oldest admissions leave it: so no rolling 60 s window ever holds more than `limit`
 * admissions, also after the limit was lowered, and a lone client that waits that long is
 * admitted. O(1) per check and record (amortised; a lowered limit scans the oldest pairs once).
 *
 * Times are kept as the low 32 bits of their millisecond (ages are computed modulo 2^32, and no
 * pair is older than a minute), so a pair is two 32-bit integers.
 */
export class SlidingWindow {
  /** The ring: slot k is [2k] the millisecond's low 32 bits, [2k + 1] its admissions. */
  private ring = new Uint32Array(2 * MIN_SLOTS);
  /** Slots in the ring. */
  private slots = MIN_SLOTS;
  private head = 0;
  /** Pairs in the ring. */
  private size = 0;
  /** Admissions in the ring (the sum of its counts). */
  private total = 0;
  /** The newest pair's millisecond, in full. */
  private newest = -Infinity;
  /** The limit last checked against: the ring never grows past it. */
  private limit = MIN_SLOTS;

  /** Milliseconds until one more admission fits under `limit`; 0 when it fits now. */
  waitMs(now: number, limit: number): number {
    this.limit = limit;
    if (limit === 0) return WINDOW_MS; // nothing is ever admitted; a minute is as honest as it gets
    this.expire(now);
    if (this.total < limit) return 0;
    // The oldest (total - limit + 1) admissions must leave before the next one fits.
    let leaving = this.total - limit + 1;
    const base = this.newest > now ? this.newest : now; // later than now if the clock stepped back
    for (let i = 0; i < this.size; i++) {
      const k = 2 * ((this.head + i) % this.slots);
      leaving -= this.ring[k + 1]!;
      if (leaving <= 0) return WINDOW_MS - ((base - this.ring[k]!) >>> 0) + (base - now);
    }
    return WINDOW_MS; // not reached: total is the sum of the counts
  }

  /** Records an admission; call only after `waitMs` returned 0. */
  record(now: number): void {
    // Whole milliseconds, never earlier than the newest pair: a clock that steps back keeps
    // the ring in order, and an admission then leaves the window a little later, never sooner.
    const at = Math.ceil(now);
    if (this.size > 0 && at <= this.newest) {
      this.ring[2 * ((this.head + this.size - 1) % this.slots) + 1]!++;
      this.total++;
      return;
    }
    if (this.size === this.slots) this.grow();
    const k = 2 * ((this.head + this.size) % this.slots);
    this.ring[k] = at >>> 0;
    this.ring[k + 1] = 1;
    this.newest = at;
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

  /** Bytes of the ring (for tests and the memory bench). */
  get bytes(): number {
    return this.ring.byteLength;
  }

  /** Drops the pairs that have left the window ending at `now` (or at the newest pair, if the clock stepped back). */
  private expire(now: number): void {
    const at = (this.newest > now ? this.newest : now) >>> 0;
    while (this.size > 0 && ((at - this.ring[2 * this.head]!) >>> 0) >= WINDOW_MS) {
      this.total -= this.ring[2 * this.head + 1]!;
      this.head = (this.head + 1) % this.slots;
      this.size--;
    }
    if (this.size === 0) this.head = 0;
    if (this.slots > MIN_SLOTS && this.size < this.slots >> 2) this.resize(Math.max(MIN_SLOTS, this.size * 2));
  }

  private grow(): void {
    const wanted = this.size + Math.max(MIN_SLOTS, this.size >> 1);
    // No room past what the window can hold: one pair per millisecond, and no more pairs than
    // the limit admits (a lowered limit, or a clock that stepped back, can leave more in the
    // window; then the ring grows as it must).
    const most = this.limit < WINDOW_MS ? this.limit : WINDOW_MS;
    this.resize(this.size < most ? Math.min(wanted, most) : wanted);
  }

  /** Copies the pairs, oldest first, into a ring of `slots`. */
  private resize(slots: number): void {
    const ring = new Uint32Array(2 * slots);
    for (let i = 0; i < this.size; i++) {
      const from = 2 * ((this.head + i) % this.slots);
      ring[2 * i] = this.ring[from]!;
      ring[2 * i + 1] = this.ring[from + 1]!;
    }
    this.ring = ring;
    this.slots = slots;
    this.head = 0;
  }
}
