import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { anthropicBlocks, FakeUpstream, responsesStream } from '../helpers/fake-upstream.js';
import { accessLog, entriesOf, sha, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';
import { installClient, RefusingProxy, runClient, type Installed } from '../helpers/real-client.js';

/**
 * The real Codex CLI (`codex exec`), unmodified, against the gateway on a mock model: it speaks
 * only the Responses API, streamed. The answer, the ledger and Codex's own token count must
 * agree, and Codex must not reach anything but the gateway.
 */

const VERSION = '0.169.0';
const KEY = 'sk-codex-test';
const TOOLS_KEY = 'sk-codex-tools';
const CLAUDE_KEY = 'sk-codex-claude';
// $1 input, $2 output, $0.50 cached per million tokens.
const PRICE = { inputPerMillion: 1, outputPerMillion: 2, cacheReadPerMillion: 0.5 };
const usage = (input: number, cached: number, output: number, reasoning: number) => ({
  input_tokens: input, input_tokens_details: { cached_tokens: cached },
  output_tokens: output, output_tokens_details: { reasoning_tokens: reasoning }, total_tokens: input + output,
});

async function folders(dir: string, name: string): Promise<{ codexHome: string; work: string }> {
  const codexHome = join(dir, name, 'codex-home');
  const work = join(dir, name, 'work');
  await mkdir(codexHome, { recursive: true });
  await mkdir(work, { recursive: true });
  return { codexHome, work };
}

/** Codex's config: the gateway as its only provider; everything that phones home switched off. */
async function writeConfig(codexHome: string, gatewayUrl: string, model: string): Promise<void> {
  await writeFile(join(codexHome, 'config.toml'), [
    `model = "${model}"`,
    'model_provider = "gateway"',
    'check_for_update_on_startup = false',
    '',
    '[model_providers.gateway]',
    'name = "Model Gateway"',
    `base_url = "${gatewayUrl}/v1"`,
    'env_key = "GATEWAY_API_KEY"',
    'wire_api = "responses"',
    // A failure is the gateway's to show, not Codex's to retry away.
    'request_max_retries = 0',
    'stream_max_retries = 0',
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
}

describe(`Codex CLI ${VERSION} (codex exec, wire_api = "responses")`, () => {
  let installed: Installed;
  let gw: Running;
  const proxy = new RefusingProxy();
  let proxyUrl: string;
  let dir: string;
  const up = new FakeUpstream();

  before(async () => {
    const upstream = await up.start();
    installed = await installClient('@openai/codex', VERSION, 'codex');
    if ('skip' in installed) console.log(`# skipping the Codex test: ${installed.skip}`);
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 100, concurrency: 4, dailyCapUsd: 1 } },
      accounts: { acct_codex: { plan: 'p' }, acct_tools: { plan: 'p' }, acct_claude: { plan: 'p' } },
      keys: {
        key_codex: { account: 'acct_codex', sha256: sha(KEY) }, key_tools: { account: 'acct_tools', sha256: sha(TOOLS_KEY) },
        key_claude: { account: 'acct_claude', sha256: sha(CLAUDE_KEY) },
      },
      models: {
        'echo-1': { provider: 'mock', price: { inputPerMillion: 1, outputPerMillion: 2 } },
        'gpt-tools': { provider: 'oai', upstreamModel: 'gpt-upstream', price: PRICE },
        'claude-tools': { provider: 'ant', upstreamModel: 'claude-upstream', price: { ...PRICE, cacheWritePerMillion: 4 } },
      },
      providers: {
        mock: { protocol: 'mock' },
        oai: { protocol: 'openai', baseUrl: `${upstream}/v1`, apiKeyEnv: 'UP_KEY' },
        ant: { protocol: 'anthropic', baseUrl: upstream, apiKeyEnv: 'UP_KEY' },
      },
      server: { host: '127.0.0.1', port: 0 },
    }), { env: { UP_KEY: 'sk-provider' } });
    proxyUrl = await proxy.start();
    dir = await mkdtemp(join(tmpdir(), 'mg-codex-'));
  });
  after(async () => {
    await gw.close();
    await up.close();
    await proxy.close();
    await rm(dir, { recursive: true, force: true });
  });

  test('answers a prompt through /v1/responses; the ledger and Codex agree on the tokens; nothing leaves the machine', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const { codexHome, work } = await folders(dir, 'mock');
    await writeConfig(codexHome, gw.url, 'echo-1');

    const prompt = 'Please repeat CODEX-MARKER-7 back';
    const result = await runClient(installed.bin, ['exec', '--skip-git-repo-check', prompt], {
      HOME: dir, CODEX_HOME: codexHome, GATEWAY_API_KEY: KEY, ...proxy.env(proxyUrl),
    }, work);
    assert.equal(result.code, 0, `codex exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`);
    // The mock says the last user message back.
    assert.match(result.stdout, /CODEX-MARKER-7/);

    // Every request Codex made was one the gateway answers.
    const requests = accessLog(gw);
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

  test('a tool call round trip: Codex runs the function_call the provider asked for and sends the whole history back (store: false); both turns charged exactly', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const { codexHome, work } = await folders(dir, 'tools');
    await writeConfig(codexHome, gw.url, 'gpt-tools');
    const call = { call_id: 'call_mg_1', name: 'exec_command', arguments: JSON.stringify({ cmd: 'echo TOOL-OUT-42' }) };
    up.queue.push(
      responsesStream([{ call }], usage(3000, 1000, 40, 12)),
      responsesStream([{ text: 'The command printed TOOL-OUT-42.' }], usage(3100, 3000, 9, 0)),
    );
    const result = await runClient(installed.bin, ['exec', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox', 'Run the echo'], {
      HOME: dir, CODEX_HOME: codexHome, GATEWAY_API_KEY: TOOLS_KEY, ...proxy.env(proxyUrl),
    }, work);
    assert.equal(result.code, 0, `codex exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`);
    assert.match(result.stdout, /The command printed TOOL-OUT-42\./);

    // What reached the provider: our model name and key, Codex's own fields, and on the second
    // turn the call and its output in the input (Codex keeps no server-side state).
    assert.equal(up.seen.length, 2);
    for (const seen of up.seen) {
      assert.equal(seen.path, '/v1/responses');
      assert.equal(seen.headers.authorization, 'Bearer sk-provider');
      assert.equal(seen.body.model, 'gpt-upstream');
      assert.equal(seen.body.store, false);
      assert.equal(seen.body.stream, true);
    }
    const history = up.seen[1]!.body.input as Array<Record<string, unknown>>;
    const sent = history.find((item) => item.type === 'function_call');
    assert.deepEqual([sent?.call_id, sent?.name, sent?.arguments], [call.call_id, call.name, call.arguments]);
    const output = history.find((item) => item.type === 'function_call_output');
    assert.equal(output?.call_id, call.call_id);
    assert.match(JSON.stringify(output?.output), /TOOL-OUT-42/);

    // Two charges from the provider's usage: cached input at the cache price, reasoning in output.
    const charges = entriesOf(gw, 'acct_tools').map((e) => [e.amountMicro, e.inputTokens, e.outputTokens, e.estimated]);
    assert.deepEqual(charges, [
      [-(2000 * 1 + 1000 * 0.5 + 40 * 2), 3000, 40, false],
      [-(100 * 1 + 3000 * 0.5 + 9 * 2), 3100, 9, false],
    ]);
    await until(() => gw.gateway.inFlight === 0, 5000, 'no call in flight');
    assert.equal(proxy.attempts, 0, 'Codex tried to reach the network');
  });

  test('on an Anthropic-protocol provider (translated): the tool call round trip works, each turn a Messages call, charged exactly', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const { codexHome, work } = await folders(dir, 'claude');
    await writeConfig(codexHome, gw.url, 'claude-tools');
    const seenBefore = up.seen.length;
    up.queue.push(
      anthropicBlocks([{ text: 'Running it.' }, { tool: { id: 'toolu_cx1', name: 'exec_command', input: { cmd: 'echo TOOL-OUT-77' } } }], { input: 500, output: 30, cacheRead: 2500 }),
      anthropicBlocks([{ text: 'The command printed TOOL-OUT-77.' }], { input: 100, output: 9, cacheRead: 3000, cacheWrite: 50 }),
    );
    const result = await runClient(installed.bin, ['exec', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox', 'Run the echo'], {
      HOME: dir, CODEX_HOME: codexHome, GATEWAY_API_KEY: CLAUDE_KEY, ...proxy.env(proxyUrl),
    }, work);
    assert.equal(result.code, 0, `codex exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`);
    assert.match(result.stdout, /The command printed TOOL-OUT-77\./);

    const seen = up.seen.slice(seenBefore);
    assert.equal(seen.length, 2);
    const first = seen[0]!.body;
    console.log(`# Codex's tools: ${JSON.stringify((first.tools as Array<{ name?: string; type?: string }>).map((x) => x.type ?? x.name))}`);
    for (const s of seen) {
      assert.equal(s.path, '/v1/messages');
      assert.equal(s.headers['x-api-key'], 'sk-provider');
      assert.equal(s.body.model, 'claude-upstream');
      assert.equal(s.body.stream, true);
      assert.ok(Array.isArray(s.body.system) && (s.body.system as unknown[]).length > 0, 'Codex\'s instructions became the system prompt');
    }
    // The second turn: Codex's whole history, the tool_use and right after it the tool_result with the command's output.
    const turns = seen[1]!.body.messages as Array<{ role: string; content: Array<Record<string, unknown>> }>;
    const useAt = turns.findIndex((turn) => turn.content.some((b) => b.type === 'tool_use' && b.id === 'toolu_cx1'));
    assert.ok(useAt > 0, JSON.stringify(turns));
    const result2 = turns[useAt + 1]!.content.find((b) => b.type === 'tool_result');
    assert.equal(result2?.tool_use_id, 'toolu_cx1');
    assert.match(JSON.stringify(result2?.content), /TOOL-OUT-77/);

    // Charged from Anthropic's usage: input, cache reads and writes each at their price.
    const charges = entriesOf(gw, 'acct_claude').map((e) => [e.amountMicro, e.inputTokens, e.outputTokens, e.estimated]);
    assert.deepEqual(charges, [
      [-(500 * 1 + 2500 * 0.5 + 30 * 2), 3000, 30, false],
      [-(100 * 1 + 3000 * 0.5 + 50 * 4 + 9 * 2), 3150, 9, false],
    ]);
    const dropped = accessLog(gw).filter((r) => r.path === '/v1/responses' && r.dropped !== undefined).map((r) => r.dropped);
    console.log(`# Codex's calls dropped: ${[...new Set(dropped)].join(' | ')}`);
    await until(() => gw.gateway.inFlight === 0, 5000, 'no call in flight');
    assert.equal(proxy.attempts, 0, 'Codex tried to reach the network');
  });
});
