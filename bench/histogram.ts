/**
 * Latency histogram: log-linear buckets in whole microseconds, at most 1/64 (~1.6%) relative
 * error. Values below 128 us get one bucket each; above, each power of two is split in 64.
 */
const LINEAR = 128;
const SUB = 64;
const MAX_US = 0x7fffffff; // ~36 minutes; larger values are clamped (clz32 and >> need < 2^31)
const MAX_SHIFT = 25; // the shift of MAX_US

export class Histogram {
  readonly counts = new Float64Array(LINEAR + SUB * MAX_SHIFT);
  total = 0;
  maxUs = 0;

  record(us: number): void {
    const v = us <= 0 ? 0 : Math.min(Math.floor(us), MAX_US);
    if (v > this.maxUs) this.maxUs = v;
    this.counts[Histogram.index(v)]!++;
    this.total++;
  }

  static index(v: number): number {
    if (v < LINEAR) return v;
    const msb = 31 - Math.clz32(v); // >= 7
    const shift = msb - 6; // (v >> shift) lands in [64, 127]
    const mantissa = v >> shift;
    return LINEAR + (shift - 1) * SUB + (mantissa - SUB);
  }

  /** The upper edge of bucket `i` (what a percentile reports: conservative by < 1.6%). */
  static upper(i: number): number {
    if (i < LINEAR) return i;
    const shift = Math.floor((i - LINEAR) / SUB) + 1;
    const mantissa = ((i - LINEAR) % SUB) + SUB;
    return (mantissa + 1) * 2 ** shift - 1; // not <<: the top bucket reaches 2^31
  }

  /** The value at quantile q (0..1), in microseconds; 0 when empty. */
  quantileUs(q: number): number {
    if (this.total === 0) return 0;
    const rank = Math.max(1, Math.ceil(q * this.total));
    let seen = 0;
    for (let i = 0; i < this.counts.length; i++) {
      seen += this.counts[i]!;
      if (seen >= rank) return Math.min(Histogram.upper(i), this.maxUs);
    }
    return this.maxUs;
  }
}
