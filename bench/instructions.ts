/**
 * Instructions per proxied call (`--call chat`) or per `GET /v1/models` (`--call models`),
 * counted by valgrind's callgrind: the bare Node proxy of proxy.ts, or the bare node:http
 * baseline of baseline.ts, against one or more builds of the gateway. `--call messages-long`
 * and `--call chat-long` count a long streamed answer (proxy.ts's 200 deltas) from a model on an
 * Anthropic provider, passed through (`/v1/messages`) or translated (chat): builds only, no bare
 * server. Timings on this 2-vCPU VM move by ±10 %
 * from one minute to the next; instruction counts repeat within about 1 %, so this is how a
 * change to the hot path is judged before the timed bench (proxy.ts) confirms it.
 *
 *   npm run build && node --import tsx bench/instructions.ts [--call chat|models|messages-long|chat-long] [--gateway NAME=DIST_DIR ...]
 *     [--warmup 15] [--window 8] [--windows 3]
 *
 * Each server runs under `valgrind --tool=callgrind` with instrumentation off, is warmed up
 * with a closed loop (32 connections) for --warmup seconds, then counts instructions over
 * --windows windows of --window seconds each (after one more that is thrown away). Reported: instructions of the main (JavaScript)
 * thread per answered request, per window, with the median; the V8 helper threads (GC) are left
 * out because valgrind runs them at a different pace than real time, which changes how much
 * they do. The gateway defaults to `dist/` (`--gateway gateway=dist`); several builds can be
 * compared in one run (copy each build's dist/ aside first). Needs valgrind (on every machine
 * of this kind). Takes about a minute per server and window setting.
 */
