import { isObj } from '../protocols/common.js';

/** An item kept, what it is counted as, and when it was kept. */
interface Kept {
  readonly item: Record<string, unknown>;
  readonly bytes: number;
  readonly at: number;
}

/** What a kept item is counted as: its JSON twice (a string's and an object's heap), and a map entry (found in review: 174,000 small items took 71 MB for 32 MiB). */
const weigh = (item: Record<string, unknown>): number => 2 * JSON.stringify(item).length + 256;

/**
 * The assistant messages and reasoning items of translated Responses answers (a model on an
 * Anthropic provider) that a later call may refer to by id. The AI SDK's OpenAI provider stores
 * responses by default (`store: true`) and sends its earlier steps back as `item_reference`
 * items, which only the server that answered can resolve: OpenAI its own answers, the gateway
 * those it translated (found in review: every multi-step tool loop on a Claude model failed at
 * its second step). Kept per API key (another key's items are unknown to it, found in review),
 * in this process only, for at most `ttlMs`, each key's least recently used dropped past
 * `maxBytesPerKey`, and the least recently used key's past `maxBytes` in all.
 */
export class ItemMemory {
  /** Per key, its items; both maps in order of use, least recent first. */
  private readonly keys = new Map<string, Map<string, Kept>>();
  private readonly perKey = new Map<string, number>();
  private bytes = 0;

  constructor(
    private readonly now: () => number,
    readonly maxBytes = 32 * 1024 * 1024,
    readonly maxBytesPerKey = 4 * 1024 * 1024,
    readonly ttlMs = 3_600_000,
  ) {}

  /** Keeps the items of a finished answer that a later call of `keyId` may refer to. */
  remember(keyId: string, output: readonly unknown[]): void {
    for (const item of output) {
      if (!isObj(item) || typeof item.id !== 'string' || (item.type !== 'message' && item.type !== 'reasoning')) continue;
      const bytes = weigh(item);
      if (bytes > this.maxBytesPerKey) continue;
      let items = this.keys.get(keyId);
      if (items === undefined) {
        items = new Map();
        this.perKey.set(keyId, 0);
      } else {
        this.keys.delete(keyId); // now the most recently used key
        this.drop(keyId, items, item.id);
      }
      this.keys.set(keyId, items);
      items.set(item.id, { item, bytes, at: this.now() });
      this.perKey.set(keyId, this.perKey.get(keyId)! + bytes);
      this.bytes += bytes;
      for (const id of items.keys()) {
        if (this.perKey.get(keyId)! <= this.maxBytesPerKey) break;
        this.drop(keyId, items, id);
      }
    }
    for (const [keyId, items] of this.keys) {
      if (this.bytes <= this.maxBytes) break;
      for (const id of items.keys()) {
        if (this.bytes <= this.maxBytes) break;
        this.drop(keyId, items, id);
      }
      if (items.size === 0) this.forgetKey(keyId);
    }
  }

  /**
   * A Responses call's input with the references to this key's kept items (`item_reference`, or
   * an item of an `id` alone) put back whole; the same array when none is. Each item is put back
   * once, and no more than `budget` bytes of them (found in review: 2,000 references to one
   * 200 KB answer in a 98 KB body built a 400 MB request): a reference past that stays, and is
   * refused as any other the provider cannot take.
   */
  resolve(keyId: string, input: unknown, budget: number): unknown {
    if (!Array.isArray(input)) return input;
    const items = this.keys.get(keyId);
    if (items === undefined) return input;
    let out: unknown[] | null = null;
    let used = 0;
    const seen = new Set<string>();
    for (let i = 0; i < input.length; i++) {
      const ref = input[i];
      const id = isObj(ref) && (ref.type === 'item_reference' || (ref.type === undefined && ref.role === undefined)) ? ref.id : undefined;
      if (typeof id !== 'string' || seen.has(id)) continue;
      seen.add(id);
      const kept = this.recall(keyId, items, id);
      if (kept === undefined || used + kept.bytes > budget) continue;
      used += kept.bytes;
      out ??= input.slice();
      out[i] = kept.item;
    }
    return out ?? input;
  }

  /** This key's item `id`, if it is kept and not too old (then the most recently used). */
  private recall(keyId: string, items: Map<string, Kept>, id: string): Kept | undefined {
    const kept = items.get(id);
    if (kept === undefined) return undefined;
    items.delete(id);
    if (this.now() - kept.at > this.ttlMs) {
      this.perKey.set(keyId, this.perKey.get(keyId)! - kept.bytes);
      this.bytes -= kept.bytes;
      if (items.size === 0) this.forgetKey(keyId);
      return undefined;
    }
    items.set(id, kept);
    return kept;
  }

  private drop(keyId: string, items: Map<string, Kept>, id: string): void {
    const kept = items.get(id);
    if (kept === undefined) return;
    items.delete(id);
    this.perKey.set(keyId, this.perKey.get(keyId)! - kept.bytes);
    this.bytes -= kept.bytes;
  }

  private forgetKey(keyId: string): void {
    this.keys.delete(keyId);
    this.perKey.delete(keyId);
  }
}
