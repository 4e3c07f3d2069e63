import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { hash } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { testConfig, until } from '../helpers/gateway.js';
import { spawnListening, type Spawned } from '../helpers/spawn.js';

const run = promisify(execFile);
const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');
const dir = mkdtempSync(join(tmpdir(), 'mg-cli-'));

function writeConfig(name: string, config: unknown): string {
  const file = join(dir, name);
  writeFileSync(file, JSON.stringify(config));
  return file;
}

/** Spawns the built CLI and waits for its "listening" line. */
function startCli(args: string[], env: Record<string, string> = {}): Promise<Spawned> {
  return spawnListening(process.execPath, [MAIN, ...args], { env: { ...process.env, ...env } });
}

describe('CLI', () => {
  test('npm start path: the demo prints a key and a curl line that works when pasted', async () => {
    const gw = await startCli(['--port', '0']);
    try {
      for (let i = 0; i < 100 && !gw.stderr().includes('Run with your own config'); i++) await new Promise((r) => setTimeout(r, 10));
      const banner = gw.stderr();
      assert.match(banner, /Demo API key: {2}sk-demo-/);
      const curlLine = banner.split('\n').map((l) => l.trim()).find((l) => l.startsWith('curl') && l.includes('/v1/models'));
      assert.ok(curlLine, `no curl line in:\n${banner}`);
      const { stdout } = await run('sh', ['-c', curlLine]);
      const body = JSON.parse(stdout) as { object: string; data: Array<{ id: string }> };
      assert.equal(body.object, 'list');
      assert.ok(body.data.some((m) => m.id === 'echo-1'));
      const chatLine = banner.split('\n').map((l) => l.trim()).find((l) => l.startsWith('curl') && l.includes('/chat/completions'));
      const chat = JSON.parse((await run('sh', ['-c', chatLine!])).stdout) as { choices: Array<{ message: { content: string } }> };
      assert.equal(chat.choices[0]!.message.content, 'Hello, gateway');
      // stdout holds JSON lines only (the access line of the chat call included, once flushed).
      await until(() => gw.stdout().includes('"path":"/v1/chat/completions"'), 5000, 'the access line');
      for (const line of gw.stdout().trim().split('\n')) JSON.parse(line);
    } finally {
      gw.child.kill('SIGTERM');
      assert.equal(await gw.exited, 0);
    }
  });

  test('hash-key, new-key', async () => {
    assert.equal((await run(process.execPath, [MAIN, 'hash-key', 'sk-x'])).stdout.trim(), hash('sha256', 'sk-x'));
    const out = (await run(process.execPath, [MAIN, 'new-key'])).stdout;
    const key = /key: +(\S+)/.exec(out)![1]!;
    const digest = /sha256: +([0-9a-f]{64})/.exec(out)![1]!;
    assert.equal(hash('sha256', key), digest);
    await assert.rejects(run(process.execPath, [MAIN, 'hash-key']), (e: { code: number }) => e.code === 1);
  });

  test('check-config: exit 0 when valid, exit 1 naming every problem by JSON path', async () => {
    const good = writeConfig('good.json', testConfig());
    assert.match((await run(process.execPath, [MAIN, 'check-config', good])).stdout, /valid/);
    const bad = writeConfig('bad.json', { accounts: { acct_a: { plan: 'gold' } }, server: { port: 'x' } });
    await assert.rejects(run(process.execPath, [MAIN, 'check-config', bad]), (e: { code: number; stderr: string }) => {
      assert.equal(e.code, 1);
      assert.match(e.stderr, /accounts\.acct_a\.plan: unknown plan "gold"/);
      assert.match(e.stderr, /server\.port: must be an integer/);
      return true;
    });
    const notJson = join(dir, 'broken.json');
    writeFileSync(notJson, '{');
    await assert.rejects(run(process.execPath, [MAIN, 'check-config', notJson]), (e: { code: number; stderr: string }) =>
      e.code === 1 && /not valid JSON/.test(e.stderr));
  });

  test('a bad config at start-up exits 1 with the problem, not a stack trace', async () => {
    const bad = writeConfig('bad-start.json', { keys: { k: { account: 'nobody', key: 'x' } } });
    await assert.rejects(run(process.execPath, [MAIN, '--config', bad, '--port', '0']), (e: { code: number; stderr: string }) => {
      assert.equal(e.code, 1);
      assert.match(e.stderr, /keys\.k\.account: unknown account "nobody"/);
      assert.doesNotMatch(e.stderr, /at .*\.js:\d+/);
      return true;
    });
    await assert.rejects(run(process.execPath, [MAIN, '--bogus']), (e: { code: number }) => e.code === 1);
  });

  test('MODEL_GATEWAY_CONFIG and PORT from the environment; flags win', async () => {
    const file = writeConfig('env.json', testConfig());
    const gw = await startCli(['--port', '0'], { MODEL_GATEWAY_CONFIG: file, PORT: '1' });
    try {
      const res = await fetch(`${gw.url}/v1/models`, { headers: { 'x-api-key': 'sk-alice' } });
      assert.equal(res.status, 200);
    } finally {
      gw.child.kill('SIGINT');
      assert.equal(await gw.exited, 0);
    }
  });

  test('found in review: an empty HOST is unset (it bound every interface); a config file with a byte order mark is read', async () => {
    const file = join(dir, 'bom.json');
    writeFileSync(file, `\ufeff${JSON.stringify(testConfig())}`);
    const gw = await startCli(['--config', file, '--port', '0'], { HOST: '' });
    try {
      assert.match(gw.url, /^http:\/\/127\.0\.0\.1:\d+$/, 'the config\'s host');
    } finally {
      gw.child.kill('SIGINT');
      assert.equal(await gw.exited, 0);
    }
  });

  test('SIGHUP reloads keys and limits without a restart; an invalid file is rejected whole', async () => {
    const file = writeConfig('reload.json', testConfig());
    const gw = await startCli(['--config', file, '--port', '0']);
    const models = (key: string) => fetch(`${gw.url}/v1/models`, { headers: { 'x-api-key': key } }).then(async (r) => { await r.text(); return r.status; });
    const hup = async (expect: RegExp) => {
      gw.child.kill('SIGHUP');
      for (let i = 0; i < 100 && !expect.test(gw.stdout()); i++) await new Promise((r) => setTimeout(r, 20));
      assert.match(gw.stdout(), expect);
    };
    try {
      assert.equal(await models('sk-carol'), 401);
      const next = testConfig() as { keys: Record<string, unknown> };
      next.keys.key_carol = { account: 'acct_bob', key: 'sk-carol' };
      delete next.keys.key_alice;
      writeFileSync(file, JSON.stringify(next));
      await hup(/config reloaded/);
      assert.equal(await models('sk-carol'), 200);
      assert.equal(await models('sk-alice'), 401, 'a removed key stops working at once');
      assert.doesNotMatch(gw.stdout(), /apply only after a restart/);
      // maxBodyBytes is read per request: no warning. maxConnections is set on the server once: named, at every reload until a restart.
      (next as { server?: unknown }).server = { ...(testConfig() as { server: object }).server, maxBodyBytes: 1000 };
      writeFileSync(file, JSON.stringify(next));
      await hup(/config reloaded(.|\n)*config reloaded/);
      assert.doesNotMatch(gw.stdout(), /apply only after a restart/);
      (next as { server?: unknown }).server = { ...(testConfig() as { server: object }).server, maxBodyBytes: 1000, maxConnections: 77 };
      writeFileSync(file, JSON.stringify(next));
      await hup(/changes to these sections apply only after a restart","sections":\["server.maxConnections"\]/);
      await hup(/(apply only after a restart(.|\n)*){2}/); // and again at the next reload
      writeFileSync(file, '{"plans": 3}');
      await hup(/config reload rejected/);
      assert.equal(await models('sk-carol'), 200);
    } finally {
      gw.child.kill('SIGTERM');
      assert.equal(await gw.exited, 0);
    }
  });

  test('SIGTERM drains: /readyz 503 at once, the in-flight stream finishes, exit 0', async () => {
    const config = testConfig({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 400 },
      providers: { mock: { protocol: 'mock', tokensPerSecond: 20 }, slow: { protocol: 'mock' } },
    });
    const gw = await startCli(['--config', writeConfig('drain.json', config)]);
    const stream = fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'x-api-key': 'sk-alice', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'echo-1', stream: true, messages: [{ role: 'user', content: 'z'.repeat(40) }] }),
    });
    const res = await stream;
    gw.child.kill('SIGTERM');
    await until(() => gw.stdout().includes('"msg":"draining"'), 5000, 'draining');
    const ready = await fetch(`${gw.url}/readyz`);
    assert.equal(ready.status, 503);
    assert.deepEqual(await ready.json(), { status: 'not_ready', reason: 'draining' });
    assert.equal(ready.headers.get('connection'), 'close');
    const text = await res.text();
    assert.ok(text.endsWith('data: [DONE]\n\n'), 'the stream completed');
    assert.equal(await gw.exited, 0);
    assert.match(gw.stdout(), /"msg":"stopped"/);
  });
});

