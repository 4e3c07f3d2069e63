import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { accessLog, entriesOf, sha, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { installClient, RefusingProxy, runClient, type Installed } from '../helpers/real-client.js';

/**
 * The real Claude Code (`claude -p`), unmodified, against the gateway on a mock model over the
 * Messages API (ANTHROPIC_BASE_URL). The answer, the ledger and Claude Code's own usage report
 * must agree, and Claude Code must not reach anything but the gateway.
 */

const VERSION = '2.1.328';
const KEY = 'sk-claude-code-test';

describe(`Claude Code ${VERSION} (claude -p, ANTHROPIC_BASE_URL)`, () => {
  let installed: Installed;
  let gw: Running;
  const proxy = new RefusingProxy();
  let proxyUrl: string;
  let dir: string;

  before(async () => {
    installed = await installClient('@anthropic-ai/claude-code', VERSION, 'claude');
    if ('skip' in installed) console.log(`# skipping the Claude Code test: ${installed.skip}`);
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 100, concurrency: 4, dailyCapUsd: 1 } },
      accounts: { acct_claude: { plan: 'p' } },
      keys: { key_claude: { account: 'acct_claude', sha256: sha(KEY) } },
      models: { 'mock-claude': { provider: 'mock', price: { inputPerMillion: 3, outputPerMillion: 15 } } },
      providers: { mock: { protocol: 'mock' } },
      server: { host: '127.0.0.1', port: 0 },
    }));
    proxyUrl = await proxy.start();
    dir = await mkdtemp(join(tmpdir(), 'mg-claude-'));
  });
  after(async () => {
    await gw.close();
    await proxy.close();
    await rm(dir, { recursive: true, force: true });
  });

  test('answers a prompt through /v1/messages; the ledger and Claude Code agree on the tokens; nothing leaves the machine', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const home = join(dir, 'home');
    const work = join(dir, 'work');
    await mkdir(home);
    await mkdir(work);
    const result = await runClient(installed.bin, ['-p', '--output-format', 'json', 'Please repeat CLAUDE-MARKER-9 back'], {
      HOME: home,
      ANTHROPIC_BASE_URL: gw.url,
      ANTHROPIC_API_KEY: KEY,
      // Every model Claude Code might pick (main, small/fast, haiku) is the gateway's mock.
      ANTHROPIC_MODEL: 'mock-claude',
      ANTHROPIC_SMALL_FAST_MODEL: 'mock-claude',
      ANTHROPIC_DEFAULT_HAIKU_MODEL: 'mock-claude',
      DISABLE_TELEMETRY: '1',
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
      DISABLE_AUTOUPDATER: '1',
      DISABLE_ERROR_REPORTING: '1',
      ...proxy.env(proxyUrl),
    }, work);
    assert.equal(result.code, 0, `claude exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`);
    const report = JSON.parse(result.stdout) as {
      is_error: boolean; result: string;
      usage: { input_tokens: number; output_tokens: number; cache_read_input_tokens: number; cache_creation_input_tokens: number };
    };
    assert.equal(report.is_error, false);
    // The mock says the last user message back.
    assert.match(report.result, /CLAUDE-MARKER-9/);

    // Every request Claude Code made was one the gateway answers.
    const requests = accessLog(gw);
    assert.ok(requests.some((r) => r.path === '/v1/messages'), JSON.stringify(requests));
    for (const r of requests) assert.ok((r.status as number) < 300, `Claude Code got ${r.status} for ${r.method} ${r.path}`);

    // One exact charge per model call, from the usage the mock reported.
    const charges = entriesOf(gw, 'acct_claude');
    assert.equal(charges.length, requests.filter((r) => r.path === '/v1/messages').length);
    let input = 0;
    let output = 0;
    for (const e of charges) {
      assert.equal(e.type, 'charge');
      assert.equal(e.model, 'mock-claude');
      assert.equal(e.estimated, false);
      assert.equal(e.amountMicro, -(e.inputTokens * 3 + e.outputTokens * 15));
      input += e.inputTokens;
      output += e.outputTokens;
    }
    // Claude Code's own report adds up the same usage.
    const u = report.usage;
    assert.equal(u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens, input);
    assert.equal(u.output_tokens, output);

    await until(() => gw.gateway.inFlight === 0, 5000, 'no call in flight');
    assert.equal(proxy.attempts, 0, 'Claude Code tried to reach the network');
  });
});
