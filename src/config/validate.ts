import { hash } from 'node:crypto';
import { isAbsolute, resolve } from 'node:path';
import { LOG_BUFFER_BYTES } from '../log.js';
import { FREE, isFree, MAX_PRICE_MICRO, type Price } from '../money.js';
import { amountField, boolField, capField, ENTITY_ID, ENTITY_ID_RULE, limitField, modelsField, NAME_ID, NAME_ID_RULE } from './fields.js';
import type {
  AccountConfig, AuthHeader, DeploymentConfig, GatewayConfig, KeyConfig, LedgerConfig, Limit, LimiterConfig, ModelConfig,
  OutputLimitField, PlanConfig, Protocol, ProviderConfig, RoutingConfig, ServerConfig,
} from './types.js';

export interface ValidateOptions {
  /** Folder that relative paths (ledger.dir) resolve against. */
  baseDir: string;
  /** Environment that `apiKeyEnv` names are read from. */
  env: Record<string, string | undefined>;
}

export type ValidateResult =
  | { ok: true; config: GatewayConfig; warnings: string[] }
  | { ok: false; errors: string[] };

type Obj = Record<string, unknown>;

const SERVER_DEFAULTS: ServerConfig = {
  host: '127.0.0.1', port: 8080, maxBodyBytes: 4_194_304, requestTimeoutMs: 30_000,
  drainDelayMs: 0, drainTimeoutMs: 30_000, clientIdleTimeoutMs: 120_000, headersTimeoutMs: 10_000, maxConnections: 10_000,
  metrics: true, logLevel: 'info', logBufferBytes: LOG_BUFFER_BYTES,
};

export { MAX_LIMIT } from './fields.js';
/** The most web searches a model's price may bill every call (OpenAI's search models: one). */
const MAX_SEARCHES_PER_CALL = 100;

/** The largest `outputTokenLimit` a model may have. */
export const MAX_OUTPUT_TOKEN_LIMIT = 10_000_000;

const DEFAULT_BASE_URL: Record<Protocol, string> = {
  openai: 'https://api.openai.com/v1', anthropic: 'https://api.anthropic.com', mock: '',
};

const HEX64 = /^[0-9a-f]{64}$/;
/** A PostgreSQL schema name the gateway may quote into its statements. */
const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,56}$/;

/** `a.b.c`, with `["..."]` for segments that would not read well after a dot. */
export function joinPath(base: string, segment: string | number): string {
  if (typeof segment === 'number') return `${base}[${segment}]`;
  const part = /^[A-Za-z0-9_$-]+$/.test(segment) ? segment : `[${JSON.stringify(segment)}]`;
  if (base === '') return part;
  return part.startsWith('[') ? base + part : `${base}.${part}`;
}

const ENTITY = { pattern: ENTITY_ID, rule: ENTITY_ID_RULE };
const NAMES = { pattern: NAME_ID, rule: NAME_ID_RULE };

