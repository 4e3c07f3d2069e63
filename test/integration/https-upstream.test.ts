import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { hash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import { after, before, describe, test } from 'node:test';
import { openaiCompletion } from '../helpers/fake-upstream.js';
import { chatBody, postJson } from '../helpers/gateway.js';
import { spawnListening, type Spawned } from '../helpers/spawn.js';

const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');

/**
 * A provider over HTTPS with a certificate for "localhost" that only the gateway process trusts
 * (NODE_EXTRA_CA_CERTS): the call must verify the certificate and send SNI and Host right.
 */
describe('a provider over HTTPS', () => {
  const dir = mkdtempSync(join(tmpdir(), 'mg-https-'));
  let provider: Server;
  let gateway: Spawned;
  let connections = 0;
  const seen: Array<{ sni: string | false | null; host: string | undefined; auth: string | undefined; model: unknown }> = [];

  before(async () => {
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=localhost',
      '-addext', 'subjectAltName=DNS:localhost', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
    ], { stdio: 'ignore' });
    provider = createServer({ key: readFileSync(join(dir, 'key.pem')), cert: readFileSync(join(dir, 'cert.pem')) }, (req, res) => {
      let body = '';
      req.on('data', (c) => { body += c; });
      req.on('end', () => {
        seen.push({
          sni: (req.socket as TLSSocket).servername, host: req.headers.host, auth: req.headers.authorization,
          model: (JSON.parse(body) as { model: unknown }).model,
        });
        const answer = JSON.stringify(openaiCompletion('over tls'));
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
        res.end(answer);
      });
    });
    provider.on('secureConnection', () => { connections++; });
    await new Promise<void>((resolve) => provider.listen(0, '127.0.0.1', resolve));
    const port = (provider.address() as AddressInfo).port;
    writeFileSync(join(dir, 'config.json'), JSON.stringify({
      server: { host: '127.0.0.1', port: 0 },
      plans: { p: { rpm: 100, concurrency: 2 } },
      accounts: { acct_a: { plan: 'p' } },
      keys: { key_a: { account: 'acct_a', sha256: hash('sha256', 'sk-client') } },
      models: { 'gpt-tls': { provider: 'tls', upstreamModel: 'up-tls', price: 'free' } },
      providers: { tls: { protocol: 'openai', baseUrl: `https://localhost:${port}/v1`, apiKeyEnv: 'TLS_PROVIDER_KEY' } },
    }));
    gateway = await spawnListening(process.execPath, [MAIN, '--config', join(dir, 'config.json'), '--port', '0'], {
      env: { PATH: process.env.PATH ?? '', NODE_EXTRA_CA_CERTS: join(dir, 'cert.pem'), TLS_PROVIDER_KEY: 'sk-provider' },
    });
  });

  after(async () => {
    gateway?.child.kill('SIGTERM');
    await gateway?.exited;
    await new Promise((resolve) => provider?.close(resolve));
    rmSync(dir, { recursive: true, force: true });
  });

  test('the call is verified, names the host (SNI and Host) and reuses its connection', async () => {
    for (let i = 0; i < 3; i++) {
      const res = await postJson(`${gateway.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-tls', 'hi'));
      assert.equal(res.status, 200, await res.clone().text());
      assert.equal(((await res.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content, 'over tls');
    }
    const port = (provider.address() as AddressInfo).port;
    assert.equal(seen.length, 3);
    assert.equal(connections, 1, 'one TLS connection, kept alive');
    for (const s of seen) {
      assert.deepEqual(s, { sni: 'localhost', host: `localhost:${port}`, auth: 'Bearer sk-provider', model: 'up-tls' });
    }
  });
});
