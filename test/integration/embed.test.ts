import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { ConfigError, createGateway, DEMO_KEY } from '../../src/index.js';
import { Logger } from '../../src/log.js';
import { testConfig } from '../helpers/gateway.js';
import { spawnListening } from '../helpers/spawn.js';

const root = join(__dirname, '..', '..');
const quiet = new Logger(() => {});

describe('the programmatic API', () => {
  test('createGateway validates like a file, listens, reloads, reports health and closes gracefully', async () => {
    await assert.rejects(createGateway({ plans: { p: { rpm: 'many' } } }, { logger: quiet }), (err: unknown) => {
      assert.ok(err instanceof ConfigError);
      assert.deepEqual(err.problems, ['plans.p.rpm: must be an integer from 0 to 1000000000, or "unlimited"']);
      return true;
    });
    const gw = await createGateway(testConfig(), { logger: quiet });
    const url = await gw.listen(0, '127.0.0.1');
    assert.deepEqual(gw.health(), { live: true, ready: true, reason: null });
    assert.equal((await fetch(`${url}/v1/models`, { headers: { 'x-api-key': 'sk-carol' } })).status, 401);
    const next = testConfig() as { keys: Record<string, unknown> };
    next.keys.key_carol = { account: 'acct_bob', key: 'sk-carol' };
    assert.deepEqual(await gw.reload(next), []);
    assert.equal((await fetch(`${url}/v1/models`, { headers: { 'x-api-key': 'sk-carol' } })).status, 200);
    assert.deepEqual(await gw.reload({ plans: 1 }), ['plans: must be an object keyed by id']);
    const closing = gw.close();
    assert.deepEqual(gw.health(), { live: true, ready: false, reason: 'draining' });
    await closing;
  });

  test('examples/embed-under-prefix.js serves the gateway under /llm/ of a host server', async () => {
    const { child, url, exited } = await spawnListening(process.execPath, [join(root, 'examples', 'embed-under-prefix.js')], {
      env: { ...process.env, PORT: '0' },
    });
    try {
      assert.equal(await (await fetch(`${url}/`)).text(), 'the host application\n');
      const models = await fetch(`${url}/llm/v1/models`, { headers: { authorization: `Bearer ${DEMO_KEY}` } });
      assert.equal(models.status, 200);
      assert.equal(((await models.json()) as { object: string }).object, 'list');
      assert.equal((await fetch(`${url}/llm/healthz`)).status, 200);
      const chat = await fetch(`${url}/llm/v1/chat/completions`, {
        method: 'POST', headers: { authorization: `Bearer ${DEMO_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'echo-1', messages: [{ role: 'user', content: 'embedded' }] }),
      });
      assert.equal(((await chat.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content, 'embedded');
    } finally {
      child.kill('SIGTERM');
      assert.equal(await exited, 0);
    }
  });

  test('the example configs are valid', async () => {
    const run = promisify(execFile);
    const main = join(root, 'dist', 'main.js');
    await run(process.execPath, [main, 'check-config', join(root, 'examples', 'config.json')]);
    await run(process.execPath, [main, 'check-config', join(root, 'examples', 'config.providers.json')], {
      env: { ...process.env, OPENAI_API_KEY: 'x', ANTHROPIC_API_KEY: 'y' },
    });
  });
});