function isObj(value: unknown): value is Obj {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Collects every problem, each named by its JSON path, so one run reports them all. */
class Checker {
  readonly errors: string[] = [];
  readonly warnings: string[] = [];

  fail(path: string, message: string): void {
    this.errors.push(`${path || '(root)'}: ${message}`);
  }

  object(path: string, value: unknown, allowed: readonly string[]): Obj | null {
    if (!isObj(value)) {
      this.fail(path, 'must be an object');
      return null;
    }
    for (const key of Object.keys(value)) {
      if (!allowed.includes(key)) this.fail(joinPath(path, key), `unknown key (allowed: ${allowed.join(', ')})`);
    }
    return value;
  }

  /**
   * An object whose keys are ids (plans, accounts, ...). Only its own keys are read (JSON makes
   * `__proto__` an own key like any other, and every id ends up as the key of a Map).
   */
  record(path: string, value: unknown, id: { pattern: RegExp; rule: string } = ENTITY): Obj {
    if (value === undefined) return {};
    if (!isObj(value)) {
      this.fail(path, 'must be an object keyed by id');
      return {};
    }
    for (const key of Object.keys(value)) {
      if (!id.pattern.test(key)) this.fail(joinPath(path, key), `id ${id.rule}`);
    }
    return value;
  }

  int(path: string, value: unknown, min: number, max: number, fallback: number): number {
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
      this.fail(path, `must be an integer from ${min} to ${max}`);
      return fallback;
    }
    return value;
  }

  bool(path: string, value: unknown, fallback: boolean): boolean {
    if (value === undefined) return fallback;
    const r = boolField(value);
    if (!r.ok) {
      this.fail(path, r.message);
      return fallback;
    }
    return r.value;
  }

  string(path: string, value: unknown, fallback: string): string {
    if (value === undefined) return fallback;
    if (typeof value !== 'string' || value === '') {
      this.fail(path, 'must be a non-empty string');
      return fallback;
    }
    return value;
  }

  /** A field checked by one of fields.ts's rules; undefined when absent or wrong (then reported). */
  field<T>(path: string, value: unknown, rule: (v: unknown) => { ok: true; value: T } | { ok: false; message: string }): T | undefined {
    if (value === undefined) return undefined;
    const r = rule(value);
    if (!r.ok) {
      this.fail(path, r.message);
      return undefined;
    }
    return r.value;
  }

  /** A limit: a non-negative integer or "unlimited"; undefined when absent. */
  limit(path: string, value: unknown): Limit | undefined {
    return this.field(path, value, limitField);
  }

  /** A USD amount (number or decimal string) as micro-dollars, >= 0; undefined when absent. */
  money(path: string, value: unknown): number | undefined {
    return this.field(path, value, amountField);
  }

  /** A daily cap: an amount or "unlimited"; undefined when absent. */
  cap(path: string, value: unknown): Limit | undefined {
    return this.field(path, value, capField);
  }
}

/** Validates a parsed config file (or the demo object) against CONTRACT section 2. */
export function validateConfig(raw: unknown, options: ValidateOptions): ValidateResult {
  const c = new Checker();
  const root = c.object('', raw, ['server', 'limiter', 'ledger', 'routing', 'plans', 'accounts', 'keys', 'models', 'providers']);
  if (root === null) return { ok: false, errors: c.errors };

  const server = checkServer(c, root.server);
  const limiter = checkLimiter(c, root.limiter);
  const ledger = checkLedger(c, root.ledger, options.baseDir);
  const routing = checkRouting(c, root.routing);
  const providers = checkProviders(c, c.record('providers', root.providers, NAMES), options.env);
  const models = checkModels(c, c.record('models', root.models, NAMES), providers);
  const plans = checkPlans(c, c.record('plans', root.plans));
  const accounts = checkAccounts(c, c.record('accounts', root.accounts), plans);
  const keys = checkKeys(c, c.record('keys', root.keys), accounts, models);

  if (c.errors.length > 0) return { ok: false, errors: c.errors };
  return { ok: true, config: { server, limiter, ledger, routing, plans, accounts, keys, models, providers }, warnings: c.warnings };
}

function checkServer(c: Checker, value: unknown): ServerConfig {
  if (value === undefined) return { ...SERVER_DEFAULTS };
  const o = c.object('server', value, Object.keys(SERVER_DEFAULTS));
  if (o === null) return { ...SERVER_DEFAULTS };
  const d = SERVER_DEFAULTS;
  return {
    host: c.string('server.host', o.host, d.host),
    port: c.int('server.port', o.port, 0, 65535, d.port),
    // A body is decoded to one string (of at most as many characters as it has bytes), and
    // V8's longest string is 0x1fffffe8 characters (found in review: a body over it was a 500
    // with a stack in the log); 500 MiB leaves room for what the gateway adds to a body.
    maxBodyBytes: c.int('server.maxBodyBytes', o.maxBodyBytes, 1, MAX_BODY_BYTES, d.maxBodyBytes),
    requestTimeoutMs: c.int('server.requestTimeoutMs', o.requestTimeoutMs, 1, 3_600_000, d.requestTimeoutMs),
    drainDelayMs: c.int('server.drainDelayMs', o.drainDelayMs, 0, 3_600_000, d.drainDelayMs),
    drainTimeoutMs: c.int('server.drainTimeoutMs', o.drainTimeoutMs, 0, 3_600_000, d.drainTimeoutMs),
    clientIdleTimeoutMs: c.int('server.clientIdleTimeoutMs', o.clientIdleTimeoutMs, 1, 3_600_000, d.clientIdleTimeoutMs),
    headersTimeoutMs: c.int('server.headersTimeoutMs', o.headersTimeoutMs, 1, 3_600_000, d.headersTimeoutMs),
    maxConnections: c.int('server.maxConnections', o.maxConnections, 1, 10_000_000, d.maxConnections),
    metrics: c.bool('server.metrics', o.metrics, d.metrics),
    logLevel: checkLevel(c, o.logLevel),
    logBufferBytes: c.int('server.logBufferBytes', o.logBufferBytes, 65_536, 1 << 30, d.logBufferBytes),
  };
}

