import { hash } from 'node:crypto';

/** The demo key printed by `npm start` when no config file is given. Public by design. */
export const DEMO_KEY = 'sk-demo-model-gateway-0000';

/**
 * The embedded demo configuration: one prepaid account, one key, models served by the
 * built-in mock provider, everything in memory. Validated exactly like a config file.
 */
export function demoConfig(): Record<string, unknown> {
  return {
    server: { host: '127.0.0.1', port: 8080 },
    limiter: { store: 'memory' },
    ledger: { store: 'memory' },
    plans: {
      demo: { rpm: 60, concurrency: 4, dailyCapUsd: 5 },
    },
    accounts: {
      acct_demo: { plan: 'demo', balanceUsd: 10 },
    },
    keys: {
      key_demo: { account: 'acct_demo', sha256: hash('sha256', DEMO_KEY) },
    },
    models: {
      'echo-1': { provider: 'mock' },
      'mock-gpt-4o-mini': {
        provider: 'mock', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 },
      },
      'mock-claude-sonnet-4': {
        provider: 'mock', price: { inputPerMillion: 3, outputPerMillion: 15 },
      },
    },
    providers: {
      mock: { protocol: 'mock', tokensPerSecond: 50 },
    },
  };
}
