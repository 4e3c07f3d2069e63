import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { describe, test } from 'node:test';
import { createGateway } from '../../src/index.js';
import { FileLedger } from '../../src/ledger/file.js';
import { Logger } from '../../src/log.js';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { testConfig } from '../helpers/gateway.js';
import { hasRedis, RedisServer } from '../helpers/redis-server.js';

/**
 * The drain (close(), SIGTERM) with streams still running. Found in review: at the drain's
 * deadline the streams were cut, but the ledger closed before their charges reached it, so
 * they were lost; and a drain always lasted its whole deadline, as a keep-alive connection that
 * turned idle after its last answer was never closed.
 */
const quiet = new Logger(() => {});

function config(dir: string, drainTimeoutMs: number, tokensPerSecond: number, more: Record<string, unknown> = {}) {
  return testConfig({
    server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs },
    ledger: { store: 'file', dir },
    plans: { p: { rpm: 1000, concurrency: 10 } },
    accounts: { acct_d: { plan: 'p' } },
    keys: { key_d: { account: 'acct_d', key: 'sk-d' } },
    models: { slow: { provider: 'paced', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
    providers: { paced: { protocol: 'mock', tokensPerSecond } },
    ...more,
  });
}

/** Starts a stream on a keep-alive connection; resolves once its first bytes arrive, with how it ends. */
function stream(url: string, words: number): Promise<{ ended: Promise<'whole' | 'cut'> }> {
  const body = JSON.stringify({ model: 'slow', stream: true, messages: [{ role: 'user', content: 'word '.repeat(words) }] });
  return new Promise((resolve, reject) => {
    const req = request(`${url}/v1/chat/completions`, {
      method: 'POST', agent: new Agent({ keepAlive: true }),
      headers: { authorization: 'Bearer sk-d', 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      let text = '';
      const ended = new Promise<'whole' | 'cut'>((done) => {
        res.on('data', (d: Buffer) => { text += d.toString(); });
        res.on('end', () => done(text.includes('[DONE]') ? 'whole' : 'cut'));
        res.on('error', () => done('cut'));
        res.on('aborted', () => done('cut'));
      });
      res.once('data', () => resolve({ ended }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function charges(dir: string): Promise<number> {
  const ledger = await FileLedger.open(dir, { logger: quiet });
  try {
    return (await ledger.history('acct_d', 100, null)).entries.length;
  } finally {
    await ledger.close();
  }
}

describe('fault: a drain with streams running', () => {
  test('streams cut at the drain deadline are charged: their charges reach the ledger before it closes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-drain-'));
    const gw = await createGateway(config(dir, 300, 20), { logger: quiet });
    const url = await gw.listen(0, '127.0.0.1');
    const calls = await Promise.all([stream(url, 200), stream(url, 200)]); // 10 s each at 20 tokens/s
    await gw.close();
    assert.deepEqual(await Promise.all(calls.map((c) => c.ended)), ['cut', 'cut']);
    assert.equal(await charges(dir), 2, 'both cut calls charged');
  });

  test('with the Redis limiter too: the charges of cut streams wait for their settlements, then reach the ledger', { skip: hasRedis ? false : 'redis-server is not installed' }, async () => {
    const redis = await new RedisServer().start();
    try {
      const dir = mkdtempSync(join(tmpdir(), 'mg-drain-'));
      const gw = await createGateway(config(dir, 300, 20, { limiter: { store: 'redis', url: redis.url, timeoutMs: 1000 } }), { logger: quiet });
      const url = await gw.listen(0, '127.0.0.1');
      const calls = await Promise.all([stream(url, 200), stream(url, 200)]);
      await gw.close();
      assert.deepEqual(await Promise.all(calls.map((c) => c.ended)), ['cut', 'cut']);
      assert.equal(await charges(dir), 2, 'both cut calls charged');
    } finally {
      await redis.stop();
    }
  });

  test('an answer that ends during the drain reaches a slow reader whole (its connection closes after it, not before)', async () => {
    const up = new FakeUpstream();
    const base = await up.start();
    const text = 'z'.repeat(8_000_000);
    up.fallback = (_req, res) => setTimeout(() => json(res, 200, openaiCompletion(text)), 300);
    const dir = mkdtempSync(join(tmpdir(), 'mg-drain-'));
    const gw = await createGateway(config(dir, 10_000, 100, {
      models: { big: { provider: 'up', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
      providers: { up: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 5000 } },
    }), { logger: quiet });
    try {
      const url = await gw.listen(0, '127.0.0.1');
      const body = JSON.stringify({ model: 'big', messages: [{ role: 'user', content: 'x' }] });
      const received = new Promise<number>((resolve, reject) => {
        const req = request(`${url}/v1/chat/completions`, {
          method: 'POST', agent: new Agent({ keepAlive: true }),
          headers: { authorization: 'Bearer sk-d', 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
        }, (res) => {
          let n = 0;
          res.pause(); // a slow reader: it starts reading a second after the answer began
          setTimeout(() => res.resume(), 1000);
          res.on('data', (d: Buffer) => { n += d.length; });
          res.on('end', () => resolve(n));
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end(body);
      });
      await new Promise((r) => setTimeout(r, 100)); // the call is upstream
      await gw.close();
      assert.ok((await received) > 8_000_000, 'the whole answer');
    } finally {
      await up.close();
    }
  });

  test('a drain ends when the last stream does, not at its deadline', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-drain-'));
    const gw = await createGateway(config(dir, 10_000, 100), { logger: quiet });
    const url = await gw.listen(0, '127.0.0.1');
    const call = await stream(url, 60); // about 0.6 s at 100 tokens/s
    const started = performance.now();
    await gw.close();
    assert.equal(await call.ended, 'whole');
    const took = performance.now() - started;
    assert.ok(took < 3000, `the drain took ${Math.round(took)} ms (its deadline: 10,000)`);
    assert.equal(await charges(dir), 1);
  });
});