function checkLevel(c: Checker, value: unknown): ServerConfig['logLevel'] {
  if (value === undefined) return 'info';
  if (value === 'debug' || value === 'info' || value === 'warn' || value === 'error') return value;
  c.fail('server.logLevel', 'must be "debug", "info", "warn" or "error"');
  return 'info';
}

function checkLimiter(c: Checker, value: unknown): LimiterConfig {
  if (value === undefined) return { store: 'memory' };
  const o = c.object('limiter', value, ['store', 'url', 'prefix', 'timeoutMs', 'leaseMs']);
  if (o === null) return { store: 'memory' };
  if (o.store === undefined || o.store === 'memory') {
    for (const key of ['url', 'prefix', 'timeoutMs', 'leaseMs']) {
      if (o[key] !== undefined) c.fail(`limiter.${key}`, 'applies only to store "redis"');
    }
    return { store: 'memory' };
  }
  if (o.store !== 'redis') {
    c.fail('limiter.store', `must be "memory" or "redis", got ${shown(o.store)}`);
    return { store: 'memory' };
  }
  if (o.url === undefined) c.fail('limiter.url', 'is required when store is "redis"');
  const url = c.string('limiter.url', o.url, '');
  if (url !== '' && !isRedisUrl(url)) c.fail('limiter.url', `must be a redis://, rediss:// or unix:// URL, got ${shown(url)}`);
  return {
    store: 'redis',
    url,
    prefix: c.string('limiter.prefix', o.prefix, 'mg:'),
    timeoutMs: c.int('limiter.timeoutMs', o.timeoutMs, 1, 60_000, 100),
    leaseMs: c.int('limiter.leaseMs', o.leaseMs, 300, 3_600_000, 30_000),
  };
}

function checkLedger(c: Checker, value: unknown, baseDir: string): LedgerConfig {
  const fileAt = (dir: string): LedgerConfig => ({ store: 'file', dir: isAbsolute(dir) ? dir : resolve(baseDir, dir) });
  if (value === undefined) return fileAt('data');
  const o = c.object('ledger', value, ['store', 'dir', 'url', 'schema']);
  if (o === null) return { store: 'memory' };
  const onlyFor = (store: string, keys: string[]) => {
    for (const key of keys) if (o[key] !== undefined) c.fail(`ledger.${key}`, `applies only to store "${store}"`);
  };
  if (o.store === 'memory') {
    onlyFor('file', ['dir']);
    onlyFor('postgres', ['url', 'schema']);
    return { store: 'memory' };
  }
  if (o.store === 'postgres') {
    onlyFor('file', ['dir']);
    if (o.url === undefined) c.fail('ledger.url', 'is required when store is "postgres"');
    const schema = c.string('ledger.schema', o.schema, 'model_gateway');
    if (!SCHEMA_NAME.test(schema)) c.fail('ledger.schema', 'must be a lower-case SQL name: a letter or _, then letters, digits or _ (at most 57: its NOTIFY channel adds "_admin" within the 63 PostgreSQL allows)');
    return { store: 'postgres', url: c.string('ledger.url', o.url, ''), schema };
  }
  if (o.store !== undefined && o.store !== 'file') {
    c.fail('ledger.store', `must be "memory", "file" or "postgres", got ${shown(o.store)}`);
    return { store: 'memory' };
  }
  onlyFor('postgres', ['url', 'schema']);
  return fileAt(c.string('ledger.dir', o.dir, 'data'));
}

