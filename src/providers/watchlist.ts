import { performance } from 'node:perf_hooks';

/** One watched call: fires once at `at` unless removed or refreshed first. */
export class Watch {
  prev: Watch | null = null;
  next: Watch | null = null;
  at = 0;
  linked = false;
  constructor(readonly fire: () => void) {}
}

/**
 * Timeouts of one fixed duration (a provider's `timeoutMs`) for every call in flight: kept in
 * a linked list in the order they were armed, which is the order they expire, with one Node
 * timer for the earliest. Arming, refreshing and removing one is a few pointer moves; a Node
 * timer per call costs several µs on the proxy's hot path (bench/MORE.md).
 */
export class Watchlist {
  private head: Watch | null = null;
  private tail: Watch | null = null;
  private timer: NodeJS.Timeout | null = null;

  constructor(readonly ms: number, private readonly now: () => number = () => performance.now()) {}

  /** Starts (or restarts) `watch`'s full duration. */
  arm(watch: Watch): void {
    if (watch.linked) this.remove(watch);
    watch.at = this.now() + this.ms;
    watch.prev = this.tail;
    watch.next = null;
    if (this.tail === null) this.head = watch;
    else this.tail.next = watch;
    this.tail = watch;
    watch.linked = true;
    if (this.timer === null) this.schedule(this.ms);
  }

  remove(watch: Watch): void {
    if (!watch.linked) return;
    if (watch.prev === null) this.head = watch.next;
    else watch.prev.next = watch.next;
    if (watch.next === null) this.tail = watch.prev;
    else watch.next.prev = watch.prev;
    watch.prev = watch.next = null;
    watch.linked = false;
  }

  private schedule(ms: number): void {
    this.timer = setTimeout(this.expire, Math.max(1, Math.ceil(ms)));
    this.timer.unref(); // a watched call holds a socket, which keeps the process up
  }

  private readonly expire = (): void => {
    this.timer = null;
    const now = this.now();
    while (this.head !== null && this.head.at <= now) {
      const due = this.head;
      this.remove(due);
      due.fire();
    }
    if (this.head !== null) this.schedule(this.head.at - now);
  };
}
