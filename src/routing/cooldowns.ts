import type { Clock } from '../clock.js';

/**
 * Deployments cooling down after a failure, by key (`<model id>|<provider id>`): read on every
 * routed call without waiting for anything, so a shared store keeps a local copy up to date.
 */
export interface Cooldowns {
  /** Epoch ms the deployment's cooldown ends; 0 when it has none. */
  until(key: string): number;
  /** How many deployments may be cooling down (0: none is, and nothing needs looking up). */
  readonly active: number;
  /** Cools the deployment down for `ms` from now, unless it already is for longer. */
  start(key: string, ms: number): void;
  /** Stops sharing (a shared store's connections). */
  close(): void | Promise<void>;
}

/** Cooldowns of one process. Expired ones are forgotten as they are found, and all at once when the last ends. */
export class MemoryCooldowns implements Cooldowns {
  protected readonly ends = new Map<string, number>();
  /** When the last cooldown known ends: after it, none is left (so `active` drops to 0). */
  private lastEnd = 0;

  constructor(protected readonly clock: Clock) {}

  get active(): number {
    if (this.ends.size > 0 && this.clock.now() >= this.lastEnd) this.ends.clear();
    return this.ends.size;
  }

  until(key: string): number {
    const end = this.ends.get(key);
    if (end === undefined) return 0;
    if (end > this.clock.now()) return end;
    this.ends.delete(key);
    return 0;
  }

  start(key: string, ms: number): void {
    this.extend(key, this.clock.now() + ms);
  }

  /** A later end replaces an earlier one, never the reverse (a second, shorter cooldown keeps the first). */
  protected extend(key: string, end: number): boolean {
    if (end <= (this.ends.get(key) ?? 0)) return false;
    this.ends.set(key, end);
    if (end > this.lastEnd) this.lastEnd = end;
    return true;
  }

  close(): void {}
}