function checkRouting(c: Checker, value: unknown): RoutingConfig {
  const o = value === undefined ? {} : c.object('routing', value, ['maxAttempts', 'cooldownMs']);
  return {
    maxAttempts: c.int('routing.maxAttempts', o?.maxAttempts, 1, MAX_DEPLOYMENTS, 3),
    cooldownMs: c.int('routing.cooldownMs', o?.cooldownMs, 0, 86_400_000, 5000),
  };
}

/** The most deployments a model may have (a call's tried set is a bit mask). */
export const MAX_DEPLOYMENTS = 16;
/** The largest deployment weight. */
const MAX_WEIGHT = 1_000_000;

const PROVIDER_KEYS: Record<Protocol, readonly string[]> = {
  openai: ['protocol', 'baseUrl', 'apiKeyEnv', 'authHeader', 'headers', 'timeoutMs', 'streamIdleTimeoutMs', 'outputLimitField'],
  anthropic: ['protocol', 'baseUrl', 'apiKeyEnv', 'authHeader', 'headers', 'timeoutMs', 'streamIdleTimeoutMs'],
  mock: ['protocol', 'latencyMs', 'tokensPerSecond'],
};

/** Headers the gateway sets itself (framing, routing, credentials, what it reads answers by): not overridable. */
const OWN_HEADERS = new Set([
  'host', 'content-length', 'content-type', 'transfer-encoding', 'connection', 'keep-alive', 'upgrade', 'te', 'trailer', 'expect',
  'accept', 'accept-encoding', 'authorization', 'x-api-key', 'api-key', 'x-request-id', 'proxy-authorization',
]);
const CREDENTIAL_HEADERS = new Set(['authorization', 'x-api-key', 'api-key']);
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$/;
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]{0,4096}$/;
/** A provider key: what a header value may hold, of any length (a JWT can be long). */
const KEY_VALUE = /^[\t\x20-\x7e\x80-\xff]+$/;

/** A provider's static `headers` (`{name: value}`), as lowercase name/value pairs. */
function staticHeaders(c: Checker, path: string, value: unknown): string[] {
  if (value === undefined) return [];
  if (!isObj(value)) {
    c.fail(path, 'must be an object of header names to values');
    return [];
  }
  const out: string[] = [];
  for (const [name, v] of Object.entries(value)) {
    const at = joinPath(path, name);
    const lower = name.toLowerCase();
    if (!TOKEN.test(name)) c.fail(at, 'is not a valid header name');
    else if (OWN_HEADERS.has(lower)) c.fail(at, `is set by the gateway itself${CREDENTIAL_HEADERS.has(lower) ? ' (authHeader says where the key goes)' : ''}`);
    else if (typeof v !== 'string' || !HEADER_VALUE.test(v)) c.fail(at, 'must be a string of at most 4096 characters without line breaks');
    else out.push(lower, v);
  }
  return out;
}

