/**
 * The gateway's work per stream event, build against build: a long streamed answer (proxy.ts's
 * fake provider, 200 text deltas ten events per write) through one gateway process per build,
 * alternated, either translated (a chat call to a model on an Anthropic provider) or passed
 * through (`/v1/messages` on the same model: metering only, Claude Code's path). `--path plain`
 * drives proxy.ts's plain call instead: a whole chat answer from a billable model on an
 * `openai` provider (the proxied chat path), build against build; `--path translated` the same
 * whole chat answer from the model on the Anthropic provider (translated both ways).
 *
 *   npm run build && node --import tsx bench/streams.ts [--gateway NAME=DIST_DIR ...] [--path chat|messages|plain|translated]
 *     [--rounds 8] [--duration 3] [--connections 32]
 *
 * Copy a build's dist/ aside to compare it (`--gateway before=/tmp/old-dist --gateway after=dist`).
 * Reported per build: req/s and gateway CPU per call (/proc), the median over rounds, and each
 * build's paired ratio to the first. Every answer is checked whole (every delta and the end).
 */
import { hash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { choice, fmtInt, fmtRatio, fmtUs, int, num, parseFlags, runMain, runRounds, statusText, strs } from './cli.js';
import { LONG_DELTAS, LONG_MAX_TOKENS } from './proxy.js';
import { closedLoop, non200, perReq, rawRequest, startChild, stopChild, type Child, type RunResult } from './rawhttp.js';

const ROOT = resolve(__dirname, '..');
const PROXY = join(__dirname, 'proxy.ts');

const FLAGS = {
  gateways: strs({ name: 'gateway', arg: 'NAME=DIST_DIR', pattern: /^[\w-]+=.+$/, help: 'a build to measure (default: gateway=dist)' }),
  path: choice({
    choices: ['chat', 'messages', 'plain', 'translated'], default: 'chat',
    help: 'chat: translated to Messages; messages: passed through; plain: a whole chat answer passed through; translated: a whole chat answer translated',
  }),
  rounds: int({ default: 8, help: 'rounds per build' }),
  durationS: num({ name: 'duration', default: 3, help: 'seconds per timed run' }),
  connections: int({ default: 32, help: 'keep-alive connections' }),
  warmupS: num({ name: 'warmup', default: 2, help: 'seconds of warmup per build' }),
};

async function main(): Promise<number> {
  const flags = parseFlags('streams.ts', FLAGS);
  const builds = (flags.gateways.length === 0 ? ['gateway=dist'] : flags.gateways).map((g) => g.split('=', 2) as [string, string]);
  const names = builds.map(([name]) => name);
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-streams-'));
  const children: Child[] = [];
  try {
    const providerKey = `sk-upstream-${randomBytes(12).toString('hex')}`;
    const clientKey = `sk-bench-${randomBytes(16).toString('hex')}`;
    const provider = await startChild('provider', process.execPath, ['--import', 'tsx', PROXY, '--role', 'provider', '--key', providerKey], dir, { cwd: ROOT });
    children.push(provider);
    const config = join(dir, 'gateway.json');
    writeFileSync(config, JSON.stringify({
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      limiter: { store: 'memory' }, ledger: { store: 'memory' },
      plans: { bench: { rpm: 2_000_000, concurrency: 100_000, dailyCapUsd: 'unlimited' } },
      accounts: { acct_bench: { plan: 'bench' } },
      keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', clientKey) } },
      models: {
        'claude-bench': { provider: 'fake-anthropic', upstreamModel: 'gpt-upstream-bench', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
        'gpt-bench': { provider: 'fake-openai', upstreamModel: 'gpt-upstream-bench', price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
      },
      providers: {
        'fake-anthropic': { protocol: 'anthropic', baseUrl: `http://127.0.0.1:${provider.port}`, apiKeyEnv: 'BENCH_PROVIDER_KEY' },
        'fake-openai': { protocol: 'openai', baseUrl: `http://127.0.0.1:${provider.port}/v1`, apiKeyEnv: 'BENCH_PROVIDER_KEY' },
      },
    }));
    const gateways: Record<string, Child> = {};
    for (const [name, dist] of builds) {
      gateways[name] = await startChild(name, process.execPath, [join(dist, 'main.js'), '--config', config, '--port', '0'], dir, {
        cwd: ROOT, env: { ...process.env, BENCH_PROVIDER_KEY: providerKey },
      });
      children.push(gateways[name]!);
    }

    const messages = [{ role: 'user', content: 'Say hello to the benchmark.' }];
    const chat = flags.path === 'chat';
    const translated = flags.path === 'translated';
    const plain = flags.path === 'plain' || translated;
    const body = JSON.stringify(plain ? { model: translated ? 'claude-bench' : 'gpt-bench', messages } : chat
      ? { model: 'claude-bench', messages, max_tokens: LONG_MAX_TOKENS, stream: true, stream_options: { include_usage: true } }
      : { model: 'claude-bench', messages, max_tokens: LONG_MAX_TOKENS, stream: true });
    // Every delta arrived, and the stream ended as its protocol ends (a whole answer: its choices).
    const check = (b: Buffer) => {
      const text = b.toString('utf8');
      if (plain) return text.includes('"choices"');
      return chat
        ? text.split('"content":').length === LONG_DELTAS + 2 && text.endsWith('data: [DONE]\n\n')
        : text.split('"type":"text_delta"').length === LONG_DELTAS + 1 && text.endsWith('data: {"type":"message_stop"}\n\n');
    };
    const drive = (name: string, durationS: number) => closedLoop({
      port: gateways[name]!.port, durationS, connections: flags.connections, check, watch: { server: gateways[name]!.pid },
      requests: [rawRequest('POST', gateways[name]!.port, chat || plain ? '/v1/chat/completions' : '/v1/messages', {
        authorization: `Bearer ${clientKey}`, 'content-type': 'application/json',
      }, body)],
    });

    let bad = 0;
    process.stdout.write(`${plain ? `plain chat, ${translated ? 'translated' : 'passed through'}` : `${chat ? 'translated chat' : 'passthrough /v1/messages'}, ${LONG_DELTAS} deltas`}: ${names.join(', ')}; ` +
      `${flags.connections} connections, ${flags.rounds} rounds x ${flags.durationS} s\n`);
    const runs = await runRounds<string, RunResult>({
      targets: names, rounds: flags.rounds,
      warmup: (name) => drive(name, flags.warmupS),
      run: (name) => drive(name, flags.durationS),
      onRun: (name, round, r) => {
        bad += non200(r);
        process.stdout.write(`  ${String(round + 1).padEnd(4)}${name.padEnd(12)}${fmtInt(r.rps).padStart(8)} req/s${fmtUs(perReq(r, 'server')).padStart(10)} us/call  ${statusText(r)}\n`);
      },
    });
    const cpu = (r: RunResult) => perReq(r, 'server') ?? NaN;
    const result: Record<string, unknown> = {};
    for (const name of names) {
      const rps = runs.median(name, (r) => r.rps);
      const us = runs.median(name, cpu);
      const vsFirst = name === names[0] ? '' : `; paired vs ${names[0]}: ${fmtRatio(runs.paired(name, names[0]!, (r) => r.rps))} req/s, ${fmtRatio(runs.paired(name, names[0]!, cpu))} CPU per call`;
      process.stdout.write(`${name}: median ${fmtInt(rps)} req/s, ${fmtUs(us)} us CPU per call${vsFirst}\n`);
      result[name] = { rps: Math.round(rps), cpuUsPerCall: Math.round(us) };
    }
    process.stdout.write(`${JSON.stringify({ bench: 'streams', path: flags.path, deltas: LONG_DELTAS, node: process.version, date: new Date().toISOString(), flags, result, bad })}\n`);
    return bad === 0 ? 0 : 1;
  } finally {
    await Promise.all(children.map((c) => stopChild(c.child)));
    rmSync(dir, { recursive: true, force: true });
  }
}

runMain('streams bench', main);
