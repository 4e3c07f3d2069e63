/**
 * Prometheus metrics, written without a dependency. Label sets are bounded: routes, statuses,
 * reasons, providers and models all come from the code or the config, never from a request
 * (no per-key labels). Counting is a few map lookups per request; the text is built per scrape.
 */

import { addMicro, microToUsd } from './money.js';

const DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

class Histogram {
  readonly counts = new Float64Array(DURATION_BUCKETS.length);
  sum = 0;
  count = 0;

  observe(seconds: number): void {
    this.sum += seconds;
    this.count++;
    for (let i = 0; i < DURATION_BUCKETS.length; i++) {
      if (seconds <= DURATION_BUCKETS[i]!) {
        this.counts[i]!++;
        return;
      }
    }
  }
}

function escape(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

function labels(pairs: Record<string, string>): string {
  const parts = Object.entries(pairs).map(([k, v]) => `${k}="${escape(v)}"`);
  return parts.length === 0 ? '' : `{${parts.join(',')}}`;
}

/** A counter keyed by a label tuple joined with \t (label values never contain tabs here). */
class LabeledCounter {
  readonly values = new Map<string, number>();
  constructor(readonly name: string, readonly help: string, readonly labelNames: string[]) {}

  add(key: string, n = 1): void {
    this.values.set(key, (this.values.get(key) ?? 0) + n);
  }

  render(out: string[]): void {
    out.push(`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`);
    for (const [key, value] of this.values) out.push(`${this.name}${labelsOf(this.labelNames, key)} ${value}`);
  }
}

function labelsOf(names: string[], key: string): string {
  const values = key.split('\t');
  return labels(Object.fromEntries(names.map((n, i) => [n, values[i] ?? ''])));
}

class LabeledHistogram {
  readonly values = new Map<string, Histogram>();
  constructor(readonly name: string, readonly help: string, readonly labelNames: string[]) {}

  observe(key: string, seconds: number): void {
    let h = this.values.get(key);
    if (h === undefined) {
      h = new Histogram();
      this.values.set(key, h);
    }
    h.observe(seconds);
  }

  render(out: string[]): void {
    out.push(`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`);
    for (const [key, h] of this.values) {
      const base = Object.fromEntries(this.labelNames.map((n, i) => [n, key.split('\t')[i] ?? '']));
      let cumulative = 0;
      for (let i = 0; i < DURATION_BUCKETS.length; i++) {
        cumulative += h.counts[i]!;
        out.push(`${this.name}_bucket${labels({ ...base, le: String(DURATION_BUCKETS[i]) })} ${cumulative}`);
      }
      out.push(`${this.name}_bucket${labels({ ...base, le: '+Inf' })} ${h.count}`);
      out.push(`${this.name}_sum${labels(base)} ${h.sum}`);
      out.push(`${this.name}_count${labels(base)} ${h.count}`);
    }
  }
}

export interface Gauges {
  inFlight(): number;
  limiterUp(): boolean;
  ledgerUp(): boolean;
  draining(): boolean;
  /** Log lines lost (the log reader did not keep up, or a write failed). */
  logDropped(): number;
}

/** Per-route request counts and latency: the hot path, so no string building per request. */
interface RouteStats {
  /** Requests by status code (an array, not a Map: one store per request). */
  byStatus: Float64Array;
  duration: Histogram;
}

/** Status codes counted: HTTP's own range (the gateway answers nothing else). */
const STATUSES = 600;

export class Metrics {
  private readonly routes = new Map<string, RouteStats>();
  private readonly admissions = new LabeledCounter('mg_admissions_total', 'Limiter decisions: admitted, or the reason of a rejection.', ['result']);
  /** Apart from mg_admissions_total, which already counted these calls as admitted: one decision per request there. */
  private readonly raiseRefusals = new LabeledCounter('mg_raise_refusals_total', 'Calls admitted on their estimate and refused when their input count raised the reservation, by reason.', ['reason']);
  private readonly upstreamDuration = new LabeledHistogram('mg_upstream_duration_seconds', 'Time to the provider\'s response headers, by provider.', ['provider']);
  private readonly upstreamErrors = new LabeledCounter('mg_upstream_errors_total', 'Failed provider attempts, by provider and kind.', ['provider', 'kind']);
  private readonly attempts = new LabeledCounter('mg_upstream_attempts_total', 'Calls handed to a provider (every call, and each further deployment a routed call tries), by provider.', ['provider']);
  private readonly failovers = new LabeledCounter('mg_failovers_total', 'Routed calls moved off a provider to another deployment, by the provider that failed.', ['provider']);
  private readonly cooldowns = new LabeledCounter('mg_cooldowns_total', 'Deployments put in cooldown after a failure, by provider.', ['provider']);
  /** Per model: tokens in and out, and spend (the hot path adds to numbers; labels are built per scrape). */
  private readonly models = new Map<string, { input: number; output: number; spendMicro: number }>();
  private readonly startS = Date.now() / 1000;

  constructor(private readonly gauges: Gauges) {}

  request(route: string, status: number, seconds: number): void {
    let stats = this.routes.get(route);
    if (stats === undefined) {
      stats = { byStatus: new Float64Array(STATUSES), duration: new Histogram() };
      this.routes.set(route, stats);
    }
    stats.byStatus[status >= 0 && status < STATUSES ? status : 0]!++;
    stats.duration.observe(seconds);
  }

  admission(result: string): void {
    this.admissions.add(result);
  }

  raiseRefusal(reason: string): void {
    this.raiseRefusals.add(reason);
  }

  upstream(provider: string, seconds: number): void {
    this.upstreamDuration.observe(provider, seconds);
  }

  upstreamError(provider: string, kind: string): void {
    this.upstreamErrors.add(`${provider}\t${kind}`);
  }

  attempt(provider: string): void {
    this.attempts.add(provider);
  }

  failover(provider: string): void {
    this.failovers.add(provider);
  }

  cooldown(provider: string): void {
    this.cooldowns.add(provider);
  }

  charge(model: string, inputTokens: number, outputTokens: number, costMicro: number): void {
    let m = this.models.get(model);
    if (m === undefined) {
      m = { input: 0, output: 0, spendMicro: 0 };
      this.models.set(model, m);
    }
    m.input += inputTokens;
    m.output += outputTokens;
    // Integer micro-dollars, turned into dollars only when shown (found in review: summed as
    // dollars, 980,143 micro-dollars showed as 0.9801429999999995).
    m.spendMicro = addMicro(m.spendMicro, costMicro);
  }

  /** The Prometheus text exposition (version 0.0.4). */
  render(): string {
    const out: string[] = [];
    const requests = new LabeledCounter('mg_requests_total', 'Requests answered, by route and status.', ['route', 'status']);
    const duration = new LabeledHistogram('mg_request_duration_seconds', 'Time from request to the end of the answer, by route.', ['route']);
    for (const [route, stats] of this.routes) {
      stats.byStatus.forEach((n, status) => {
        if (n > 0) requests.add(`${route}\t${status}`, n);
      });
      duration.values.set(route, stats.duration);
    }
    requests.render(out);
    duration.render(out);
    this.admissions.render(out);
    this.raiseRefusals.render(out);
    this.upstreamDuration.render(out);
    this.upstreamErrors.render(out);
    this.attempts.render(out);
    this.failovers.render(out);
    this.cooldowns.render(out);
    const tokens = new LabeledCounter('mg_tokens_total', 'Tokens metered, by model and direction.', ['model', 'direction']);
    const spend = new LabeledCounter('mg_spend_usd_total', 'Money charged, by model (US dollars).', ['model']);
    for (const [model, m] of this.models) {
      tokens.add(`${model}\tinput`, m.input);
      tokens.add(`${model}\toutput`, m.output);
      spend.add(model, microToUsd(m.spendMicro));
    }
    tokens.render(out);
    spend.render(out);
    out.push('# HELP mg_log_dropped_total Log lines dropped because the log reader did not keep up (or a write failed); requests are never held for the log.',
      '# TYPE mg_log_dropped_total counter', `mg_log_dropped_total ${this.gauges.logDropped()}`);
    const gauge = (name: string, help: string, value: number) => out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name} ${value}`);
    gauge('mg_in_flight_requests', 'Model calls being answered now.', this.gauges.inFlight());
    gauge('mg_limiter_up', '1 when the limiter store answers.', this.gauges.limiterUp() ? 1 : 0);
    gauge('mg_ledger_up', '1 when the ledger can record.', this.gauges.ledgerUp() ? 1 : 0);
    gauge('mg_draining', '1 while shutting down.', this.gauges.draining() ? 1 : 0);
    gauge('process_resident_memory_bytes', 'Resident memory.', process.memoryUsage.rss());
    gauge('process_start_time_seconds', 'Start time of the process (Unix seconds).', Math.floor(this.startS));
    return `${out.join('\n')}\n`;
  }
}
