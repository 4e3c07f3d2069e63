import type { GatewayConfig, Limit, ModelConfig, ProviderConfig } from './config/types.js';
import { isFree, type Price } from './money.js';

/** An account with its plan's limits resolved (account overrides win). */
export interface AccountEntry {
  readonly id: string;
  readonly plan: string;
  readonly rpm: Limit;
  readonly concurrency: Limit;
  readonly dailyCapMicro: Limit;
  /** Prepaid accounts are refused once their balance is spent. */
  readonly prepaid: boolean;
  /** The one-time credit given when the account first appears in the ledger (0 if postpaid). */
  readonly initialCreditMicro: number;
}

export interface KeyEntry {
  readonly id: string;
  /** SHA-256 of the key's secret (lowercase hex). */
  readonly sha256: string;
  readonly account: AccountEntry;
  /** Per-key limits, counted in addition to the account's; null = none. */
  readonly rpm: Limit;
  readonly concurrency: Limit;
  readonly disabled: boolean;
  /** null = every model. */
  readonly models: ReadonlySet<string> | null;
  /** The `/v1/models` answer for this key, built once per config (hot path). */
  readonly modelsBody: Buffer;
}

/** One place a model is served (CONTRACT section 10). */
export interface Deployment {
  /** The model as this deployment serves it: its provider and upstream model name. */
  readonly model: ModelEntry;
  readonly weight: number;
  readonly fallback: boolean;
  /** What its cooldown is kept under: `<model id>|<provider id>` (ids never hold a `|`). */
  readonly key: string;
}

export interface ModelEntry {
  /** The id the client used (a `-thinking` variant keeps its suffix here). */
  readonly id: string;
  /** The configured model this id resolves to (access and price come from it). */
  readonly baseId: string;
  /** The provider of the call: the first deployment's, or the one a routed call is on. */
  readonly provider: ProviderConfig;
  readonly upstreamModel: string;
  /** Where the model is served, in config order: one entry unless it names `deployments`. */
  readonly deployments: readonly Deployment[];
  readonly price: Price;
  readonly billable: boolean;
  readonly maxOutputTokens: number;
  /** The largest output limit a request may set. */
  readonly outputTokenLimit: number;
  /** True for a `-thinking` variant: extended thinking is turned on upstream. */
  readonly thinking: boolean;
  /** Output tokens a second of a model that reasons unseen (0: none given): the estimate of an abnormal end. */
  readonly reasoningTokensPerSecond: number;
  /** The `/v1/models/{id}` answer. */
  readonly objectBody: Buffer;
}

const THINKING = '-thinking';

/**
 * The runtime view of a config: keys by hash, accounts with resolved limits, models with
 * their precomputed answers. Immutable; a reload builds a new one (limiter state is keyed by
 * id and lives elsewhere, so counters survive).
 */
export class Directory {
  readonly accounts = new Map<string, AccountEntry>();
  readonly keys = new Map<string, KeyEntry>();
  private readonly byHash = new Map<string, KeyEntry>();
  private readonly models = new Map<string, ModelEntry>();
  private readonly variants = new Map<string, ModelEntry>();