describe('secrets never reach the logs or the data directory', () => {
  test('a full session of requests: no key, key hash or admin key in stdout, stderr or files', async () => {
    const { readdirSync, readFileSync } = await import('node:fs');
    const dataDir = join(dir, 'secrets-data');
    const file = writeConfig('secrets.json', testConfig({ ledger: { store: 'file', dir: dataDir } }));
    const admin = 'admin-key-do-not-log-7f3a';
    const gw = await startCli(['--config', file, '--port', '0'], { MODEL_GATEWAY_ADMIN_KEY: admin });
    const keys = ['sk-alice', 'sk-bob', 'sk-off', 'sk-alice-narrow', 'sk-unknown-key-xyz', admin];
    try {
      const call = (key: string, path: string, init: RequestInit = {}) =>
        fetch(`${gw.url}${path}`, { ...init, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' } }).then((r) => r.text());
      const created = JSON.parse(await call(admin, '/admin/v1/keys', { method: 'POST', body: JSON.stringify({ account: 'acct_bob' }) })) as { key: string };
      keys.push(created.key);
      for (const key of keys) {
        await call(key, '/v1/models');
        await call(key, '/v1/chat/completions', { method: 'POST', body: JSON.stringify({ model: 'paid-1', messages: [{ role: 'user', content: key }] }) });
        await call(key, '/v1/chat/completions', { method: 'POST', body: '{broken' });
        await call(key, '/admin/v1/keys');
      }
      await fetch(`${gw.url}/v1/models`, { headers: { 'x-api-key': 'sk-alice', authorization: 'Bearer sk-bob' } }).then((r) => r.text());
    } finally {
      gw.child.kill('SIGTERM');
      await gw.exited;
    }
    const read = (f: string) => readFileSync(join(dataDir, f), 'utf8');
    // admin-state.json holds the hashes of admin-created keys (like a config file): never a plaintext key.
    const journal = readdirSync(dataDir).filter((f) => f !== 'admin-state.json').map(read).join('\n');
    const logs = `${gw.stdout()}\n${gw.stderr()}\n${journal}`;
    assert.match(gw.stdout(), /"msg":"request"/);
    for (const key of keys) {
      assert.ok(!`${logs}\n${read('admin-state.json')}`.includes(key), `a key leaked: ${key.slice(0, 6)}...`);
      assert.ok(!logs.includes(hash('sha256', key)), `the hash of a key leaked: ${key.slice(0, 6)}...`);
    }
  });

  test('signals during start-up (found in review: SIGHUP killed the process, SIGTERM exited by signal): a SIGHUP reloads once started, a SIGTERM exits 0', async () => {
    // A "Redis" that takes connections and never answers: start-up waits for it (up to 3 s),
    // and the test signals the moment the gateway has connected, inside that wait.
    const connected: Array<() => void> = [];
    const sockets: import('node:net').Socket[] = [];
    const silent = createServer((socket) => {
      sockets.push(socket);
      socket.on('error', () => {});
      connected.shift()?.();
    });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    const port = (silent.address() as import('node:net').AddressInfo).port;
    const file = writeConfig('slow-start.json', { ...testConfig(), limiter: { store: 'redis', url: `redis://127.0.0.1:${port}` } });
    try {
      const connecting = () => new Promise<void>((r) => connected.push(r));
      let child: import('node:child_process').ChildProcess | undefined;
      const onSpawn = (c: import('node:child_process').ChildProcess) => { child = c; };
      let reached = connecting();
      const reloading = spawnListening(process.execPath, [MAIN, '--config', file, '--port', '0'], { onSpawn });
      await reached;
      child!.kill('SIGHUP');
      const gw = await reloading;
      try {
        await until(() => gw.stdout().includes('config reloaded'), 5000, 'the reload once started');
        assert.match(gw.stdout(), /SIGHUP during start-up/);
      } finally {
        gw.child.kill('SIGKILL');
        await gw.exited;
      }

      reached = connecting();
      const stopping = spawnListening(process.execPath, [MAIN, '--config', file, '--port', '0'], { onSpawn }).catch((err: Error) => err);
      await reached;
      child!.kill('SIGTERM');
      const outcome = await stopping;
      assert.ok(outcome instanceof Error, 'it never listened');
      assert.match(outcome.message, /exited 0 before listening/);
    } finally {
      for (const s of sockets) s.destroy();
      silent.close();
    }
  });
});
