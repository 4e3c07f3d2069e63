import type { Price } from '../money.js';

/** A limit value: a non-negative integer, or null for "no limit". */
export type Limit = number | null;

export interface ServerConfig {
  host: string;
  port: number;
  maxBodyBytes: number;
  requestTimeoutMs: number;
  drainDelayMs: number;
  drainTimeoutMs: number;
  /** A client that reads nothing of its answer for this long is cut (its slot released). */
  clientIdleTimeoutMs: number;
  /** Time a client has to send a request's headers (at most requestTimeoutMs). */
  headersTimeoutMs: number;
  /** Connections held at most; more are closed as they arrive. */
  maxConnections: number;
  metrics: boolean;
  /** Log level: 'debug', 'info' (access log on), 'warn' (access log off) or 'error'. */
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  /** Log text waiting to be written, at most (bytes): beyond it lines are dropped and counted, never requests slowed. */
  logBufferBytes: number;
}

export type LimiterConfig =
  | { store: 'memory' }
  | { store: 'redis'; url: string; prefix: string; timeoutMs: number; leaseMs: number };

export type LedgerConfig =
  | { store: 'memory' }
  | { store: 'file'; dir: string }
  /** One ledger and admin state for a fleet (CONTRACT section 11); `schema` holds the tables. */
  | { store: 'postgres'; url: string; schema: string };

export interface PlanConfig {
  name: string;
  rpm: Limit;
  concurrency: Limit;
  dailyCapMicro: Limit;
}

export interface AccountConfig {
  id: string;
  plan: string;
  /** Overrides of the plan's limits; undefined inherits the plan's value. */
  rpm: Limit | undefined;
  concurrency: Limit | undefined;
  dailyCapMicro: Limit | undefined;
  /** Initial prepaid credit; null means the account is postpaid. */
  balanceMicro: number | null;
}

export interface KeyConfig {
  id: string;
  account: string;
  /** Lowercase hex SHA-256 of the key; a plaintext `key` in the file is hashed at load and dropped. */
  sha256: string;
  /** Allowed model ids; null = every model. */
  models: string[] | null;
  rpm: Limit;
  concurrency: Limit;
  disabled: boolean;
}

/** One place a model is served: a provider, under its own model name. */
export interface DeploymentConfig {
  provider: string;
  upstreamModel: string;
  /** Relative share of the calls among the non-fallback deployments. */
  weight: number;
  /** Tried only when every non-fallback deployment failed or is cooling down, in order. */
  fallback: boolean;
}

export interface ModelConfig {
  id: string;
  /** The first deployment's provider and model name (the one `provider` names, or `deployments[0]`). */
  provider: string;
  upstreamModel: string;
  /** Where the model is served: one entry for a model with `provider`, or its `deployments`. */
  deployments: DeploymentConfig[];
  price: Price;
  /** The output reserved when a request sets no output limit. */
  maxOutputTokens: number;
  /** The largest output limit a request may set (max_tokens and the like). */
  outputTokenLimit: number;
  /** The name clients show (Anthropic's `display_name`); default: the id. */
  displayName: string;
  /**
   * A model that reasons before it answers: the output tokens it generates a second (0: none
   * given). Its reasoning is billed but never relayed, so an abnormal end is charged at least
   * this rate for the seconds since the provider had the request, within the output reserved.
   */
  reasoningTokensPerSecond: number;
}

export type Protocol = 'openai' | 'anthropic' | 'mock';

/** `Authorization: Bearer KEY`, `x-api-key: KEY` (Anthropic's) or `api-key: KEY` (Azure OpenAI's). */
export type AuthHeader = 'bearer' | 'x-api-key' | 'api-key';

export type OutputLimitField = 'max_completion_tokens' | 'max_tokens';

export interface ProviderConfig {
  id: string;
  protocol: Protocol;
  baseUrl: string;
  /** The provider credentials read from `apiKeyEnv` (one variable or several) at load; empty when none is needed. */
  apiKeys: string[];
  /** How the credential is sent: the protocol's own way (null), or as named for a compatible server. */
  authHeader: AuthHeader | null;
  /** Static headers sent with every upstream request, as name/value pairs (lowercase names). */
  headers: string[];
  timeoutMs: number;
  streamIdleTimeoutMs: number;
  /**
   * OpenAI protocol: the field a chat request's output limit goes in. `max_completion_tokens`
   * (OpenAI's own; its reasoning models take no other), or `max_tokens` for servers that read
   * only that one (Ollama, LM Studio).
   */
  outputLimitField: OutputLimitField;
  /** Mock only: delay before the first byte. */
  latencyMs: number;
  /** Mock only: pacing of streamed output, one chunk per token; 0 = as fast as possible. */
  tokensPerSecond: number;
}

/** Failover among a model's deployments (CONTRACT section 10). */
export interface RoutingConfig {
  /** Attempts of one call in all: deployments tried, or retries of a model's only provider. */
  maxAttempts: number;
  /** How long a deployment that failed is skipped, at least (a longer Retry-After wins). */
  cooldownMs: number;
}

/** A validated, normalised configuration. Money is integer micro-dollars throughout. */
export interface GatewayConfig {
  server: ServerConfig;
  limiter: LimiterConfig;
  ledger: LedgerConfig;
  routing: RoutingConfig;
  plans: Map<string, PlanConfig>;
  accounts: Map<string, AccountConfig>;
  keys: Map<string, KeyConfig>;
  models: Map<string, ModelConfig>;
  providers: Map<string, ProviderConfig>;
}