import { execFileSync } from 'node:child_process';
import { hash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { bool, choice, fmtInt, int, median, num, parseFlags, runMain, strs } from './cli.js';
import { LONG_MAX_TOKENS } from './proxy.js';
import { closedLoop, once, rawRequest, startChild, stopChild, type Child } from './rawhttp.js';

const ROOT = resolve(__dirname, '..');

/** callgrind_control, quietly: -i on|off (instrumentation), -z (zero the counters), -d (dump). */
function control(flag: string, value: string | null, pid: number): void {
  execFileSync('callgrind_control', value === null ? [flag, String(pid)] : [flag, value, String(pid)], { stdio: 'ignore' });
}
const PROXY = join(__dirname, 'proxy.ts');
const BASELINE = join(__dirname, 'baseline.ts');

const FLAGS = {
  call: choice({
    choices: ['chat', 'models', 'messages-long', 'chat-long'], default: 'chat',
    help: 'a proxied chat call (against the bare proxy), GET /v1/models (against the bare baseline), or a long stream passed through or translated (builds only)',
  }),
  gateways: strs({ name: 'gateway', arg: 'NAME=DIST_DIR', pattern: /^[\w-]+=.+$/, help: 'a build to measure (default: gateway=dist)' }),
  warmupS: num({ name: 'warmup', default: 15, help: 'seconds of warmup per server' }),
  windowS: num({ name: 'window', default: 8, help: 'seconds per counted window' }),
  windows: int({ default: 3, help: 'counted windows per server' }),
  rpm: int({ default: 2_000_000, min: 0, help: "the plan's requests per minute (0: no RPM limit)" }),
  keep: bool({ help: 'keep the callgrind dumps (their folder is printed), for callgrind_annotate' }),
};

async function main(): Promise<void> {
  const flags = parseFlags('instructions.ts', FLAGS);
  const gateways = (flags.gateways.length === 0 ? ['gateway=dist'] : flags.gateways).map((g) => g.split('=', 2) as [string, string]);
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-instr-'));
  const children: Child[] = [];
  try {
    const providerKey = `sk-upstream-${randomBytes(12).toString('hex')}`;
    const clientKey = `sk-bench-${randomBytes(16).toString('hex')}`;
    const underCallgrind = (name: string) => [
      'valgrind', '--tool=callgrind', '--smc-check=all-non-file', '--instr-atstart=no', '--separate-threads=yes',
      `--callgrind-out-file=${dir}/cg.${name}`, process.execPath,
    ];
    // The provider runs natively; only the server measured runs under valgrind.
    const provider = await startChild('provider', process.execPath, ['--import', 'tsx', PROXY, '--role', 'provider', '--key', providerKey], dir, { cwd: ROOT });
    children.push(provider);
    const servers: Array<{ name: string; child: Child }> = [];
    const config = {
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      limiter: { store: 'memory' }, ledger: { store: 'memory' },
      plans: { bench: { ...(flags.rpm === 0 ? {} : { rpm: flags.rpm }), concurrency: 100_000, dailyCapUsd: 'unlimited' } },
      accounts: { acct_bench: { plan: 'bench' } },
      keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', clientKey) } },
      models: {
        'gpt-bench': { provider: 'fake', upstreamModel: 'gpt-upstream-bench', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
        'claude-bench': { provider: 'fake-anthropic', upstreamModel: 'gpt-upstream-bench', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
      },
      providers: {
        fake: { protocol: 'openai', baseUrl: `http://127.0.0.1:${provider.port}/v1`, apiKeyEnv: 'BENCH_PROVIDER_KEY' },
        'fake-anthropic': { protocol: 'anthropic', baseUrl: `http://127.0.0.1:${provider.port}`, apiKeyEnv: 'BENCH_PROVIDER_KEY' },
      },
    };
    writeFileSync(join(dir, 'gateway.json'), JSON.stringify(config));
    const models = flags.call === 'models';
    const long = flags.call === 'messages-long' || flags.call === 'chat-long';
    if (!long) {
      const bare = models ? 'baseline' : 'proxy';
      const bareArgs = models ? [BASELINE, '--config', join(dir, 'gateway.json'), '--port', '0']
        : [PROXY, '--role', 'proxy', '--key', providerKey, '--upstream', String(provider.port)];
      const reference = await startChild(bare, underCallgrind(bare)[0]!, [...underCallgrind(bare).slice(1), '--import', 'tsx', ...bareArgs],
        dir, { cwd: ROOT, timeoutMs: 120_000 });
      children.push(reference);
      servers.push({ name: bare, child: reference });
    }
    for (const [name, dist] of gateways) {
      const child = await startChild(name, underCallgrind(name)[0]!, [...underCallgrind(name).slice(1), join(resolve(ROOT, dist), 'main.js'),
        '--config', join(dir, 'gateway.json'), '--port', '0'], dir, { cwd: ROOT, env: { ...process.env, BENCH_PROVIDER_KEY: providerKey }, timeoutMs: 120_000 });
      children.push(child);
      servers.push({ name, child });
    }

    const user = { role: 'user', content: 'Say hello to the benchmark.' };
    const body = long ? JSON.stringify({ model: 'claude-bench', max_tokens: LONG_MAX_TOKENS, stream: true, messages: [user] })
      : JSON.stringify({ model: 'gpt-bench', max_tokens: 32, messages: [{ role: 'system', content: 'You are a helpful assistant.' }, user] });
    const path = flags.call === 'messages-long' ? '/v1/messages' : '/v1/chat/completions';
    const what = models ? 'GET /v1/models' : long ? `${flags.call} call` : 'proxied call';
    process.stdout.write(`instructions per ${what} (callgrind, main thread), node ${process.version}\n`);
    for (const { name, child } of servers) {
      const request = models ? rawRequest('GET', child.port, '/v1/models', { authorization: `Bearer ${clientKey}` })
        : rawRequest('POST', child.port, path, { authorization: `Bearer ${clientKey}`, 'content-type': 'application/json' }, body);
      const first = await once(child.port, request, 60_000);
      if (first.status !== 200) throw new Error(`${name} answered ${first.status}`);
      await closedLoop({ port: child.port, requests: [request], durationS: flags.warmupS, connections: 32 });
      control('-i', 'on', child.pid);
      const perCall: number[] = [];
      // Window 1 is thrown away: right after instrumentation is turned on, the first seconds
      // count about 10 % more in every server (valgrind translates the code again, V8 settles).
      for (let w = 1; w <= flags.windows + 1; w++) {
        control('-z', null, child.pid);
        const run = await closedLoop({ port: child.port, requests: [request], durationS: flags.windowS, connections: 32 });
        if (run.errors > 0 || Object.keys(run.statuses).some((s) => s !== '200')) throw new Error(`${name}: not every answer was a 200: ${JSON.stringify(run.statuses)}, ${run.errors} errors`);
        control('-d', null, child.pid);
        // Dump w of thread 1 (the main thread): cg.NAME.W-01
        const file = readdirSync(dir).find((f) => f === `cg.${name}.${w}-01`);
        if (file === undefined) throw new Error(`no callgrind dump ${w} for ${name}`);
        const total = Number(/^totals: (\d+)$/m.exec(readFileSync(join(dir, file), 'utf8'))?.[1]);
        if (w > 1) perCall.push(Math.round(total / run.requests));
      }
      control('-i', 'off', child.pid);
      process.stdout.write(`  ${name.padEnd(10)} ${perCall.map(fmtInt).join('  ')}   median ${fmtInt(median(perCall))}\n`);
      await stopChild(child.child);
    }
  } finally {
    await Promise.all(children.map((c) => stopChild(c.child)));
    if (flags.keep) process.stdout.write(`callgrind dumps kept in ${dir} (cg.NAME.WINDOW-01: the main thread)\n`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

runMain('instructions bench', main);
