/**
 * The baseline: a bare node:http server doing the gateway's job for `GET /v1/models` and
 * nothing else. Same config file, same key check (SHA-256 of the key looked up in a Map),
 * same precomputed body and the same response headers (content-type, content-length, a fresh
 * x-request-id), 401 otherwise. No router, no limiter, no access log: what is left is the floor
 * node:http itself sets, which is what the gateway is measured against.
 *
 *   node --import tsx bench/baseline.ts --config FILE [--port 0]
 *
 * Prints one JSON line with "msg":"listening" and the URL, like the gateway.
 */
import { hash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { int, parseFlags, str } from './cli.js';
import { modelsListBody } from './load.js';

interface BenchConfig {
  keys: Record<string, { sha256: string }>;
  models: Record<string, { provider: string; displayName?: string; outputTokenLimit?: number }>;
}

const flags = parseFlags('baseline.ts', {
  config: str({ default: '', arg: 'FILE', help: "the gateway's config file (keys and models)" }),
  port: int({ default: 0, min: 0, max: 65535, help: 'port on 127.0.0.1, 0 = any free one' }),
}, { check: (f) => (f.config === '' ? '--config is required' : null) });

const config = JSON.parse(readFileSync(flags.config, 'utf8')) as BenchConfig;
const createdS = Math.floor(Date.now() / 1000);
const BODY = Buffer.from(modelsListBody(Object.entries(config.models).map(([id, m]) =>
  ({ id, owned_by: m.provider, display_name: m.displayName, max_tokens: m.outputTokenLimit })), createdS));
const BODY_LENGTH = String(BODY.length);
const UNAUTHORIZED = Buffer.from(JSON.stringify({ error: { type: 'authentication_error', code: 'invalid_api_key', message: 'Invalid API key.' } }));
const NOT_FOUND = Buffer.from(JSON.stringify({ error: { type: 'not_found_error', code: 'not_found', message: 'Not found.' } }));

/** Key SHA-256 (lowercase hex) -> key id. */
const keys = new Map<string, string>();
for (const [id, k] of Object.entries(config.keys)) keys.set(k.sha256, id);

// Request ids as the gateway makes them: a random per-process prefix plus a counter.
const ID_PREFIX = `req_${randomBytes(6).toString('hex')}`;
let idCounter = 0;

function apiKey(xApiKey: string | string[] | undefined, authorization: string | undefined): string {
  if (typeof xApiKey === 'string' && xApiKey.trim() !== '') return xApiKey.trim();
  if (authorization !== undefined && authorization.length > 7 && authorization.slice(0, 7).toLowerCase() === 'bearer ') {
    return authorization.slice(7).trim();
  }
  return '';
}

const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
  const id = `${ID_PREFIX}${(++idCounter).toString(36).padStart(6, '0')}`;
  let status = 200;
  let body = BODY;
  if (req.method !== 'GET' || req.url !== '/v1/models') {
    status = 404;
    body = NOT_FOUND;
  } else {
    const key = apiKey(req.headers['x-api-key'], req.headers.authorization);
    if (key === '' || !keys.has(hash('sha256', key))) {
      status = 401;
      body = UNAUTHORIZED;
    }
  }
  res.writeHead(status, [
    'content-type', 'application/json',
    'x-request-id', id,
    'content-length', body === BODY ? BODY_LENGTH : String(body.length),
  ]);
  res.end(body);
});

server.listen(flags.port, '127.0.0.1', () => {
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), level: 'info', msg: 'listening', url: `http://127.0.0.1:${port}` })}\n`);
});

const stop = () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
