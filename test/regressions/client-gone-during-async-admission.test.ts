// With a remote limiter, admission is awaited. A client that left during that wait used to
// leave its ticket held: 'close' had already fired before the exchange listened for it.
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
import { chatBody, testConfig } from '../helpers/gateway.js';

test('a client gone while admission is awaited leaves nothing held', async () => {
  const memory = new MemoryLimiter(systemClock);
  // A slow remote store: admission answers after 150 ms.
  const slow = Object.create(memory) as Limiter;
  slow.admit = (...args: Parameters<Limiter['admit']>) =>
    new Promise<Decision>((resolve) => setTimeout(() => resolve(memory.admit(...args) as Decision), 150));
  const config = validateConfig(testConfig(), { baseDir: '/', env: {} });
  assert.ok(config.ok);
  const gateway = new Gateway(config.config, { limiter: slow, logger: new Logger(() => {}) });
  const server = createGatewayServer(gateway);
  const url = await listen(server, 0, '127.0.0.1');
  try {
    await new Promise<void>((resolve) => {
      const req = request(`${url}/v1/chat/completions`, {
        method: 'POST', headers: { 'x-api-key': 'sk-bob', 'content-type': 'application/json' },
      });
      req.on('error', () => resolve());
      req.end(JSON.stringify(chatBody('slow-1')));
      setTimeout(() => { req.destroy(); resolve(); }, 50);
    });
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(gateway.inFlight, 0);
    const account = gateway.directory.accounts.get('acct_bob')!;
    assert.equal(memory.snapshot(account).inFlight, 0, 'the slot came back');
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    memory.close();
  }
});
