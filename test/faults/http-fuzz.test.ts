import assert from 'node:assert/strict';
import { request, type IncomingMessage } from 'node:http';
import { after, before, describe, test } from 'node:test';
import type { MemoryLimiter } from '../../src/limiter/memory.js';
import { rng } from '../helpers/fake-clock.js';
import { entriesOf, sha, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * A seeded fuzz of the HTTP surface over real sockets: random methods, paths, header sets,
 * bodies (hostile numbers, wrong types, broken and deeply nested JSON), idempotency keys, and
 * clients that go away at random points (mid-body, after the headers, mid-stream). Every answer
 * must be the gateway's: no 500, an `x-request-id`, errors in the contract's envelope. After
 * the run nothing is held: no call in flight, no slot, no reservation, no Idempotency-Key. Then
 * an abort soak: 1,000 streamed calls cut at random points leave in-flight 0 and exactly one
 * ledger entry per admitted call.
 */

const ADMIN = 'admin-fuzz';

interface Answer {
  status: number;
  headers: IncomingMessage['headers'];
  body: string;
}

type Abort = 'none' | 'mid-body' | 'after-headers' | 'mid-answer';

/** One request; resolves with the answer, or null when the client went away on purpose (or was cut). */
function send(url: string, method: string, path: string, headers: Record<string, string>, body: string | null, abort: Abort, r: () => number): Promise<Answer | null> {
  return new Promise((resolve) => {
    const { hostname, port } = new URL(url);
    const req = request({ hostname, port, method, path, headers, agent: false }, (res) => {
      if (abort === 'after-headers') {
        req.destroy();
        return resolve(null);
      }
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
        if (abort === 'mid-answer' && r() < 0.3) {
          req.destroy();
          resolve(null);
        }
      });
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: text }));
      res.on('error', () => resolve(null));
      res.on('aborted', () => resolve(null));
    });
    req.on('error', () => resolve(null));
    if (body === null) return void req.end();
    if (abort === 'mid-body') {
      req.write(body.slice(0, Math.floor(body.length / 2)));
      setTimeout(() => {
        req.destroy();
        resolve(null);
      }, Math.floor(r() * 20));
      return;
    }
    req.end(body);
  });
}

function checkAnswer(a: Answer, what: string, head = false): void {
  assert.notEqual(a.status, 500, `${what}: 500 ${a.body.slice(0, 300)}`);
  assert.ok(a.status >= 100 && a.status < 600, what);
  const id = a.headers['x-request-id'];
  assert.ok(typeof id === 'string' && id.length > 0, `${what}: no x-request-id`);
  if (a.status >= 400 && !head) {
    let body: { type?: string; error?: { type?: string; code?: string; message?: string; request_id?: string } };
    try {
      body = JSON.parse(a.body) as typeof body;
    } catch {
      assert.fail(`${what}: ${a.status} is not JSON: ${a.body.slice(0, 200)}`);
    }
    assert.equal(body.type, 'error', what);
    assert.equal(typeof body.error?.type, 'string', what);
    assert.equal(typeof body.error?.code, 'string', what);
    assert.equal(typeof body.error?.message, 'string', what);
    assert.equal(body.error?.request_id, id, `${what}: request_id`);
  }
}

