import type { Clock } from '../clock.js';
import type { RoutingConfig } from '../config/types.js';
import type { Deployment, ModelEntry } from '../directory.js';
import { WrappedExchange } from '../providers/wrapped-exchange.js';
import type { ErrorCode, ErrorDetails, ErrorSpec } from '../errors.js';
import type { Metrics } from '../metrics.js';
import type { Exchange } from '../providers/types.js';
import { MAX_PROVIDER_WAIT_MS } from '../providers/retry.js';
import { chooseDeployment } from './choose.js';
import type { Cooldowns } from './cooldowns.js';

/** Failures that move a call to another deployment (before its first byte): the provider's trouble, not the request's. */
const FAILOVER_KINDS = new Set(['connection', 'timeout', '408', '429', '503', '529', '5xx']);
/** Cooldown ends of a model none of whose deployments is cooling down. */
const NOT_COOLING = new Float64Array(16);

/** What a routed call needs of the gateway. */
export interface RoutingHost {
  readonly cooldowns: Cooldowns;
  readonly clock: Clock;
  readonly metrics: Metrics;
  /** A number in [0, 1): the weighted choice's draw (Math.random; seeded in tests). */
  random(): number;
}

/** The billed call under a routed one: it switches to the deployment an attempt is on. */
export interface ServedExchange extends Exchange {
  serve(model: ModelEntry): void;
}

/**
 * A call of a model with several deployments (CONTRACT section 10). Each attempt goes to one
 * deployment, chosen by weight among those not cooling down, then the fallbacks in order. A
 * failure of the provider before the first byte (connection, timeout, 408, 429, 5xx, 529)
 * cools that deployment down and moves the call to the next one, up to `maxAttempts` in all;
 * any other outcome, and the last failure, reach the client as they would without routing.
 */
export class RoutedCall extends WrappedExchange {
  /** Each deployment gets one attempt: moving on to the next is the retry. */
  override get maxAttempts(): number { return 1; }
  private tried: number;
  private attempts = 0;
  private deployment: Deployment | null = null;
  /** The current attempt's failure as its provider reported it, and its Retry-After. */
  private failure: string | null = null;
  private retryAfterMs: number | null = null;
  /** Whether any attempt's provider had the whole request (it may bill the gateway for it). */
  private delivered = false;

  /**
   * `excluded`: a bit mask of deployments that cannot take this request (their protocol
   * cannot express it). `launch` hands an attempt to its deployment's provider.
   */
  constructor(
    private readonly billed: ServedExchange,
    private readonly deployments: readonly Deployment[],
    excluded: number,
    private readonly routing: RoutingConfig,
    private readonly host: RoutingHost,
    private readonly launch: (deployment: Deployment, index: number, ex: Exchange) => void,
  ) {
    super(billed);
    this.tried = excluded;
  }

  /** Makes the first attempt. */
  start(): void {
    if (!this.next()) this.inner.fail('upstream_error', { message: 'No deployment of this model can take the call.' });
  }

  /** Hands the call to the next deployment; false when there is none or no attempt is left. */
  private next(): boolean {
    if (this.attempts >= this.routing.maxAttempts) return false;
    const deployments = this.deployments;
    const cooldowns = this.host.cooldowns;
    let cooling: ArrayLike<number> = NOT_COOLING;
    if (cooldowns.active > 0) cooling = deployments.map((d) => cooldowns.until(d.key));
    const i = chooseDeployment(deployments, this.tried, cooling, this.host.clock.now(), this.host.random);
    if (i < 0) return false;
    const d = deployments[i]!;
    this.tried |= 1 << i;
    this.attempts++;
    this.deployment = d;
    this.failure = null;
    this.retryAfterMs = null;
    this.billed.serve(d.model);
    this.launch(d, i, this);
    return true;
  }

  /** After a failure the provider reported: cools its deployment down and tries the next; false when the failure stands. */
  private failOver(): boolean {
    const kind = this.failure;
    this.failure = null;
    if (kind === null || !FAILOVER_KINDS.has(kind) || this.inner.aborted || this.inner.res.headersSent) return false;
    const d = this.deployment!;
    const provider = d.model.provider.id;
    // Whole milliseconds (a `retry-after-ms` may have a fraction; Redis keeps TTLs in whole ms).
    const ms = Math.ceil(Math.max(this.routing.cooldownMs, Math.min(this.retryAfterMs ?? 0, MAX_PROVIDER_WAIT_MS)));
    if (ms > 0) {
      this.host.cooldowns.start(d.key, ms);
      this.host.metrics.cooldown(provider);
    }
    if (!this.next()) return false;
    this.host.metrics.failover(provider);
    return true;
  }

  override upstreamFailed(kind: string, retryAfterMs: number | null = null): void {
    this.failure = kind;
    this.retryAfterMs = retryAfterMs;
    this.inner.upstreamFailed(kind, retryAfterMs);
  }

  override noteDelivered(delivered: boolean): void {
    // A provider that had the request may bill it even when a later deployment answers.
    this.delivered ||= delivered;
    this.inner.noteDelivered(this.delivered);
  }

  override fail(code: ErrorCode, details?: ErrorDetails): void {
    if (!this.failOver()) this.inner.fail(code, details);
  }

  override failWith(code: string, spec: ErrorSpec, message: string): void {
    if (!this.failOver()) this.inner.failWith(code, spec, message);
  }
}