function checkProviders(c: Checker, record: Obj, env: ValidateOptions['env']): Map<string, ProviderConfig> {
  const out = new Map<string, ProviderConfig>();
  for (const [id, value] of Object.entries(record)) {
    const path = joinPath('providers', id);
    const protocol = isObj(value) ? value.protocol : undefined;
    if (protocol !== 'openai' && protocol !== 'anthropic' && protocol !== 'mock') {
      if (isObj(value)) c.fail(`${path}.protocol`, 'must be "openai", "anthropic" or "mock"');
      else c.fail(path, 'must be an object');
      continue;
    }
    const o = c.object(path, value, PROVIDER_KEYS[protocol]);
    if (o === null) continue;
    let baseUrl = DEFAULT_BASE_URL[protocol];
    if (protocol !== 'mock' && o.baseUrl !== undefined) {
      baseUrl = c.string(`${path}.baseUrl`, o.baseUrl, baseUrl);
      let url: URL | null = null;
      try { url = new URL(baseUrl); } catch { /* reported below */ }
      if (url === null || (url.protocol !== 'http:' && url.protocol !== 'https:') || baseUrl.trim() !== baseUrl) {
        c.fail(`${path}.baseUrl`, `must be an http:// or https:// URL, got ${shown(o.baseUrl)}`);
      } else if (baseUrl.includes('?') || baseUrl.includes('#') || url.username !== '' || url.password !== '') {
        // The gateway appends the endpoint's path: a query or fragment would swallow it, and
        // credentials in the URL are never sent (found in review: each misrouted every call).
        c.fail(`${path}.baseUrl`, 'must have no query, fragment or credentials (the provider\'s key goes in apiKeyEnv)');
      }
      baseUrl = baseUrl.replace(/\/+$/, '');
    }
    const apiKeys: string[] = [];
    if (o.apiKeyEnv !== undefined) {
      // One variable, or several (a key is chosen per call; a 429 moves the next attempt to another).
      const names = Array.isArray(o.apiKeyEnv) ? o.apiKeyEnv : [o.apiKeyEnv];
      if (names.length === 0 || names.length > 64) c.fail(`${path}.apiKeyEnv`, 'must name 1 to 64 environment variables');
      names.forEach((raw, i) => {
        const at = Array.isArray(o.apiKeyEnv) ? `${path}.apiKeyEnv[${i}]` : `${path}.apiKeyEnv`;
        const name = c.string(at, raw, '');
        // An own property, and a string: `apiKeyEnv: "toString"` names no variable.
        // Surrounding whitespace dropped: a key read from a file often ends with a newline,
        // which no HTTP header can carry (found in review: every call was a 500).
        const value = name !== '' && Object.hasOwn(env, name) ? env[name]?.trim() : undefined;
        if (typeof value === 'string' && value !== '' && KEY_VALUE.test(value)) apiKeys.push(value);
        else if (typeof value === 'string' && value !== '') c.fail(at, `environment variable ${name} holds characters an HTTP header cannot carry`);
        else if (name !== '') c.fail(at, `environment variable ${name} is not set`);
      });
    }
    let authHeader: AuthHeader | null = null;
    if (o.authHeader !== undefined) {
      if (o.authHeader === 'bearer' || o.authHeader === 'x-api-key' || o.authHeader === 'api-key') authHeader = o.authHeader;
      else c.fail(`${path}.authHeader`, `must be "bearer", "x-api-key" or "api-key", got ${shown(o.authHeader)}`);
    }
    let outputLimitField: OutputLimitField = 'max_completion_tokens';
    if (o.outputLimitField !== undefined) {
      if (o.outputLimitField === 'max_completion_tokens' || o.outputLimitField === 'max_tokens') outputLimitField = o.outputLimitField;
      else c.fail(`${path}.outputLimitField`, `must be "max_completion_tokens" or "max_tokens", got ${shown(o.outputLimitField)}`);
    }
    out.set(id, {
      id, protocol, baseUrl, apiKeys, authHeader, headers: staticHeaders(c, `${path}.headers`, o.headers), outputLimitField,
      timeoutMs: c.int(`${path}.timeoutMs`, o.timeoutMs, 1, 3_600_000, 60_000),
      streamIdleTimeoutMs: c.int(`${path}.streamIdleTimeoutMs`, o.streamIdleTimeoutMs, 1, 3_600_000, 120_000),
      latencyMs: c.int(`${path}.latencyMs`, o.latencyMs, 0, 600_000, 0),
      tokensPerSecond: c.int(`${path}.tokensPerSecond`, o.tokensPerSecond, 0, 1_000_000, 0),
    });
  }
  return out;
}

