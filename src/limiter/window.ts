/** The rolling window RPM is counted over. */
export const WINDOW_MS = 60_000;

/**
 * An exact sliding window: the times of the last `capacity` admissions in a ring.
 * A new admission at `now` is allowed when fewer than `capacity` admissions lie in
 * (now - 60 s, now], i.e. when the ring is not full or its oldest entry has left the window.
 * So no rolling 60 s window ever holds more than `capacity` admissions, and the wait is
 * exactly the time until the oldest entry leaves. O(1) per check; memory is 8 bytes x capacity.
 */
export class SlidingWindow {
  private times: Float64Array;
  private head = 0;
  private count = 0;

  constructor(capacity: number) {
    this.times = new Float64Array(capacity);
  }

  get capacity(): number {
    return this.times.length;
  }

  /** Milliseconds until one more admission fits; 0 when it fits now. */
  waitMs(now: number): number {
    const capacity = this.times.length;
    if (capacity === 0) return WINDOW_MS; // rpm 0: nothing is ever admitted; a minute is as honest as it gets
    if (this.count < capacity) return 0;
    const wait = this.times[this.head]! + WINDOW_MS - now;
    return wait > 0 ? wait : 0;
  }

  /** Records an admission; call only after `waitMs(now)` returned 0. */
  record(now: number): void {
    const capacity = this.times.length;
    if (this.count < capacity) {
      this.times[(this.head + this.count) % capacity] = now;
      this.count++;
    } else {
      this.times[this.head] = now;
      this.head = (this.head + 1) % capacity;
    }
  }

  /** True when no admission lies in the window ending at `now` (the state can be dropped). */
  idle(now: number): boolean {
    if (this.count === 0) return true;
    const newest = this.times[(this.head + this.count - 1) % this.times.length]!;
    return newest <= now - WINDOW_MS;
  }

  /** The same admissions in a window of another capacity (a changed limit keeps its counters). */
  resized(capacity: number): SlidingWindow {
    const next = new SlidingWindow(capacity);
    const keep = Math.min(this.count, capacity);
    for (let i = this.count - keep; i < this.count; i++) {
      next.record(this.times[(this.head + i) % this.times.length]!);
    }
    return next;
  }
}
