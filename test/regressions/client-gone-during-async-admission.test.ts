// With a remote limiter, admission is awaited. A client that left during that wait used to
// leave its ticket held: 'close' had already fired before the exchange listened for it. Then
// (found in review) the call still went to the provider, and was charged as if answered.
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { test } from 'node:test';
import { systemClock } from '../../src/clock.js';
import { validateConfig } from '../../src/config/validate.js';
import { Gateway } from '../../src/gateway.js';
import { MemoryLimiter } from '../../src/limiter/memory.js';
import type { Decision, Limiter } from '../../src/limiter/types.js';
import { Logger } from '../../src/log.js';
import { createGatewayServer, listen } from '../../src/server.js';
import { FakeUpstream } from '../helpers/fake-upstream.js';
import { chatBody, entriesOf, testConfig, until } from '../helpers/gateway.js';

/**
 * A gateway whose limiter (the memory one underneath) answers `slowed` 150 ms late, as a remote
 * store may; its access-log lines in `logs`.
 */
async function withSlowAdmission(raw: Record<string, unknown>, slowed: 'admit' | 'admitInstant') {
  const memory = new MemoryLimiter(systemClock);
  const slow = Object.create(memory) as Limiter;
  const decide = memory[slowed].bind(memory) as (...args: unknown[]) => Decision;
  (slow as unknown as Record<string, unknown>)[slowed] = (...args: unknown[]) =>
    new Promise<Decision>((resolve) => setTimeout(() => resolve(decide(...args)), 150));
  const config = validateConfig(raw, { baseDir: '/', env: {} });
  assert.ok(config.ok);
  const logs: string[] = [];
  const gateway = new Gateway(config.config, { limiter: slow, logger: new Logger((t) => logs.push(t)) });
  const server = createGatewayServer(gateway);
  const url = await listen(server, 0, '127.0.0.1');
  const close = async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    memory.close();
  };
  return { memory, gateway, logs, url, close };
}

/** Sends `body` to `path` and leaves after 50 ms, before the admission's answer. */
function leaveEarly(url: string, path: string, body: unknown): Promise<void> {
  return new Promise<void>((resolve) => {
    const req = request(`${url}${path}`, { method: 'POST', headers: { 'x-api-key': 'sk-bob', 'content-type': 'application/json' } });
    req.on('error', () => resolve());
    req.end(JSON.stringify(body));
    setTimeout(() => { req.destroy(); resolve(); }, 50);
  });
}

test('a client gone while admission is awaited leaves nothing held, sends nothing upstream and is not charged', async () => {
  const { memory, gateway, logs, url, close } = await withSlowAdmission(testConfig(), 'admit');
  try {
    await leaveEarly(url, '/v1/chat/completions', chatBody('paid-1'));
    // Admission answers at 150 ms; the call then ends at once (no wait for a provider).
    await until(() => logs.join('').includes('"status":499'), 2000, 'the call to end');
    assert.equal(gateway.inFlight, 0);
    assert.deepEqual(entriesOf({ gateway } as never, 'acct_bob'), [], 'nothing charged: the mock (latency 0) was never asked');
    const account = gateway.directory.accounts.get('acct_bob')!;
    assert.equal(memory.snapshot(account).inFlight, 0, 'the slot came back');
  } finally {
    await close();
  }
});

test('a count_tokens whose client left while admission was awaited is not sent upstream, and is logged 499 (found in review)', async () => {
  const up = new FakeUpstream();
  const base = await up.start();
  const { logs, url, close } = await withSlowAdmission(testConfig({
    models: { ...(testConfig().models as object), claude: { provider: 'ant', price: 'free' } },
    providers: { ...(testConfig().providers as object), ant: { protocol: 'anthropic', baseUrl: base } },
  }), 'admitInstant');
  try {
    await leaveEarly(url, '/v1/messages/count_tokens', { model: 'claude', messages: [{ role: 'user', content: 'hi' }] });
    await until(() => logs.join('').includes('"status":499'), 2000, 'the count to end');
    assert.equal(up.hits, 0, 'never sent upstream');
  } finally {
    await close();
    await up.close();
  }
});