function checkPrice(c: Checker, path: string, value: unknown): Price {
  if (value === undefined || value === 'free') return FREE;
  const o = c.object(path, value, ['inputPerMillion', 'outputPerMillion', 'cacheReadPerMillion', 'cacheWritePerMillion', 'cacheWrite1hPerMillion', 'webSearchPerThousand',
    'webSearchesPerCall', 'audioInputPerMillion', 'audioOutputPerMillion']);
  if (o === null) return FREE;
  const price = (name: string): number => {
    const micro = c.money(`${path}.${name}`, o[name]) ?? 0;
    if (micro <= MAX_PRICE_MICRO) return micro;
    c.fail(`${path}.${name}`, `must be at most ${MAX_PRICE_MICRO / 1e6} (USD per million tokens)`);
    return 0;
  };
  const cacheWrite = price('cacheWritePerMillion');
  const tokens = {
    input: price('inputPerMillion'), output: price('outputPerMillion'), cacheRead: price('cacheReadPerMillion'), cacheWrite,
    // Omitted: the five-minute price, as before this field existed (never free by omission).
    cacheWrite1h: o.cacheWrite1hPerMillion === undefined ? cacheWrite : price('cacheWrite1hPerMillion'),
    webSearchPerThousand: 0, webSearchesPerCall: 0, audioInput: 0, audioOutput: 0,
  };
  // Omitted: Anthropic's price, $10 per thousand (a search the provider bills is not free by
  // omission), unless every token is free (such a model stays free, not billable).
  const free = isFree(tokens);
  const searches = o.webSearchPerThousand !== undefined ? price('webSearchPerThousand') : free ? 0 : 10_000_000;
  // Omitted: no audio price (a request for audio is refused), unless every token is free.
  const audio = (name: string): number | null => (o[name] !== undefined ? price(name) : free ? 0 : null);
  return {
    ...tokens, webSearchPerThousand: searches, webSearchesPerCall: c.int(`${path}.webSearchesPerCall`, o.webSearchesPerCall, 0, MAX_SEARCHES_PER_CALL, 0),
    audioInput: audio('audioInputPerMillion'), audioOutput: audio('audioOutputPerMillion'),
  };
}

function checkModels(c: Checker, record: Obj, providers: Map<string, ProviderConfig>): Map<string, ModelConfig> {
  const out = new Map<string, ModelConfig>();
  for (const [id, value] of Object.entries(record)) {
    const path = joinPath('models', id);
    const o = c.object(path, value, ['provider', 'deployments', 'upstreamModel', 'price', 'maxOutputTokens', 'outputTokenLimit', 'displayName', 'reasoningTokensPerSecond']);
    if (o === null) continue;
    const upstreamModel = c.string(`${path}.upstreamModel`, o.upstreamModel, id);
    let deployments: DeploymentConfig[];
    if (o.deployments !== undefined) {
      if (o.provider !== undefined) c.fail(`${path}.provider`, 'cannot be given with "deployments" (name the provider in each deployment)');
      deployments = checkDeployments(c, `${path}.deployments`, o.deployments, providers, upstreamModel);
    } else {
      const provider = c.string(`${path}.provider`, o.provider, '');
      if (o.provider === undefined) c.fail(`${path}.provider`, 'is required (or "deployments")');
      else if (provider !== '' && !providers.has(provider)) c.fail(`${path}.provider`, `unknown provider ${JSON.stringify(provider)}`);
      deployments = [{ provider, upstreamModel, weight: 1, fallback: false }];
    }
    if (o.price === undefined && deployments.some((d) => providers.has(d.provider) && providers.get(d.provider)!.protocol !== 'mock')) {
      // A real provider bills the gateway: a forgotten price must not silently make it free.
      c.fail(`${path}.price`, 'is required for a model of a real provider (write "free" if it really costs nothing)');
    }
    const outputTokenLimit = c.int(`${path}.outputTokenLimit`, o.outputTokenLimit, 1, MAX_OUTPUT_TOKEN_LIMIT, 128_000);
    const maxOutputTokens = c.int(`${path}.maxOutputTokens`, o.maxOutputTokens, 1, MAX_OUTPUT_TOKEN_LIMIT, Math.min(4096, outputTokenLimit));
    if (maxOutputTokens > outputTokenLimit) {
      c.fail(`${path}.maxOutputTokens`, `must not be above outputTokenLimit (${outputTokenLimit})`);
    }
    const first = deployments[0] ?? { provider: '', upstreamModel };
    out.set(id, {
      id, provider: first.provider, upstreamModel: first.upstreamModel, deployments,
      price: checkPrice(c, `${path}.price`, o.price),
      maxOutputTokens, outputTokenLimit,
      displayName: c.string(`${path}.displayName`, o.displayName, id),
      reasoningTokensPerSecond: c.int(`${path}.reasoningTokensPerSecond`, o.reasoningTokensPerSecond, 0, 100_000, 0),
    });
  }
  return out;
}