describe('fault: a seeded fuzz of the HTTP surface', () => {
  let gw: Running;
  before(async () => {
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 65_536, clientIdleTimeoutMs: 2000, requestTimeoutMs: 1500, headersTimeoutMs: 1000 },
      plans: { p: { rpm: 1_000_000, concurrency: 1_000, dailyCapUsd: 50 }, tight: { rpm: 30, concurrency: 2, dailyCapUsd: 0.01 } },
      accounts: { acct_f: { plan: 'p', balanceUsd: 100 }, acct_t: { plan: 'tight' } },
      keys: {
        key_f: { account: 'acct_f', sha256: sha('sk-fuzz') },
        key_t: { account: 'acct_t', sha256: sha('sk-tight'), rpm: 10 },
        key_m: { account: 'acct_f', sha256: sha('sk-narrow'), models: ['echo-1'] },
      },
      models: {
        'echo-1': { provider: 'mock' },
        'paid-1': { provider: 'mock', price: { inputPerMillion: 1, outputPerMillion: 2 }, outputTokenLimit: 5000 },
        'slow-1': { provider: 'slow', price: { inputPerMillion: 1, outputPerMillion: 2 } },
      },
      providers: { mock: { protocol: 'mock' }, slow: { protocol: 'mock', latencyMs: 5, tokensPerSecond: 2000 } },
    }), { adminKey: ADMIN });
  });
  after(() => gw.close());

  test('2,000 random requests: no 500, every answer the gateway\'s own, nothing held afterwards', async () => {
    const r = rng(Number(process.env.FUZZ_SEED ?? 2026)); // FUZZ_SEED=N explores other seeds
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const numbers: unknown[] = [0, -1, 1, 1.5, 16, 4096, 5001, 2 ** 53 + 1, 1e308, -1e308, 'NaN', '12', null, true, [], {}];
    const paths = ['/v1/chat/completions', '/v1/messages', '/v1/embeddings', '/v1/models', '/v1/models/echo-1', '/v1/models/%E0%A4%A',
      '/v1/models/__proto__', '/v1/balance', '/v1/usage?group_by=model&start=2026-01-01', '/v1/usage?start=bad', '/v1/billing/history?limit=5',
      '/v1/billing/history?after=1.2.3&limit=0', '/healthz', '/readyz', '/metrics', '/admin/v1/keys', '/admin/v1/keys/constructor',
      '/admin/v1/accounts/acct_f', '/admin/v1/accounts/acct_f/credits', '/admin/v1/plans/__proto__', '/nope', `/${'a'.repeat(3000)}`, '/v1/'];
    const chat = (): Record<string, unknown> => {
      const body: Record<string, unknown> = {
        model: pick(['echo-1', 'paid-1', 'slow-1', 'nope', '', 5, 'echo-1-thinking']),
        messages: pick([[{ role: 'user', content: 'hi '.repeat(Math.floor(r() * 50)) }], [], 'x', [null], [{ content: 'no role' }],
          [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'image_url', image_url: { url: 'data:x' } }] }]]),
      };
      if (r() < 0.4) body.max_tokens = pick(numbers);
      if (r() < 0.2) body.max_completion_tokens = pick(numbers);
      if (r() < 0.2) body.n = pick(numbers);
      if (r() < 0.4) body.stream = pick([true, false, 'yes', null]);
      if (r() < 0.1) body.stream_options = pick([{ include_usage: true }, 'x', []]);
      if (r() < 0.05) body.tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
      return body;
    };
    const bodyFor = (): string | null => {
      const roll = r();
      if (roll < 0.6) return JSON.stringify(chat());
      if (roll < 0.65) return '{"model": "echo-1", "messages": [';
      if (roll < 0.7) return `{"model":"echo-1","messages":[{"role":"user","content":${'['.repeat(300)}${']'.repeat(300)}}]}`;
      if (roll < 0.75) return JSON.stringify(pick([null, 1, 'x', [], { input: 'embed me', model: 'echo-1' }]));
      if (roll < 0.8) return JSON.stringify({ amountUsd: pick(numbers), note: pick(['n', 5]) });
      if (roll < 0.85) return JSON.stringify({ rpm: pick(numbers), concurrency: pick(numbers), plan: pick(['p', 'nope', '__proto__']) });
      if (roll < 0.9) return 'x'.repeat(70_000);
      return null;
    };
    const headersFor = (body: string | null): Record<string, string> => {
      const h: Record<string, string> = {};
      const auth = r();
      if (auth < 0.6) h.authorization = `Bearer ${pick(['sk-fuzz', 'sk-fuzz', 'sk-tight', 'sk-narrow'])}`;
      else if (auth < 0.7) h['x-api-key'] = pick(['sk-fuzz', 'sk-bad', '']);
      else if (auth < 0.75) Object.assign(h, { authorization: 'Bearer sk-fuzz', 'x-api-key': 'sk-tight' });
      else if (auth < 0.8) h.authorization = pick(['Bearer', 'Basic abc', 'Bearer ', `Bearer ${ADMIN}`]);
      else if (auth < 0.85) h.authorization = `Bearer ${ADMIN}`;
      if (r() < 0.3) h['idempotency-key'] = pick(['k1', 'k2', 'k3', '', 'x'.repeat(300), 'bad key']);
      if (r() < 0.2) h['x-request-id'] = pick(['trace-1', 'bad id!', 'x'.repeat(200)]);
      if (r() < 0.1) h['anthropic-version'] = '2023-06-01';
      if (body !== null) {
        h['content-type'] = pick(['application/json', 'text/plain', 'application/json; charset=utf-8']);
        if (r() < 0.05) h['content-length'] = String(Buffer.byteLength(body) + 10); // a body that never completes
      }
      return h;
    };

    let next = 0;
    const answered: Answer[] = [];
    let failure: unknown = null;
    const worker = async () => {
      while (next < 2000 && failure === null) {
        const i = next++;
        const method = pick(['GET', 'POST', 'POST', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS']);
        const path = pick(paths);
        const body = method === 'GET' || method === 'HEAD' ? null : bodyFor();
        const abort: Abort = pick(['none', 'none', 'none', 'mid-body', 'after-headers', 'mid-answer']);
        const a = await send(gw.url, method, path, headersFor(body), body, body === null && abort === 'mid-body' ? 'none' : abort, r);
        if (a === null) continue;
        try {
          checkAnswer(a, `#${i} ${method} ${path.slice(0, 60)}`, method === 'HEAD');
        } catch (err) {
          failure ??= err;
        }
        answered.push(a);
      }
    };
    // Every worker stops at the first failure and is awaited: none goes on into the next test.
    await Promise.all(Array.from({ length: 12 }, worker));
    if (failure !== null) throw failure;
    assert.ok(answered.length > 800, `${answered.length} answered`);
    assert.ok(answered.some((a) => a.status === 200) && answered.some((a) => a.status === 400) && answered.some((a) => a.status === 401));

    // Nothing held: every call over, every slot, reservation and key given back.
    await until(() => gw.gateway.inFlight === 0, 10_000, 'no call in flight');
    const limiter = gw.gateway.limiter as MemoryLimiter;
    assert.equal(limiter.sizes().idempotency, 0);
    for (const account of gw.gateway.directory.accounts.values()) {
      const snap = limiter.snapshot(account);
      assert.equal(snap.inFlight, 0, account.id);
      assert.equal(snap.reservedMicro, 0, account.id);
    }
    assert.equal((await fetch(`${gw.url}/healthz`)).status, 200);
  });

  test('abort soak: 1,000 streamed calls cut at random points leave nothing in flight and one ledger entry per admitted call', async () => {
    const r = rng(7);
    const admitted = async () => {
      const text = await (await fetch(`${gw.url}/metrics`)).text();
      return Number(/mg_admissions_total\{result="admitted"\} (\d+)/.exec(text)?.[1] ?? 0);
    };
    await until(() => gw.gateway.inFlight === 0, 10_000, 'quiet before the soak');
    const before = { admitted: await admitted(), entries: entriesOf(gw, 'acct_f').length };
    let next = 0;
    let failure: unknown = null;
    const worker = async () => {
      while (next < 1000 && failure === null) {
        next++;
        const body = JSON.stringify({ model: 'slow-1', stream: true, max_tokens: 200, messages: [{ role: 'user', content: 'stream me '.repeat(40) }] });
        const abort: Abort = r() < 0.2 ? 'none' : r() < 0.5 ? 'after-headers' : 'mid-answer';
        const a = await send(gw.url, 'POST', '/v1/chat/completions', { authorization: 'Bearer sk-fuzz', 'content-type': 'application/json' }, body, abort, r);
        try {
          if (a !== null) checkAnswer(a, 'soak');
        } catch (err) {
          failure ??= err;
        }
      }
    };
    await Promise.all(Array.from({ length: 25 }, worker));
    if (failure !== null) throw failure;
    await until(() => gw.gateway.inFlight === 0, 15_000, 'every soak call over');
    const calls = (await admitted()) - before.admitted; // /metrics needs no key: reading it admits nothing
    const entries = entriesOf(gw, 'acct_f').length - before.entries;
    assert.ok(calls > 900, `${calls} admitted`);
    assert.equal(entries, calls, 'one entry per admitted call');
  });
});
