import { hash } from 'node:crypto';
import { request, type Server } from 'node:http';
import type { AdminStore } from '../../src/admin/state.js';
import type { Clock } from '../../src/clock.js';
import { validateConfig } from '../../src/config/validate.js';
import { Gateway } from '../../src/gateway.js';
import { MemoryLedger } from '../../src/ledger/memory.js';
import type { Ledger, LedgerEntry } from '../../src/ledger/types.js';
import type { Limiter } from '../../src/limiter/types.js';
import { Logger } from '../../src/log.js';
import type { Cooldowns } from '../../src/routing/cooldowns.js';
import { createGatewayServer, listen } from '../../src/server.js';

export const sha = (key: string) => hash('sha256', key);

/** A config with two accounts and a few keys; `patch` overrides top-level sections. */
export function testConfig(patch: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    server: { host: '127.0.0.1', port: 0, maxBodyBytes: 4096 },
    ledger: { store: 'memory' },
    plans: {
      free: { rpm: 5, concurrency: 2, dailyCapUsd: 1 },
      pro: { rpm: 1000, concurrency: 50, dailyCapUsd: 'unlimited' },
    },
    accounts: {
      acct_alice: { plan: 'pro' },
      acct_bob: { plan: 'free' },
    },
    keys: {
      key_alice: { account: 'acct_alice', sha256: sha('sk-alice') },
      key_alice_narrow: { account: 'acct_alice', sha256: sha('sk-alice-narrow'), models: ['echo-1'] },
      key_bob: { account: 'acct_bob', sha256: sha('sk-bob') },
      key_off: { account: 'acct_alice', sha256: sha('sk-off'), disabled: true },
    },
    models: {
      'echo-1': { provider: 'mock' },
      'paid-1': { provider: 'mock', price: { inputPerMillion: 1, outputPerMillion: 2 } },
      'slow-1': { provider: 'slow' },
    },
    providers: {
      mock: { protocol: 'mock' },
      slow: { protocol: 'mock', latencyMs: 300 },
    },
    ...patch,
  };
}

export interface Running {
  url: string;
  gateway: Gateway;
  server: Server;
  logs: string[];
  close(): Promise<void>;
}

/** Starts a real gateway on port 0 in this process. */
export async function startGateway(
  raw: Record<string, unknown> = testConfig(),
  options: {
    clock?: Clock; env?: Record<string, string>; ledger?: Ledger; limiter?: Limiter; adminKey?: string; adminStore?: AdminStore;
    cooldowns?: Cooldowns; random?: () => number;
  } = {},
): Promise<Running> {
  const clock = options.clock;
  const result = validateConfig(raw, { baseDir: process.cwd(), env: options.env ?? {} });
  if (!result.ok) throw new Error(`bad test config: ${result.errors.join('; ')}`);
  const logs: string[] = [];
  const logger = new Logger((text) => logs.push(text));
  const gateway = new Gateway(result.config, {
    logger, ...(clock === undefined ? {} : { clock }), ...(options.ledger === undefined ? {} : { ledger: options.ledger }),
    ...(options.adminKey === undefined ? {} : { adminKey: options.adminKey }),
    ...(options.adminStore === undefined ? {} : { adminStore: options.adminStore }),
    ...(options.limiter === undefined ? {} : { limiter: options.limiter }),
    ...(options.cooldowns === undefined ? {} : { cooldowns: options.cooldowns }),
    ...(options.random === undefined ? {} : { random: options.random }),
  });
  const server = createGatewayServer(gateway);
  const url = await listen(server, 0, '127.0.0.1');
  return {
    url, gateway, server, logs,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

export function auth(key: string, extra: Record<string, string> = {}): Record<string, string> {
  return { authorization: `Bearer ${key}`, ...extra };
}

/** The gateway's access-log lines so far, parsed (the logger writes lines in batches). */
export function accessLog(gw: Running): Array<Record<string, unknown>> {
  gw.gateway.logger.flush();
  return gw.logs.join('').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request');
}

export async function postJson(url: string, key: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...auth(key), ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

export const chatBody = (model: string, text = 'hello there', extra: Record<string, unknown> = {}) => ({
  model, messages: [{ role: 'user', content: text }], ...extra,
});

/** Billing entries of an account in a gateway on the memory ledger, oldest first. */
export function entriesOf(gw: Running, accountId: string): readonly LedgerEntry[] {
  return (gw.gateway.ledger as MemoryLedger).entries(accountId);
}

/** Runs `send` (a call that ends abnormally, say), then waits until it is settled and charged: the account's newest entry. */
export async function chargeOf(gw: Running, accountId: string, send: () => Promise<unknown>): Promise<LedgerEntry> {
  const before = entriesOf(gw, accountId).length;
  await send();
  await until(() => gw.gateway.inFlight === 0 && entriesOf(gw, accountId).length > before, 5000, 'the charge');
  return entriesOf(gw, accountId).at(-1)!;
}

/** Polls `check` until it holds (or fails after `ms`): wait for a condition, not for time. */
export async function until(check: () => boolean | Promise<boolean>, ms = 5000, what = 'condition'): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * One billable chat call (streamed or not, of a random length) for the kill -9 tests: its
 * request id when the answer arrived whole, null when it did not (the instance died mid-call).
 */
export async function chatReceivedWhole(url: string, key: string, model: string, r: () => number): Promise<string | null> {
  try {
    const stream = r() < 0.5;
    const res = await postJson(`${url}/v1/chat/completions`, key, chatBody(model, 'z'.repeat(40 + Math.floor(r() * 80)), { stream }));
    const text = await res.text();
    const whole = stream ? text.endsWith('data: [DONE]\n\n') : res.status === 200 && text.endsWith('}');
    return whole ? res.headers.get('x-request-id') : null;
  } catch {
    return null;
  }
}

/** POSTs a call and leaves (closes the connection) as soon as its answer shows `marker`; resolves once closed. */
export function leaveWhenSeen(url: string, key: string, body: unknown, marker: string, ms = 5000): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' } }, (res) => {
      res.on('data', (chunk: Buffer) => {
        if (chunk.toString().includes(marker)) req.destroy();
      });
    });
    req.on('error', () => {});
    req.on('close', () => resolve());
    req.end(JSON.stringify(body));
    setTimeout(() => reject(new Error(`${marker} never came`)), ms).unref();
  });
}
