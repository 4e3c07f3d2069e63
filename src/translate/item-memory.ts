import { isObj } from '../protocols/common.js';

/**
 * The assistant messages and reasoning items of translated Responses answers (a model on an
 * Anthropic provider), kept so that a later call may refer to them by id. The AI SDK's OpenAI
 * provider stores responses by default (`store: true`) and sends back its earlier steps as
 * `item_reference` items, which only the server that answered can resolve: OpenAI for its own
 * answers, the gateway for the ones it translated (found in review: every multi-step tool loop
 * on a Claude model failed at its second step). Kept per account (another account's id is
 * unknown), in this process only, the least recently used dropped first past `maxBytes`, and
 * for at most `ttlMs`.
 */
export class ItemMemory {
  private readonly items = new Map<string, { item: Record<string, unknown>; bytes: number; at: number }>();
  private bytes = 0;

  constructor(private readonly now: () => number, readonly maxBytes = 32 * 1024 * 1024, readonly ttlMs = 3_600_000) {}

  /** Keeps the items of a finished answer that a later call may refer to. */
  remember(accountId: string, output: readonly unknown[]): void {
    for (const item of output) {
      if (!isObj(item) || typeof item.id !== 'string' || (item.type !== 'message' && item.type !== 'reasoning')) continue;
      const key = `${accountId}\n${item.id}`;
      const bytes = key.length + JSON.stringify(item).length;
      if (bytes > this.maxBytes) continue;
      this.forget(key);
      this.items.set(key, { item, bytes, at: this.now() });
      this.bytes += bytes;
    }
    // Oldest first (a Map keeps the order of insertion; a recall moves its item last).
    for (const key of this.items.keys()) {
      if (this.bytes <= this.maxBytes) break;
      this.forget(key);
    }
  }

  /** The item `id` of this account's answers, if it is still kept. */
  recall(accountId: string, id: string): Record<string, unknown> | undefined {
    const key = `${accountId}\n${id}`;
    const kept = this.items.get(key);
    if (kept === undefined) return undefined;
    this.items.delete(key);
    if (this.now() - kept.at > this.ttlMs) {
      this.bytes -= kept.bytes;
      return undefined;
    }
    this.items.set(key, kept);
    return kept.item;
  }

  /**
   * A Responses call's input with the references this account's kept items resolve put back
   * whole (`item_reference`, or an item of an `id` alone); the same array when none does.
   */
  resolve(accountId: string, input: unknown): unknown {
    if (!Array.isArray(input) || this.items.size === 0) return input;
    let out: unknown[] | null = null;
    for (let i = 0; i < input.length; i++) {
      const item = input[i];
      const id = isObj(item) && (item.type === 'item_reference' || (item.type === undefined && item.role === undefined)) ? item.id : undefined;
      const kept = typeof id === 'string' ? this.recall(accountId, id) : undefined;
      if (kept === undefined) continue;
      out ??= input.slice();
      out[i] = kept;
    }
    return out ?? input;
  }

  private forget(key: string): void {
    const kept = this.items.get(key);
    if (kept === undefined) return;
    this.items.delete(key);
    this.bytes -= kept.bytes;
  }
}
