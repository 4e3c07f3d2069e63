import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { entriesOf, sha, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { installClient, RefusingProxy, runClient, type Installed } from '../helpers/real-client.js';

/**
 * The real Codex CLI (`codex exec`), unmodified, against the gateway on a mock model: it speaks
 * only the Responses API, streamed. The answer, the ledger and Codex's own token count must
 * agree, and Codex must not reach anything but the gateway.
 */

const VERSION = '0.169.0';
const KEY = 'sk-codex-test';

describe(`Codex CLI ${VERSION} (codex exec, wire_api = "responses")`, () => {
  let installed: Installed;
  let gw: Running;
  const proxy = new RefusingProxy();
  let proxyUrl: string;
  let dir: string;

  before(async () => {
    installed = await installClient('@openai/codex', VERSION, 'codex');
    if ('skip' in installed) console.log(`# skipping the Codex test: ${installed.skip}`);
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 100, concurrency: 4, dailyCapUsd: 1 } },
      accounts: { acct_codex: { plan: 'p' } },
      keys: { key_codex: { account: 'acct_codex', sha256: sha(KEY) } },
      models: { 'echo-1': { provider: 'mock', price: { inputPerMillion: 1, outputPerMillion: 2 } } },
      providers: { mock: { protocol: 'mock' } },
      server: { host: '127.0.0.1', port: 0 },
    }));
    proxyUrl = await proxy.start();
    dir = await mkdtemp(join(tmpdir(), 'mg-codex-'));
  });
  after(async () => {
    await gw.close();
    await proxy.close();
    await rm(dir, { recursive: true, force: true });
  });

  test('answers a prompt through /v1/responses; the ledger and Codex agree on the tokens; nothing leaves the machine', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const codexHome = join(dir, 'codex-home');
    const work = join(dir, 'work');
    await mkdir(codexHome);
    await mkdir(work);
    // Everything that phones home is switched off; the proxy catches whatever is left.
    await writeFile(join(codexHome, 'config.toml'), [
      'model = "echo-1"',
      'model_provider = "gateway"',
      'check_for_update_on_startup = false',
      '',
      '[model_providers.gateway]',
      'name = "Model Gateway"',
      `base_url = "${gw.url}/v1"`,
      'env_key = "GATEWAY_API_KEY"',
      'wire_api = "responses"',
      '',
      '[analytics]',
      'enabled = false',
      '',
      '[features]',
      'plugins = false',
      'plugin_sharing = false',
      'remote_plugin = false',
      'apps = false',
      'in_app_updates = false',
      '',
    ].join('\n'));

    const prompt = 'Please repeat CODEX-MARKER-7 back';
    const result = await runClient(installed.bin, ['exec', '--skip-git-repo-check', prompt], {
      HOME: dir, CODEX_HOME: codexHome, GATEWAY_API_KEY: KEY, ...proxy.env(proxyUrl),
    }, work);
    assert.equal(result.code, 0, `codex exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`);
    // The mock says the last user message back.
    assert.match(result.stdout, /CODEX-MARKER-7/);

    // Every request Codex made was one the gateway answers.
    const requests = gw.logs.map((line) => JSON.parse(line) as Record<string, unknown>).filter((l) => l.msg === 'request');
    assert.ok(requests.some((r) => r.path === '/v1/responses'), JSON.stringify(requests));
    for (const r of requests) assert.ok((r.status as number) < 300, `Codex got ${r.status} for ${r.method} ${r.path}`);

    // One exact charge per model call, from the usage the mock reported in response.completed.
    const charges = entriesOf(gw, 'acct_codex');
    assert.ok(charges.length >= 1);
    let tokens = 0;
    for (const e of charges) {
      assert.equal(e.type, 'charge');
      assert.equal(e.model, 'echo-1');
      assert.equal(e.estimated, false);
      assert.ok(e.inputTokens > 0 && e.outputTokens > 0);
      assert.equal(e.amountMicro, -(e.inputTokens * 1 + e.outputTokens * 2));
      tokens += e.inputTokens + e.outputTokens;
    }
    assert.equal(requests.filter((r) => r.path === '/v1/responses').length, charges.length);
    // Codex prints the tokens it read from the same usage.
    const used = /tokens used\s+([\d,]+)/.exec(result.stderr);
    assert.ok(used !== null, result.stderr);
    assert.equal(Number(used[1]!.replaceAll(',', '')), tokens);

    await until(() => gw.gateway.inFlight === 0, 5000, 'no call in flight');
    assert.equal(proxy.attempts, 0, 'Codex tried to reach the network');
  });
});