  constructor(readonly config: GatewayConfig, createdS: number) {
    for (const [id, m] of config.models) {
      const provider = config.providers.get(m.provider)!;
      const entry: ModelEntry = {
        id, baseId: id, provider, upstreamModel: m.upstreamModel, deployments: [], price: m.price, billable: !isFree(m.price),
        maxOutputTokens: m.maxOutputTokens, outputTokenLimit: m.outputTokenLimit, thinking: false, reasoningTokensPerSecond: m.reasoningTokensPerSecond,
        objectBody: Buffer.from(JSON.stringify(modelObject(id, createdS, m, provider.id))),
      };
      this.models.set(id, withDeployments(entry, m, config));
      if (!id.endsWith(THINKING)) this.variants.set(id + THINKING, withDeployments({ ...entry, id: id + THINKING, thinking: true }, m, config));
    }
    for (const [id, a] of config.accounts) {
      const plan = config.plans.get(a.plan)!;
      this.accounts.set(id, {
        id, plan: a.plan,
        rpm: a.rpm !== undefined ? a.rpm : plan.rpm,
        concurrency: a.concurrency !== undefined ? a.concurrency : plan.concurrency,
        dailyCapMicro: a.dailyCapMicro !== undefined ? a.dailyCapMicro : plan.dailyCapMicro,
        prepaid: a.balanceMicro !== null,
        initialCreditMicro: a.balanceMicro ?? 0,
      });
    }
    // Keys with the same model set share one answer body.
    const bodies = new Map<string, Buffer>();
    const allIds = [...this.models.keys()];
    for (const [id, k] of config.keys) {
      const visible = (k.models ?? allIds).filter((m) => !m.endsWith(THINKING));
      const listed = [...new Set(visible)].sort();
      const signature = listed.join('\n');
      let body = bodies.get(signature);
      if (body === undefined) {
        const data = listed.map((m) => modelObject(m, createdS, config.models.get(m)!, this.models.get(m)!.provider.id));
        // Anthropic's list fields too: one page, newest-first order not promised.
        body = Buffer.from(JSON.stringify({ object: 'list', data, has_more: false, first_id: listed[0] ?? null, last_id: listed.at(-1) ?? null }));
        bodies.set(signature, body);
      }
      const entry: KeyEntry = {
        id, sha256: k.sha256, account: this.accounts.get(k.account)!, rpm: k.rpm, concurrency: k.concurrency,
        disabled: k.disabled, models: k.models === null ? null : new Set(k.models), modelsBody: body,
      };
      this.keys.set(id, entry);
      this.byHash.set(k.sha256, entry);
    }
  }

  /**
   * `key` as this directory has it now (limits, account, models), or undefined when it was
   * deleted, disabled or given another secret since it was looked up (an admin change while
   * its request's body was still arriving: the key stops working at once, CONTRACT section 5).
   */
  current(key: KeyEntry): KeyEntry | undefined {
    const now = this.keys.get(key.id);
    if (now === key) return key;
    return now === undefined || now.disabled || now.sha256 !== key.sha256 ? undefined : now;
  }

  /** The key whose SHA-256 (lowercase hex) is given, or undefined. */
  keyByHash(sha256: string): KeyEntry | undefined {
    return this.byHash.get(sha256);
  }

  /**
   * The model `id` as this key may use it, or undefined when it is unknown or not allowed
   * (the two are indistinguishable to the caller: no existence leak). `-thinking` variants
   * resolve when their base model is allowed.
   */
  resolveModel(key: KeyEntry, id: string): ModelEntry | undefined {
    const entry = this.models.get(id) ?? this.variants.get(id);
    if (entry === undefined) return undefined;
    if (key.models !== null && !key.models.has(entry.baseId)) return undefined;
    return entry;
  }

  /** A listed model (no `-thinking` variants), as `/v1/models/{id}` answers it. */
  listedModel(key: KeyEntry, id: string): ModelEntry | undefined {
    const entry = this.models.get(id);
    if (entry === undefined || id.endsWith(THINKING)) return undefined;
    if (key.models !== null && !key.models.has(id)) return undefined;
    return entry;
  }
}

/**
 * `entry` with its deployments, each a copy of it on its own provider (a model of one provider
 * is its own single deployment).
 */
function withDeployments(entry: ModelEntry, m: ModelConfig, config: GatewayConfig): ModelEntry {
  const deployments: Deployment[] = [];
  const self: ModelEntry = { ...entry, deployments };
  for (const d of m.deployments) {
    const model = d === m.deployments[0] ? self : { ...self, provider: config.providers.get(d.provider)!, upstreamModel: d.upstreamModel };
    deployments.push({ model, weight: d.weight, fallback: d.fallback, key: `${m.id}|${d.provider}` });
  }
  return self;
}

/**
 * A model as both official SDKs read it: SPEC's `id` and `object` with OpenAI's `created` and
 * `owned_by`, and Anthropic's `type`, `display_name`, `created_at` (RFC 3339) and `max_tokens`.
 */
function modelObject(id: string, created: number, model: ModelConfig, ownedBy: string) {
  return {
    id, object: 'model', created, owned_by: ownedBy,
    type: 'model', display_name: model.displayName, created_at: new Date(created * 1000).toISOString(), max_tokens: model.outputTokenLimit,
  };
}
