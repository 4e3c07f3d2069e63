// Scratch: syscalls per proxied chat call, gateway vs bare proxy (strace -c), not committed.
import { hash, randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { closedLoop, once, rawRequest, startChild, stopChild, sleep } from '../bench/rawhttp.js';

const ROOT = resolve(__dirname, '..');
const PROXY = join(ROOT, 'bench', 'proxy.ts');
async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'mg-sys-'));
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
  const proxy = await startChild('proxy', process.execPath, ['--import', 'tsx', PROXY, '--role', 'proxy', '--key', providerKey, '--upstream', String(provider.port)], dir, { cwd: ROOT });
  const gw = await startChild('gateway', process.execPath, [join(ROOT, process.argv[2] ?? 'dist', 'main.js'), '--config', join(dir, 'gateway.json'), '--port', '0'], dir,
    { cwd: ROOT, env: { ...process.env, BENCH_PROVIDER_KEY: providerKey } });
  const body = JSON.stringify({ model: 'gpt-bench', max_tokens: 32, messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Say hello to the benchmark.' }] });
  for (const s of [proxy, gw, proxy, gw]) {
    const request = rawRequest('POST', s.port, '/v1/chat/completions', { authorization: `Bearer ${clientKey}`, 'content-type': 'application/json' }, body);
    if ((await once(s.port, request)).status !== 200) throw new Error('not 200');
    await closedLoop({ port: s.port, requests: [request], durationS: 3, connections: 32 });
    const st = spawn('strace', ['-c', '-f', '-p', String(s.pid), '-o', join(dir, `strace.${s.port}`)], { stdio: 'ignore' });
    await sleep(500);
    const run = await closedLoop({ port: s.port, requests: [request], durationS: 4, connections: 32 });
    st.kill('SIGINT');
    await new Promise((r) => st.on('exit', r));
    const text = require('node:fs').readFileSync(join(dir, `strace.${s.port}`), 'utf8') as string;
    console.log(`== ${s === gw ? 'gateway' : 'proxy'}: ${run.requests} requests`);
    for (const line of text.split('\n')) {
      const m = /^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$/.exec(line);
      if (m && Number(m[1]) / run.requests > 0.05) console.log(`  ${m[2].padEnd(16)} ${(Number(m[1]) / run.requests).toFixed(2)} per request`);
    }
  }
  await stopChild(gw.child); await stopChild(proxy.child); await stopChild(provider.child);
}
main();
