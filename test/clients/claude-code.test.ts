import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { FakeUpstream, json } from '../helpers/fake-upstream.js';
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
  const up = new FakeUpstream();

  before(async () => {
    const base = await up.start();
    installed = await installClient('@anthropic-ai/claude-code', VERSION, 'claude');
    if ('skip' in installed) console.log(`# skipping the Claude Code test: ${installed.skip}`);
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 100, concurrency: 4, dailyCapUsd: 1 } },
      accounts: { acct_claude: { plan: 'p' } },
      keys: { key_claude: { account: 'acct_claude', sha256: sha(KEY) } },
      models: {
        'mock-claude': { provider: 'mock', price: { inputPerMillion: 3, outputPerMillion: 15 } },
        'gpt-cc': { provider: 'oai', upstreamModel: 'gpt-upstream', price: { inputPerMillion: 2, outputPerMillion: 8, cacheReadPerMillion: 0.5 } },
      },
      providers: { mock: { protocol: 'mock' }, oai: { protocol: 'openai', baseUrl: `${base}/v1`, apiKeyEnv: 'UP_KEY' } },
      server: { host: '127.0.0.1', port: 0 },
    }), { env: { UP_KEY: 'sk-provider' } });
    proxyUrl = await proxy.start();
    dir = await mkdtemp(join(tmpdir(), 'mg-claude-'));
  });
  after(async () => {
    await gw.close();
    await up.close();
    await proxy.close();
    await rm(dir, { recursive: true, force: true });
  });

  /** Runs `claude -p PROMPT` with every model it might pick (main, small/fast, haiku) set to `model`, in a fresh HOME. */
  async function claude(name: string, model: string, prompt: string) {
    const home = join(dir, name, 'home');
    const work = join(dir, name, 'work');
    await mkdir(home, { recursive: true });
    await mkdir(work, { recursive: true });
    return runClient((installed as { bin: string }).bin, ['-p', '--output-format', 'json', prompt], {
      HOME: home,
      ANTHROPIC_BASE_URL: gw.url,
      ANTHROPIC_API_KEY: KEY,
      ANTHROPIC_MODEL: model,
      ANTHROPIC_SMALL_FAST_MODEL: model,
      ANTHROPIC_DEFAULT_HAIKU_MODEL: model,
      DISABLE_TELEMETRY: '1',
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
      DISABLE_AUTOUPDATER: '1',
      DISABLE_ERROR_REPORTING: '1',
      ...proxy.env(proxyUrl),
    }, work);
  }

  test('answers a prompt through /v1/messages; the ledger and Claude Code agree on the tokens; nothing leaves the machine', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const result = await claude('mock', 'mock-claude', 'Please repeat CLAUDE-MARKER-9 back');
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

  test('on an OpenAI-protocol provider (translated): answers through /v1/messages, each call a chat call upstream, charged exactly', async (t) => {
    if ('skip' in installed) return t.skip(installed.skip);
    const calls = entriesOf(gw, 'acct_claude').length;
    const logged = accessLog(gw).length;
    // The provider: an OpenAI-compatible server answering every chat call with the marker.
    up.fallback = (_req, res, body) => {
      const usage = { prompt_tokens: 2000, completion_tokens: 7, total_tokens: 2007, prompt_tokens_details: { cached_tokens: 500 } };
      const text = 'CLAUDE-ON-GPT-OK';
      if (body.stream !== true) return json(res, 200, { id: 'chatcmpl-cc', object: 'chat.completion', choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: text } }], usage });
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta: unknown, finish: string | null) => `data: ${JSON.stringify({ id: 'chatcmpl-cc', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.end(`${chunk({ role: 'assistant', content: '' }, null)}${chunk({ content: 'CLAUDE-ON-' }, null)}${chunk({ content: 'GPT-OK' }, null)}${chunk({}, 'stop')}` +
        `data: ${JSON.stringify({ id: 'chatcmpl-cc', object: 'chat.completion.chunk', choices: [], usage })}\n\ndata: [DONE]\n\n`);
    };
    const result = await claude('gpt', 'gpt-cc', 'Say the marker');
    assert.equal(result.code, 0, `claude exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`);
    const report = JSON.parse(result.stdout) as { is_error: boolean; result: string };
    assert.equal(report.is_error, false);
    assert.match(report.result, /CLAUDE-ON-GPT-OK/);

    const requests = accessLog(gw).slice(logged);
    for (const r of requests) assert.ok((r.status as number) < 300, `Claude Code got ${r.status} for ${r.method} ${r.path}: ${JSON.stringify(r)}`);
    const modelCalls = requests.filter((r) => r.path === '/v1/messages');
    assert.ok(modelCalls.length > 0);
    console.log(`# Claude Code's calls dropped: ${[...new Set(modelCalls.map((r) => r.dropped))].join(' | ')}`);
    for (const seen of up.seen) {
      assert.equal(seen.path, '/v1/chat/completions');
      assert.equal(seen.body.model, 'gpt-upstream');
      assert.equal((seen.body.messages as Array<{ role: string }>)[0]!.role, 'system', 'its system prompt leads');
    }
    const charges = entriesOf(gw, 'acct_claude').slice(calls);
    assert.equal(charges.length, modelCalls.length);
    for (const e of charges) {
      assert.deepEqual([e.model, e.estimated, e.inputTokens, e.outputTokens], ['gpt-cc', false, 2000, 7]);
      // 1,500 x $2 + 500 x $0.5 + 7 x $8 per million.
      assert.equal(e.amountMicro, -(3000 + 250 + 56));
    }
    await until(() => gw.gateway.inFlight === 0, 5000, 'no call in flight');
    assert.equal(proxy.attempts, 0, 'Claude Code tried to reach the network');
  });
});