/** A model's `deployments`: 1 to 16, each a known provider at most once, at least one not a fallback. */
function checkDeployments(
  c: Checker, path: string, value: unknown, providers: Map<string, ProviderConfig>, upstreamModel: string,
): DeploymentConfig[] {
  if (!Array.isArray(value) || value.length === 0 || value.length > MAX_DEPLOYMENTS) {
    c.fail(path, `must be an array of 1 to ${MAX_DEPLOYMENTS} deployments`);
    return [];
  }
  const out: DeploymentConfig[] = [];
  const seen = new Set<string>();
  value.forEach((item: unknown, i: number) => {
    const at = joinPath(path, i);
    const o = c.object(at, item, ['provider', 'upstreamModel', 'weight', 'fallback']);
    if (o === null) return;
    const provider = c.string(`${at}.provider`, o.provider, '');
    if (o.provider === undefined) c.fail(`${at}.provider`, 'is required');
    else if (provider !== '' && !providers.has(provider)) c.fail(`${at}.provider`, `unknown provider ${JSON.stringify(provider)}`);
    // A deployment is the model on a provider: its cooldown and its ledger name are the provider's id.
    else if (seen.has(provider)) c.fail(`${at}.provider`, `names ${JSON.stringify(provider)} a second time in this model`);
    seen.add(provider);
    let weight = 1;
    if (o.weight !== undefined) {
      if (typeof o.weight !== 'number' || !Number.isFinite(o.weight) || o.weight <= 0 || o.weight > MAX_WEIGHT) {
        c.fail(`${at}.weight`, `must be a number above 0 and at most ${MAX_WEIGHT}`);
      } else weight = o.weight;
    }
    out.push({
      provider, upstreamModel: c.string(`${at}.upstreamModel`, o.upstreamModel, upstreamModel), weight,
      fallback: c.bool(`${at}.fallback`, o.fallback, false),
    });
  });
  if (out.length > 0 && out.every((d) => d.fallback)) c.fail(path, 'needs at least one deployment that is not a fallback');
  return out;
}

function checkPlans(c: Checker, record: Obj): Map<string, PlanConfig> {
  const out = new Map<string, PlanConfig>();
  for (const [name, value] of Object.entries(record)) {
    const path = joinPath('plans', name);
    const o = c.object(path, value, ['rpm', 'concurrency', 'dailyCapUsd']);
    if (o === null) continue;
    out.set(name, {
      name,
      rpm: c.limit(`${path}.rpm`, o.rpm) ?? null,
      concurrency: c.limit(`${path}.concurrency`, o.concurrency) ?? null,
      dailyCapMicro: c.cap(`${path}.dailyCapUsd`, o.dailyCapUsd) ?? null,
    });
  }
  return out;
}

