// Scratch: CPU profile of the gateway under proxied chat load (not committed).
import { hash, randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { closedLoop, once, rawRequest, startChild, stopChild } from '../bench/rawhttp.js';

const ROOT = resolve(__dirname, '..');
const PROXY = join(ROOT, 'bench', 'proxy.ts');
async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'mg-prof-'));
  const providerKey = `sk-upstream-${randomBytes(12).toString('hex')}`;
  const clientKey = `sk-bench-${randomBytes(16).toString('hex')}`;
  const provider = await startChild('provider', process.execPath, ['--import', 'tsx', PROXY, '--role', 'provider', '--key', providerKey], dir, { cwd: ROOT });
  const config = {
    server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
    limiter: { store: 'memory' }, ledger: { store: 'memory' },
    plans: { bench: { rpm: 2_000_000, concurrency: 100_000, dailyCapUsd: 'unlimited' } },
    accounts: { acct_bench: { plan: 'bench' } },
    keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', clientKey) } },
    models: { 'gpt-bench': { provider: 'fake', upstreamModel: 'gpt-upstream-bench', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } } },
    providers: { fake: { protocol: 'openai', baseUrl: `http://127.0.0.1:${provider.port}/v1`, apiKeyEnv: 'BENCH_PROVIDER_KEY' } },
  };
  writeFileSync(join(dir, 'gateway.json'), JSON.stringify(config));
  const dist = process.argv[2] ?? 'dist';
  const gw = await startChild('gateway', process.execPath, ['--cpu-prof', `--cpu-prof-dir=${dir}`, join(resolve(ROOT, dist), 'main.js'), '--config', join(dir, 'gateway.json'), '--port', '0'], dir,
    { cwd: ROOT, env: { ...process.env, BENCH_PROVIDER_KEY: providerKey } });
  const body = JSON.stringify({ model: 'gpt-bench', max_tokens: 32, messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Say hello to the benchmark.' }] });
  const request = rawRequest('POST', gw.port, '/v1/chat/completions', { authorization: `Bearer ${clientKey}`, 'content-type': 'application/json' }, body);
  const first = await once(gw.port, request);
  if (first.status !== 200) throw new Error(`answered ${first.status}`);
  const run = await closedLoop({ port: gw.port, requests: [request], durationS: 15, connections: 32 });
  console.log('requests', run.requests, JSON.stringify(run.statuses));
  await stopChild(gw.child);
  await stopChild(provider.child);
  console.log(dir, readdirSync(dir));
}
main();