function checkAccounts(c: Checker, record: Obj, plans: Map<string, PlanConfig>): Map<string, AccountConfig> {
  const out = new Map<string, AccountConfig>();
  for (const [id, value] of Object.entries(record)) {
    const path = joinPath('accounts', id);
    const o = c.object(path, value, ['plan', 'rpm', 'concurrency', 'dailyCapUsd', 'balanceUsd']);
    if (o === null) continue;
    const plan = c.string(`${path}.plan`, o.plan, '');
    if (o.plan === undefined) c.fail(`${path}.plan`, 'is required');
    else if (plan !== '' && !plans.has(plan)) c.fail(`${path}.plan`, `unknown plan ${JSON.stringify(plan)}`);
    out.set(id, {
      id, plan,
      rpm: c.limit(`${path}.rpm`, o.rpm),
      concurrency: c.limit(`${path}.concurrency`, o.concurrency),
      dailyCapMicro: c.cap(`${path}.dailyCapUsd`, o.dailyCapUsd),
      balanceMicro: c.money(`${path}.balanceUsd`, o.balanceUsd) ?? null,
    });
  }
  return out;
}

function checkKeys(
  c: Checker, record: Obj, accounts: Map<string, AccountConfig>, models: Map<string, ModelConfig>,
): Map<string, KeyConfig> {
  const out = new Map<string, KeyConfig>();
  const seenHashes = new Map<string, string>();
  for (const [id, value] of Object.entries(record)) {
    const path = joinPath('keys', id);
    const o = c.object(path, value, ['account', 'sha256', 'key', 'models', 'rpm', 'concurrency', 'disabled']);
    if (o === null) continue;
    const account = c.string(`${path}.account`, o.account, '');
    if (o.account === undefined) c.fail(`${path}.account`, 'is required');
    else if (account !== '' && !accounts.has(account)) c.fail(`${path}.account`, `unknown account ${JSON.stringify(account)}`);

    let sha256 = '';
    if ((o.sha256 === undefined) === (o.key === undefined)) {
      c.fail(path, 'needs exactly one of "sha256" (production) or "key" (plaintext, development only)');
    } else if (o.sha256 !== undefined) {
      if (typeof o.sha256 !== 'string' || !HEX64.test(o.sha256.toLowerCase())) {
        c.fail(`${path}.sha256`, 'must be 64 hexadecimal characters (see `model-gateway hash-key KEY`)');
      } else sha256 = o.sha256.toLowerCase();
    } else if (typeof o.key !== 'string' || o.key.length === 0) {
      c.fail(`${path}.key`, 'must be a non-empty string');
    } else {
      sha256 = hash('sha256', o.key);
      c.warnings.push(`${path}.key: plaintext key in the config file; use "sha256" in production`);
    }
    if (sha256 !== '') {
      const other = seenHashes.get(sha256);
      if (other !== undefined) c.fail(path, `has the same key as keys.${other}`);
      seenHashes.set(sha256, id);
    }

    let allowed: string[] | null = null;
    if (o.models !== undefined) {
      if (!Array.isArray(o.models)) c.fail(`${path}.models`, 'must be an array of model ids');
      else {
        allowed = [];
        // Every bad element is reported, each by its index (the admin API names the first).
        o.models.forEach((m: unknown, i: number) => {
          const one = modelsField([m], models);
          if (!one.ok) c.fail(joinPath(`${path}.models`, i), one.message);
          else allowed!.push(m as string);
        });
      }
    }
    out.set(id, {
      id, account, sha256, models: allowed,
      rpm: c.limit(`${path}.rpm`, o.rpm) ?? null,
      concurrency: c.limit(`${path}.concurrency`, o.concurrency) ?? null,
      disabled: c.bool(`${path}.disabled`, o.disabled, false),
    });
  }
  return out;
}

/** The largest `server.maxBodyBytes`. */
export const MAX_BODY_BYTES = 500 * 1024 * 1024;

function isRedisUrl(text: string): boolean {
  // A unix socket URL is the redis package's own (with forms a WHATWG URL cannot parse): it judges it at start.
  if (text.startsWith('unix:')) return true;
  try {
    const url = new URL(text);
    return url.protocol === 'redis:' || url.protocol === 'rediss:' || url.protocol === 'unix:'; // the redis package's own
  } catch {
    return false;
  }
}

/** A value as an error message shows it: JSON, cut to 100 characters (a config can hold megabytes). */
function shown(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 100 ? `${text.slice(0, 100)}...` : text;
}
