/**
 * The gateway as a proxy in front of an OpenAI-compatible provider, against the least work any
 * Node proxy can do (issue "Real providers", item 9).
 *
 *   npm run build && node --import tsx bench/proxy.ts [--rounds 5] [--duration 4] [--connections 32]
 *     [--rate 500] [--latency-rounds 2] [--latency-duration 5] [--stream-rate 100] [--stream-rounds 2] [--stream-duration 4]
 *     [--responses-rounds 3]
 *
 * Three child processes on 127.0.0.1, besides the load generator (this process):
 *   provider  a fake OpenAI-compatible provider (this file, --role provider): POST
 *             /v1/chat/completions, checks the key and the upstream model, answers a fixed
 *             completion with `usage`; streamed: the first chunk at once, then after 2 ms three
 *             more chunks, a usage chunk and `data: [DONE]`. POST /v1/responses likewise, with
 *             a Responses object, or its event sequence ending in `response.completed`;
 *             POST /v1/messages the same answer as Anthropic's. A streamed call with
 *             max_tokens 1024 gets a long answer instead (200 deltas, ten events per write)
 *   proxy     the bare baseline (this file, --role proxy): node:http, reads the body, swaps
 *             `model` and the key, forwards to the same path on a keep-alive http.Agent,
 *             relays the answer and reads `usage` out of it. No auth, no limits, no log, no
 *             metering.
 *   gateway   dist/main.js, a billable model on an `openai` provider at the fake, memory
 *             limiter and ledger, limits never reached, access log on (to a file).
 *
 * Phases:
 *   1. closed loop, non-streaming, proxy vs gateway alternating (order rotates each round):
 *      throughput and server CPU time per request (/proc/PID/stat)
 *   2. open loop at a fixed rate, non-streaming: latency direct to the provider, through the
 *      proxy, through the gateway -> added latency at p50 and p99
 *   3. open loop, streaming: time to first token (first SSE event) direct / proxy / gateway
 *   4. closed loop, the Responses API (POST /v1/responses), proxy vs gateway on the same body:
 *      a small plain call, and a streamed call with a body the size and shape of Codex's
 *      (instructions, tool schemas, the whole history: ~31 KiB, which the gateway walks for its
 *      input estimate)
 *   5. closed loop, translation: chat calls to a model on an Anthropic provider (the gateway
 *      sends Messages and translates the answer back), plain, streamed (3 deltas) and streamed
 *      long (200 deltas, ten events per write: where the work per event shows), against the
 *      bare proxy passing the same chat call through
 * Prints tables and a final JSON line. Exits 1 when any answer is not a correct 200.
 */
import { hash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, createServer, request as httpRequest, type IncomingMessage } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Histogram } from './histogram.js';
import {
  choice, fmtInt, fmtMs, fmtRatio, fmtUs, int, median, metText, num, parseFlags, pct, round3, runMain, runRounds, statusText, str,
} from './cli.js';
import {
  closedLoop, machineCpu, non200, once, openLoop, perReq, rawRequest, startChild, stealShare, stopChild, waitForQuiet, watchOthers,
  type Child, type RunResult,
} from './rawhttp.js';

const ROOT = resolve(__dirname, '..');
const UPSTREAM_MODEL = 'gpt-upstream-bench';
const CLIENT_MODEL = 'gpt-bench';
/** The gateway's model on an Anthropic provider: chat calls to it are translated. */
const TRANSLATED_MODEL = 'claude-bench';
const STREAM_GAP_MS = 2;
/** Proxied chat against the bare proxy (issue 18: at least as fast); Responses keep 0.85. */
const TARGET_THROUGHPUT = 1.0;
const TARGET_RESPONSES = 0.85;
const TARGET_TRANSLATED = 0.75;
const TARGET_ADDED_P50_MS = 0.3;
const TARGET_ADDED_P99_MS = 1;
const TARGET_ADDED_TTFT_MS = 0.5;

// ---------------------------------------------------------------------------------------------
// Roles run as child processes
// ---------------------------------------------------------------------------------------------

const COMPLETION = JSON.stringify({
  id: 'chatcmpl-bench', object: 'chat.completion', created: 1_763_769_600, model: UPSTREAM_MODEL,
  choices: [{ index: 0, message: { role: 'assistant', content: 'Hello! How can I help you today?' }, logprobs: null, finish_reason: 'stop' }],
  usage: { prompt_tokens: 12, completion_tokens: 9, total_tokens: 21 },
  system_fingerprint: 'fp_bench',
});

function chunkEvent(content: string | null, finish: string | null): string {
  return `data: ${JSON.stringify({
    id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1_763_769_600, model: UPSTREAM_MODEL,
    choices: [{ index: 0, delta: content === null ? {} : { content }, logprobs: null, finish_reason: finish }],
  })}\n\n`;
}
const FIRST_EVENT = chunkEvent('Hello', null);
const REST_EVENTS = [chunkEvent('! How can I', null), chunkEvent(' help you today?', null), chunkEvent(null, 'stop')].join('') +
  `data: ${JSON.stringify({ id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1_763_769_600, model: UPSTREAM_MODEL, choices: [], usage: { prompt_tokens: 12, completion_tokens: 9, total_tokens: 21 } })}\n\n`;
const DONE_EVENT = 'data: [DONE]\n\n';
/** What a client receives for one stream (when it asked for usage, as this bench's clients do). */
const STREAM_BODY = FIRST_EVENT + REST_EVENTS + DONE_EVENT;

const RESPONSE_TEXT = 'Hello! How can I help you today?';
const RESPONSE_USAGE = { input_tokens: 9800, input_tokens_details: { cached_tokens: 8192 }, output_tokens: 9, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 9809 };
function responseObject(status: string, text: string | null, usage: unknown) {
  return {
    id: 'resp_bench', object: 'response', created_at: 1_763_769_600, status, error: null, incomplete_details: null, instructions: null,
    max_output_tokens: null, model: UPSTREAM_MODEL, parallel_tool_calls: true, previous_response_id: null, store: false, temperature: 1,
    output: text === null ? [] : [{ id: 'msg_bench', type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] }],
    text: { format: { type: 'text' } }, tool_choice: 'auto', tools: [], top_p: 1, truncation: 'disabled', usage, metadata: {},
  };
}
const RESPONSE = JSON.stringify(responseObject('completed', RESPONSE_TEXT, RESPONSE_USAGE));
let sequence = 0;
const responsesEvent = (type: string, fields: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...fields })}\n\n`;
const at = { item_id: 'msg_bench', output_index: 0, content_index: 0 };
const RESPONSES_FIRST = responsesEvent('response.created', { response: responseObject('in_progress', null, null) }) +
  responsesEvent('response.in_progress', { response: responseObject('in_progress', null, null) });
const RESPONSES_REST = [
  responsesEvent('response.output_item.added', { output_index: 0, item: { id: 'msg_bench', type: 'message', status: 'in_progress', role: 'assistant', content: [] } }),
  responsesEvent('response.content_part.added', { ...at, part: { type: 'output_text', text: '', annotations: [] } }),
  ...['Hello', '! How can I', ' help you today?'].map((delta) => responsesEvent('response.output_text.delta', { ...at, delta })),
  responsesEvent('response.output_text.done', { ...at, text: RESPONSE_TEXT }),
  responsesEvent('response.content_part.done', { ...at, part: { type: 'output_text', text: RESPONSE_TEXT, annotations: [] } }),
  responsesEvent('response.output_item.done', { output_index: 0, item: JSON.parse(RESPONSE).output[0] }),
].join('');
const RESPONSES_DONE = responsesEvent('response.completed', { response: JSON.parse(RESPONSE) });
const RESPONSES_STREAM = RESPONSES_FIRST + RESPONSES_REST + RESPONSES_DONE;

/** The same answer from an Anthropic provider (POST /v1/messages), for the translated phase. */
const MESSAGE = JSON.stringify({
  id: 'msg_bench', type: 'message', role: 'assistant', model: UPSTREAM_MODEL, content: [{ type: 'text', text: RESPONSE_TEXT }],
  stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 21, cache_read_input_tokens: 0, cache_creation_input_tokens: 0, output_tokens: 9 },
});
const anthropicEvent = (type: string, fields: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const MESSAGES_FIRST = anthropicEvent('message_start', {
  message: { id: 'msg_bench', type: 'message', role: 'assistant', model: UPSTREAM_MODEL, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 21, output_tokens: 1 } },
}) + anthropicEvent('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
const MESSAGES_REST = [
  ...['Hello', '! How can I', ' help you today?'].map((text) => anthropicEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text } })),
  anthropicEvent('content_block_stop', { index: 0 }),
  anthropicEvent('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } }),
].join('');
const MESSAGES_DONE = anthropicEvent('message_stop', {});

/**
 * A long streamed answer (phase 5): LONG_DELTAS text deltas, sent ten events per write, as chat
 * chunks or as Anthropic events. A request asks for it with max_tokens LONG_MAX_TOKENS.
 */
export const LONG_DELTAS = 200;
export const LONG_MAX_TOKENS = 1024;
const LONG_WORDS = Array.from({ length: LONG_DELTAS }, (_, i) => ` ${['Sure,', 'here', 'is', 'a', '"longer"', 'answer', 'with', 'ünïcödé', 'and\n', 'lines.'][i % 10]}`);
function inWrites(events: string[]): string[] {
  const writes: string[] = [];
  for (let i = 0; i < events.length; i += 10) writes.push(events.slice(i, i + 10).join(''));
  return writes;
}
const LONG_CHAT = {
  first: chunkEvent('', null),
  writes: inWrites(LONG_WORDS.map((w) => chunkEvent(w, null))),
  last: chunkEvent(null, 'stop') + `data: ${JSON.stringify({ id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1_763_769_600, model: UPSTREAM_MODEL, choices: [], usage: { prompt_tokens: 12, completion_tokens: LONG_DELTAS, total_tokens: 12 + LONG_DELTAS } })}\n\n${DONE_EVENT}`,
};
const LONG_MESSAGES = {
  first: MESSAGES_FIRST,
  writes: inWrites(LONG_WORDS.map((text) => anthropicEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }))),
  last: anthropicEvent('content_block_stop', { index: 0 }) +
    anthropicEvent('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: LONG_DELTAS } }) + MESSAGES_DONE,
};
/** The end of a long answer as the client sees it, in either case. */
const LONG_LAST_WORD = JSON.stringify(LONG_WORDS.at(-1)).slice(1, -1);

/** A request shaped like Codex's: long instructions, tool schemas, the whole history (store: false). */
function codexSizedBody(model: string, stream: boolean): string {
  const prose = (n: number) => Array.from({ length: n }, (_, i) => `Rule ${i}: keep changes small, explain why, and run the tests before you finish.`).join('\n');
  const tools = Array.from({ length: 8 }, (_, t) => ({
    type: 'function', name: `tool_${t}`, description: prose(3), strict: false,
    parameters: { type: 'object', additionalProperties: false, required: ['arg_0'], properties: Object.fromEntries(Array.from({ length: 10 }, (_, a) =>
      [`arg_${a}`, { type: a % 2 === 0 ? 'string' : 'number', description: `Argument ${a} of tool ${t}: what it means and its default.` }])) },
  }));
  const input: unknown[] = [{ type: 'message', role: 'developer', content: [{ type: 'input_text', text: prose(120) }] }];
  for (let turn = 0; turn < 6; turn++) {
    input.push({ type: 'message', role: 'user', content: [{ type: 'input_text', text: `Step ${turn}: ${prose(4)}` }] });
    input.push({ type: 'function_call', call_id: `call_${turn}`, name: 'tool_0', arguments: JSON.stringify({ arg_0: `ls -la src/${turn}` }) });
    input.push({ type: 'function_call_output', call_id: `call_${turn}`, output: prose(6) });
    input.push({ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: prose(2) }] });
  }
  return JSON.stringify({ model, instructions: prose(40), input, tools, tool_choice: 'auto', parallel_tool_calls: true, reasoning: { summary: 'auto' },
    store: false, stream, include: ['reasoning.encrypted_content'], prompt_cache_key: 'bench-session' });
}

function listening(server: ReturnType<typeof createServer>): void {
  server.listen(0, '127.0.0.1', () => {
    const { port } = server.address() as AddressInfo;
    process.stdout.write(`${JSON.stringify({ msg: 'listening', url: `http://127.0.0.1:${port}` })}\n`);
  });
  const stop = () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

function runProvider(key: string): void {
  const body = Buffer.from(COMPLETION);
  const length = String(body.length);
  const response = Buffer.from(RESPONSE);
  const message = Buffer.from(MESSAGE);
  let n = 0;
  let connections = 0;
  let open = 0;
  const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
    if (req.method === 'GET' && req.url === '/stats') {
      // For the bench: how many TCP connections callers opened (keep-alive reuse, or not).
      const stats = JSON.stringify({ connections, open });
      res.writeHead(200, ['content-type', 'application/json', 'content-length', String(stats.length)]);
      return void res.end(stats);
    }
    const responses = req.url === '/v1/responses';
    const messages = req.url === '/v1/messages';
    if (req.method !== 'POST' || (req.url !== '/v1/chat/completions' && !responses && !messages)) return void res.writeHead(404, ['content-length', '0']).end();
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const id = `req_up_${(++n).toString(36)}`;
      let parsed: { model?: unknown; stream?: unknown; max_tokens?: unknown } = {};
      try {
        parsed = JSON.parse(Buffer.concat(chunks).toString('utf8')) as typeof parsed;
      } catch {
        res.writeHead(400).end('{"error":{"message":"bad json"}}');
        return;
      }
      if ((messages ? req.headers['x-api-key'] : req.headers.authorization) !== (messages ? key : `Bearer ${key}`)) return void res.writeHead(401).end('{"error":{"message":"bad key"}}');
      if (parsed.model !== UPSTREAM_MODEL) return void res.writeHead(400).end('{"error":{"message":"bad model"}}');
      if (parsed.stream === true && parsed.max_tokens === LONG_MAX_TOKENS && !responses) {
        const long = messages ? LONG_MESSAGES : LONG_CHAT;
        res.writeHead(200, ['content-type', 'text/event-stream; charset=utf-8', 'cache-control', 'no-cache', 'x-request-id', id]);
        res.write(long.first);
        let next = 0;
        const more = () => {
          if (next < long.writes.length) {
            res.write(long.writes[next++]);
            setImmediate(more);
          } else res.end(long.last);
        };
        setImmediate(more);
        return;
      }
      if (parsed.stream === true) {
        res.writeHead(200, ['content-type', 'text/event-stream; charset=utf-8', 'cache-control', 'no-cache', 'x-request-id', id]);
        res.write(responses ? RESPONSES_FIRST : messages ? MESSAGES_FIRST : FIRST_EVENT);
        setTimeout(() => {
          res.write(responses ? RESPONSES_REST : messages ? MESSAGES_REST : REST_EVENTS);
          res.end(responses ? RESPONSES_DONE : messages ? MESSAGES_DONE : DONE_EVENT);
        }, STREAM_GAP_MS);
        return;
      }
      const answer = responses ? response : messages ? message : body;
      res.writeHead(200, ['content-type', 'application/json', 'content-length', answer === body ? length : String(answer.length), 'x-request-id', id, 'openai-processing-ms', '1']);
      res.end(answer);
    });
  });
  server.on('connection', (socket: Socket) => {
    connections++;
    open++;
    socket.on('close', () => open--);
  });
  listening(server);
}

/** The least work a Node proxy can do for this call; it still reads `usage` (what metering needs). */
function runProxy(upstreamPort: number, key: string): void {
  const agent = new Agent({ keepAlive: true, maxSockets: 1024, scheduling: 'lifo' });
  let usageSeen = 0;
  const usageOf = (text: string): void => {
    const at = text.lastIndexOf('"usage":{');
    if (at === -1) return;
    let depth = 0;
    for (let i = at + 8; i < text.length; i++) {
      if (text[i] === '{') depth++;
      else if (text[i] === '}' && --depth === 0) {
        const usage = JSON.parse(text.slice(at + 8, i + 1)) as { completion_tokens?: number; output_tokens?: number };
        usageSeen += usage.completion_tokens ?? usage.output_tokens ?? 0;
        return;
      }
    }
  };
  const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let body: Record<string, unknown>;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      } catch {
        res.writeHead(400).end();
        return;
      }
      body.model = UPSTREAM_MODEL;
      const out = Buffer.from(JSON.stringify(body));
      const up = httpRequest({
        host: '127.0.0.1', port: upstreamPort, path: req.url, method: 'POST', agent,
        headers: { 'content-type': 'application/json', 'content-length': String(out.length), authorization: `Bearer ${key}` },
      }, (ur: IncomingMessage) => {
        const type = ur.headers['content-type'] ?? 'application/json';
        if (type.startsWith('text/event-stream')) {
          res.writeHead(ur.statusCode ?? 502, ['content-type', type, 'cache-control', 'no-cache']);
          ur.on('data', (c: Buffer) => {
            usageOf(c.toString('utf8'));
            res.write(c);
          });
          ur.on('end', () => res.end());
          return;
        }
        const parts: Buffer[] = [];
        ur.on('data', (c: Buffer) => parts.push(c));
        ur.on('end', () => {
          const answer = Buffer.concat(parts);
          usageOf(answer.toString('utf8'));
          res.writeHead(ur.statusCode ?? 502, ['content-type', type, 'content-length', String(answer.length)]);
          res.end(answer);
        });
      });
      up.on('error', () => {
        if (!res.headersSent) res.writeHead(502);
        res.end();
      });
      up.end(out);
    });
  });
  listening(server);
  process.on('exit', () => process.stderr.write(`proxy: ${usageSeen} completion tokens seen\n`));
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

const FLAGS = {
  rounds: int({ default: 5, help: 'phase 1: rounds per target' }),
  durationS: num({ name: 'duration', default: 4, help: 'phases 1, 4, 5: seconds per timed run' }),
  connections: int({ default: 32, help: 'phases 1, 4, 5: keep-alive connections' }),
  warmupS: num({ name: 'warmup', default: 2, help: 'phases 1, 4, 5: seconds of warmup per target' }),
  rate: num({ default: 500, arg: 'R', help: 'phase 2: requests per second' }),
  latencyRounds: int({ default: 2, help: 'phase 2: rounds per target' }),
  latencyDurationS: num({ name: 'latency-duration', default: 5, help: 'phase 2: seconds per run' }),
  streamRate: num({ default: 100, arg: 'R', help: 'phase 3: streams per second' }),
  streamRounds: int({ default: 2, help: 'phase 3: rounds per target' }),
  streamDurationS: num({ name: 'stream-duration', default: 4, help: 'phase 3: seconds per run' }),
  responsesRounds: int({ default: 3, help: 'phases 4 and 5: rounds per target and case' }),
};
/** The arguments of this file run as a child process (`--role provider|proxy`). */
const ROLE_FLAGS = {
  role: choice({ choices: ['provider', 'proxy'], default: 'provider', help: 'the server to run' }),
  key: str({ default: '', arg: 'KEY', help: "the provider's key" }),
  upstream: int({ default: 0, arg: 'PORT', help: "proxy: the provider's port" }),
};

type Target = 'direct' | 'proxy' | 'gateway';
/** The closed-loop comparisons: the bare proxy against the gateway. */
const CLOSED = ['proxy', 'gateway'] as const;
type Closed = (typeof CLOSED)[number];

/** A call compared in phase 4 or 5: its request to each target and how its answers are checked. */
interface Case {
  name: string;
  request: (t: Closed) => Buffer;
  /** Under load: the body length every answer must have, or a check of each body. */
  expectBytes: number | null;
  check: ((body: Buffer) => boolean) | null;
  /** The one call checked before the load. */
  first: (body: Buffer) => boolean;
}

interface Compared { name: string; proxyRps: number; gatewayRps: number; ratio: number; paired: number; cpuRatio: number }

/** Server CPU microseconds per request of a run that watched the server. */
const serverUs = (r: RunResult) => perReq(r, 'server')!;

function merge(hs: Histogram[]): Histogram {
  const m = new Histogram();
  for (const h of hs) {
    for (let i = 0; i < h.counts.length; i++) m.counts[i]! += h.counts[i]!;
    m.total += h.total;
    m.maxUs = Math.max(m.maxUs, h.maxUs);
  }
  return m;
}

async function main(): Promise<number> {
  const flags = parseFlags('proxy.ts', FLAGS);
  const dir = mkdtempSync(join(tmpdir(), 'mg-bench-proxy-'));
  const children: Child[] = [];
  const cleanup = async () => {
    await Promise.all(children.map((c) => stopChild(c.child)));
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('SIGINT', () => void cleanup().finally(() => process.exit(130)));
  let bad = 0;
  try {
    await waitForQuiet('proxy.ts');
    const others = watchOthers();
    const providerKey = `sk-upstream-${randomBytes(12).toString('hex')}`;
    const clientKey = `sk-bench-${randomBytes(16).toString('hex')}`;
    const self = ['--import', 'tsx', __filename];
    const provider = await startChild('provider', process.execPath, [...self, '--role', 'provider', '--key', providerKey], dir, { cwd: ROOT });
    children.push(provider);
    const proxy = await startChild('proxy', process.execPath, [...self, '--role', 'proxy', '--key', providerKey, '--upstream', String(provider.port)], dir, { cwd: ROOT });
    children.push(proxy);
    const config = {
      server: { host: '127.0.0.1', port: 0, drainDelayMs: 0, drainTimeoutMs: 2000 },
      limiter: { store: 'memory' },
      ledger: { store: 'memory' },
      plans: { bench: { rpm: 2_000_000, concurrency: 100_000, dailyCapUsd: 'unlimited' } },
      accounts: { acct_bench: { plan: 'bench' } },
      keys: { key_bench: { account: 'acct_bench', sha256: hash('sha256', clientKey) } },
      models: {
        [CLIENT_MODEL]: { provider: 'fake', upstreamModel: UPSTREAM_MODEL, price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
        [TRANSLATED_MODEL]: { provider: 'fake-anthropic', upstreamModel: UPSTREAM_MODEL, price: { inputPerMillion: 0.15, outputPerMillion: 0.6 } },
      },
      providers: {
        fake: { protocol: 'openai', baseUrl: `http://127.0.0.1:${provider.port}/v1`, apiKeyEnv: 'BENCH_PROVIDER_KEY' },
        'fake-anthropic': { protocol: 'anthropic', baseUrl: `http://127.0.0.1:${provider.port}`, apiKeyEnv: 'BENCH_PROVIDER_KEY' },
      },
    };
    const configFile = join(dir, 'gateway.json');
    writeFileSync(configFile, JSON.stringify(config));
    const gateway = await startChild('gateway', process.execPath, ['dist/main.js', '--config', configFile, '--port', '0'], dir, {
      cwd: ROOT, env: { ...process.env, BENCH_PROVIDER_KEY: providerKey },
    });
    children.push(gateway);

    // The same call three ways: the client's model and key, except direct, which speaks to the provider itself.
    const messages = [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Say hello to the benchmark.' }];
    const bodyFor = (model: string, stream: boolean, maxTokens = 32) =>
      JSON.stringify(stream ? { model, messages, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } } : { model, messages, max_tokens: maxTokens });
    const portOf: Record<Target, number> = { direct: provider.port, proxy: proxy.port, gateway: gateway.port };
    const req = (t: Target, stream: boolean) => rawRequest('POST', portOf[t], '/v1/chat/completions', {
      authorization: `Bearer ${t === 'direct' ? providerKey : clientKey}`, 'content-type': 'application/json',
    }, bodyFor(t === 'direct' ? UPSTREAM_MODEL : CLIENT_MODEL, stream));
    const pidOf: Record<Target, number> = { direct: provider.pid, proxy: proxy.pid, gateway: gateway.pid };

    // Correctness: each way answers 200 with the provider's completion, plain and streamed.
    for (const t of ['direct', 'proxy', 'gateway'] as Target[]) {
      const plain = await once(portOf[t], req(t, false));
      if (plain.status !== 200 || plain.body!.toString('utf8') !== COMPLETION) {
        throw new Error(`${t}: plain call answered ${plain.status}: ${plain.body?.toString('utf8').slice(0, 300)}`);
      }
      const streamed = await once(portOf[t], req(t, true));
      if (streamed.status !== 200 || !streamed.chunked || streamed.body!.toString('utf8') !== STREAM_BODY) {
        throw new Error(`${t}: streamed call answered ${streamed.status}: ${streamed.body?.toString('utf8').slice(0, 500)}`);
      }
    }
    const streamOk = (b: Buffer) => b.length === Buffer.byteLength(STREAM_BODY) && b.toString('utf8').endsWith(DONE_EVENT);
    const plainBytes = Buffer.byteLength(COMPLETION);

    const cpu = cpus();
    const steal0 = machineCpu();
    process.stdout.write(`proxy bench: node ${process.version}, ${cpu.length} CPU (${cpu[0]?.model ?? '?'}), ${new Date().toISOString()}\n`);

    // 1. Closed loop: proxy vs gateway.
    process.stdout.write(`\n1. closed loop, non-streaming: ${flags.connections} connections, ${flags.rounds} rounds x ${flags.durationS} s per target\n`);
    const plainLoop = (t: Closed, durationS: number, watch?: Record<string, number>) => closedLoop({
      port: portOf[t], requests: [req(t, false)], durationS, connections: flags.connections, expectBytes: plainBytes, ...(watch === undefined ? {} : { watch }),
    });
    process.stdout.write(`  ${'round'.padEnd(6)}${'target'.padEnd(9)}${'req/s'.padStart(9)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'srv us/req'.padStart(12)}${'prov us/req'.padStart(13)}${'gen us/req'.padStart(12)}  statuses\n`);
    const closed = await runRounds({
      targets: CLOSED, rounds: flags.rounds,
      warmup: (t) => plainLoop(t, flags.warmupS),
      run: (t) => plainLoop(t, flags.durationS, { server: pidOf[t], provider: provider.pid }),
      onRun: (t, r, res) => {
        bad += non200(res);
        process.stdout.write(`  ${String(r + 1).padEnd(6)}${t.padEnd(9)}${fmtInt(res.rps).padStart(9)}${fmtMs(res.total.quantileUs(0.5)).padStart(9)}${fmtMs(res.total.quantileUs(0.99)).padStart(9)}` +
          `${fmtUs(perReq(res, 'server')).padStart(12)}${fmtUs(perReq(res, 'provider')).padStart(13)}${fmtUs((res.loaderCpuS * 1e6) / res.requests).padStart(12)}  ${statusText(res)}\n`);
      },
    });
    const rps = { proxy: closed.median('proxy', (r) => r.rps), gateway: closed.median('gateway', (r) => r.rps) };
    const cpuReq = { proxy: closed.median('proxy', serverUs), gateway: closed.median('gateway', serverUs) };
    const provReq = median([...closed.results.proxy, ...closed.results.gateway].map((r) => perReq(r, 'provider')!));
    const pairedRps = closed.paired('gateway', 'proxy', (r) => r.rps);
    const pairedCpu = closed.paired('gateway', 'proxy', serverUs);
    const throughputRatio = rps.gateway / rps.proxy;
    process.stdout.write(`  medians: proxy ${fmtInt(rps.proxy)} req/s, ${fmtUs(cpuReq.proxy)} us CPU/req; gateway ${fmtInt(rps.gateway)} req/s, ${fmtUs(cpuReq.gateway)} us CPU/req; provider ${fmtUs(provReq)} us CPU/req\n`);
    others.endPhase('1 closed loop');
    process.stdout.write(`  gateway / proxy: throughput ${fmtRatio(throughputRatio)} (target >= ${TARGET_THROUGHPUT}: ${metText(throughputRatio >= TARGET_THROUGHPUT)}), paired per round ${fmtRatio(pairedRps)}; ` +
      `server CPU per request ${fmtRatio(cpuReq.gateway / cpuReq.proxy, 2)} (paired ${fmtRatio(pairedCpu, 2)}, +${fmtUs(cpuReq.gateway - cpuReq.proxy)} us)\n`);

    // 2. Open loop latency, non-streaming.
    const all: Target[] = ['direct', 'proxy', 'gateway'];
    process.stdout.write(`\n2. open loop, non-streaming: ${flags.rate} req/s, ${flags.latencyRounds} rounds x ${flags.latencyDurationS} s per target\n`);
    const plainOpen = (t: Target, durationS: number) => openLoop({ port: portOf[t], requests: [req(t, false)], durationS, ratePerS: flags.rate, pool: 64, expectBytes: plainBytes });
    process.stdout.write(`  ${'round'.padEnd(6)}${'target'.padEnd(9)}${'sent'.padStart(7)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'p99.9 ms'.padStart(10)}${'max ms'.padStart(9)}  statuses\n`);
    const lat = await runRounds({
      targets: all, rounds: flags.latencyRounds,
      warmup: (t) => plainOpen(t, 1),
      run: (t) => plainOpen(t, flags.latencyDurationS),
      onRun: (t, r, res) => {
        bad += non200(res);
        process.stdout.write(`  ${String(r + 1).padEnd(6)}${t.padEnd(9)}${String(res.sent).padStart(7)}${fmtMs(res.total.quantileUs(0.5)).padStart(9)}${fmtMs(res.total.quantileUs(0.99)).padStart(9)}` +
          `${fmtMs(res.total.quantileUs(0.999)).padStart(10)}${fmtMs(res.total.maxUs).padStart(9)}  ${statusText(res)}\n`);
      },
    });
    const latency = Object.fromEntries(all.map((t) => {
      const h = merge(lat.results[t].map((r) => r.total));
      return [t, { p50Us: h.quantileUs(0.5), p99Us: h.quantileUs(0.99), p999Us: h.quantileUs(0.999), n: h.total,
        roundP50Us: lat.median(t, (r) => r.total.quantileUs(0.5)), roundP99Us: lat.median(t, (r) => r.total.quantileUs(0.99)) }];
    })) as Record<Target, { p50Us: number; p99Us: number; p999Us: number; n: number; roundP50Us: number; roundP99Us: number }>;
    const added = (t: Target, q: 'p50Us' | 'p99Us') => (latency[t][q] - latency.direct[q]) / 1000;
    for (const t of ['proxy', 'gateway'] as Target[]) {
      process.stdout.write(`  ${t}: p50 ${fmtMs(latency[t].p50Us)} ms (+${added(t, 'p50Us').toFixed(3)} ms over direct ${fmtMs(latency.direct.p50Us)}), ` +
        `p99 ${fmtMs(latency[t].p99Us)} ms (+${added(t, 'p99Us').toFixed(3)} ms over direct ${fmtMs(latency.direct.p99Us)}), all ${latency[t].n} requests of its rounds\n`);
    }
    others.endPhase('2 open-loop latency');
    const addP50 = added('gateway', 'p50Us');
    const addP99 = added('gateway', 'p99Us');
    process.stdout.write(`  gateway added latency: p50 +${addP50.toFixed(3)} ms (target <= ${TARGET_ADDED_P50_MS}: ${metText(addP50 <= TARGET_ADDED_P50_MS)}), ` +
      `p99 +${addP99.toFixed(3)} ms (target <= ${TARGET_ADDED_P99_MS}: ${metText(addP99 <= TARGET_ADDED_P99_MS)}); over the bare proxy: p50 +${fmtMs(latency.gateway.p50Us - latency.proxy.p50Us)} ms, p99 +${fmtMs(latency.gateway.p99Us - latency.proxy.p99Us)} ms\n`);

    // 3. Streams: time to first token.
    process.stdout.write(`\n3. open loop, streaming: ${flags.streamRate} streams/s, ${flags.streamRounds} rounds x ${flags.streamDurationS} s per target; TTFT = write to first SSE event\n`);
    // Count the connections the provider accepts: a relayed stream must hand its connection back
    // for reuse (a bug once made every gateway stream open a new one; bench/MORE.md, and the
    // regression test test/regressions/stream-leaks-upstream-connection.test.ts).
    const providerConnections = async () => {
      const a = await once(provider.port, rawRequest('GET', provider.port, '/stats', {}));
      return (JSON.parse(a.body!.toString('utf8')) as { connections: number }).connections - 1; // less this request's own
    };
    const opened: Record<Target, number> = { direct: 0, proxy: 0, gateway: 0 };
    const streamOpen = (t: Target, durationS: number) => openLoop({ port: portOf[t], requests: [req(t, true)], durationS, ratePerS: flags.streamRate, pool: 64, check: streamOk });
    process.stdout.write(`  ${'round'.padEnd(6)}${'target'.padEnd(9)}${'sent'.padStart(7)}${'ttft p50'.padStart(10)}${'ttft p99'.padStart(10)}${'end p50'.padStart(10)}${'end p99'.padStart(10)}  statuses\n`);
    const str = await runRounds({
      targets: all, rounds: flags.streamRounds,
      warmup: (t) => streamOpen(t, 1),
      run: async (t) => {
        const c0 = await providerConnections();
        const res = await streamOpen(t, flags.streamDurationS);
        opened[t] += (await providerConnections()) - c0 - 1; // less the first reading's own connection
        return res;
      },
      onRun: (t, r, res) => {
        bad += non200(res);
        process.stdout.write(`  ${String(r + 1).padEnd(6)}${t.padEnd(9)}${String(res.sent).padStart(7)}${fmtMs(res.first.quantileUs(0.5)).padStart(10)}${fmtMs(res.first.quantileUs(0.99)).padStart(10)}` +
          `${fmtMs(res.total.quantileUs(0.5)).padStart(10)}${fmtMs(res.total.quantileUs(0.99)).padStart(10)}  ${statusText(res)}\n`);
      },
    });
    others.endPhase('3 streams');
    const ttft = Object.fromEntries(all.map((t) => {
      const h = merge(str.results[t].map((r) => r.first));
      const e = merge(str.results[t].map((r) => r.total));
      return [t, { p50Us: h.quantileUs(0.5), p99Us: h.quantileUs(0.99), endP50Us: e.quantileUs(0.5), n: h.total }];
    })) as Record<Target, { p50Us: number; p99Us: number; endP50Us: number; n: number }>;
    const addTtft = (ttft.gateway.p50Us - ttft.direct.p50Us) / 1000;
    for (const t of ['proxy', 'gateway'] as Target[]) {
      process.stdout.write(`  ${t}: TTFT p50 ${fmtMs(ttft[t].p50Us)} ms (+${fmtMs(ttft[t].p50Us - ttft.direct.p50Us)} ms over direct ${fmtMs(ttft.direct.p50Us)}), ` +
        `p99 ${fmtMs(ttft[t].p99Us)} ms (+${fmtMs(ttft[t].p99Us - ttft.direct.p99Us)} ms over direct ${fmtMs(ttft.direct.p99Us)})\n`);
    }
    const streamsOf = (t: Target) => str.results[t].reduce((n, r) => n + r.sent, 0);
    process.stdout.write(`  new upstream connections the provider accepted per stream: proxy ${(opened.proxy / streamsOf('proxy')).toFixed(3)}, gateway ${(opened.gateway / streamsOf('gateway')).toFixed(3)}\n`);
    process.stdout.write(`  gateway added TTFT at p50: +${addTtft.toFixed(3)} ms (target <= ${TARGET_ADDED_TTFT_MS}: ${metText(addTtft <= TARGET_ADDED_TTFT_MS)})\n`);

    /**
     * Phases 4 and 5: each case checked once on both, then proxy vs gateway in paired rounds
     * (closed loop); the gateway / proxy throughput and server CPU per request.
     */
    const compare = async (title: string, label: string, target: number, cases: Case[]): Promise<Compared[]> => {
      for (const c of cases) {
        for (const t of CLOSED) {
          const a = await once(portOf[t], c.request(t));
          if (a.status !== 200 || !c.first(a.body!)) throw new Error(`${t}: ${label} ${c.name} answered ${a.status}: ${a.body?.toString('utf8').slice(0, 400)}`);
        }
      }
      const width = Math.max(...cases.map((c) => c.name.length)) + 2;
      process.stdout.write(`${title}: ${flags.connections} connections, ${flags.responsesRounds} rounds x ${flags.durationS} s per target and case\n`);
      process.stdout.write(`  ${'case'.padEnd(width)}${'round'.padEnd(6)}${'target'.padEnd(9)}${'req/s'.padStart(9)}${'p50 ms'.padStart(9)}${'srv us/req'.padStart(12)}  statuses\n`);
      const out: Compared[] = [];
      for (const c of cases) {
        const drive = (t: Closed, durationS: number, watch?: Record<string, number>) => closedLoop({
          port: portOf[t], requests: [c.request(t)], durationS, connections: flags.connections, expectBytes: c.expectBytes, check: c.check,
          ...(watch === undefined ? {} : { watch }),
        });
        const runs = await runRounds({
          targets: CLOSED, rounds: flags.responsesRounds,
          warmup: (t) => drive(t, flags.warmupS),
          run: (t) => drive(t, flags.durationS, { server: pidOf[t] }),
          onRun: (t, r, res) => {
            bad += non200(res);
            process.stdout.write(`  ${c.name.padEnd(width)}${String(r + 1).padEnd(6)}${t.padEnd(9)}${fmtInt(res.rps).padStart(9)}${fmtMs(res.total.quantileUs(0.5)).padStart(9)}` +
              `${fmtUs(perReq(res, 'server')).padStart(12)}  ${statusText(res)}\n`);
          },
        });
        const proxyRps = runs.median('proxy', (r) => r.rps);
        const gatewayRps = runs.median('gateway', (r) => r.rps);
        const paired = runs.paired('gateway', 'proxy', (r) => r.rps);
        const cpuRatio = runs.median('gateway', serverUs) / runs.median('proxy', serverUs);
        const ratio = gatewayRps / proxyRps;
        out.push({ name: c.name, proxyRps: Math.round(proxyRps), gatewayRps: Math.round(gatewayRps), ratio: round3(ratio), paired: round3(paired), cpuRatio: round3(cpuRatio) });
        process.stdout.write(`  ${c.name}: ${label} / proxy throughput ${fmtRatio(ratio)} (target >= ${target}: ${metText(ratio >= target)}), ` +
          `paired per round ${fmtRatio(paired)}; server CPU per request ${fmtRatio(cpuRatio, 2)}\n`);
      }
      return out;
    };

    // 4. The Responses API: proxy vs gateway on the same body, closed loop.
    const responsesReq = (t: Closed, body: string) => rawRequest('POST', portOf[t], '/v1/responses', {
      authorization: `Bearer ${clientKey}`, 'content-type': 'application/json',
    }, body);
    const small = JSON.stringify({ model: CLIENT_MODEL, input: 'Say hello to the benchmark.', max_output_tokens: 32, store: false });
    const codex = codexSizedBody(CLIENT_MODEL, true);
    const responsesResults = await compare('\n4. closed loop, POST /v1/responses', 'gateway', TARGET_RESPONSES, [
      { name: 'plain, small body', request: (t) => responsesReq(t, small), expectBytes: Buffer.byteLength(RESPONSE), check: null,
        first: (b) => b.toString('utf8') === RESPONSE },
      { name: `streamed, Codex-sized body (${(Buffer.byteLength(codex) / 1024).toFixed(1)} KiB)`, request: (t) => responsesReq(t, codex), expectBytes: null,
        check: (b) => b.length === Buffer.byteLength(RESPONSES_STREAM) && b.toString('utf8').endsWith(RESPONSES_DONE),
        first: (b) => b.toString('utf8') === RESPONSES_STREAM },
    ]);
    others.endPhase('4 responses');

    // 5. Translation: a chat call to a model on an Anthropic provider (Messages upstream, the
    // answer translated back) against the bare proxy passing the same chat call through.
    const translatedResults = await compare('\n5. closed loop, chat on an Anthropic model (translated) vs the bare proxy passing chat through', 'gateway (translated)',
      TARGET_TRANSLATED, (['plain', 'streamed', 'streamed long'] as const).map((name) => {
        const stream = name !== 'plain';
        const maxTokens = name === 'streamed long' ? LONG_MAX_TOKENS : 32;
        const check = name === 'plain'
          ? (b: Buffer) => b.toString('utf8').includes(`"content":"${RESPONSE_TEXT}"`)
          : (b: Buffer) => {
            const text = b.toString('utf8');
            // The long answer whole: its first chunk's "" and every delta, the last one included.
            const whole = name === 'streamed' ? text.includes('"content":"Hello"')
              : text.split('"content":').length === LONG_DELTAS + 2 && text.includes(`"content":"${LONG_LAST_WORD}"`);
            return whole && text.endsWith('data: [DONE]\n\n');
          };
        return {
          name: name === 'streamed long' ? `streamed, ${LONG_DELTAS} deltas` : name, expectBytes: null, check, first: check,
          request: (t: Closed) => rawRequest('POST', portOf[t], '/v1/chat/completions', { authorization: `Bearer ${clientKey}`, 'content-type': 'application/json' },
            bodyFor(t === 'gateway' ? TRANSLATED_MODEL : CLIENT_MODEL, stream, maxTokens)),
        };
      }));
    others.endPhase('5 translated');

    const steal = stealShare(steal0, machineCpu());
    process.stdout.write(`\nCPU steal by other guests over the run: ${pct(steal)}; phases during which another bench (bench/ledger*) ran: ${others.disturbed().join(', ') || 'none'}; non-200 / bad answers: ${bad}\n`);
    process.stdout.write(`${JSON.stringify({
      bench: 'proxy', node: process.version, date: new Date().toISOString(), cpus: cpu.length, flags,
      closed: { proxyRps: Math.round(rps.proxy), gatewayRps: Math.round(rps.gateway), throughputRatio: round3(throughputRatio), pairedThroughputRatio: round3(pairedRps),
        proxyCpuUsPerReq: round3(cpuReq.proxy), gatewayCpuUsPerReq: round3(cpuReq.gateway), cpuRatio: round3(cpuReq.gateway / cpuReq.proxy), providerCpuUsPerReq: round3(provReq) },
      latency: Object.fromEntries(all.map((t) => [t, { p50Ms: latency[t].p50Us / 1000, p99Ms: latency[t].p99Us / 1000, p999Ms: latency[t].p999Us / 1000 }])),
      addedMs: { p50: round3(addP50), p99: round3(addP99) },
      ttft: Object.fromEntries(all.map((t) => [t, { p50Ms: ttft[t].p50Us / 1000, p99Ms: ttft[t].p99Us / 1000 }])),
      addedTtftMs: { p50: round3(addTtft), p99: round3((ttft.gateway.p99Us - ttft.direct.p99Us) / 1000) },
      upstreamConnectionsPerStream: { proxy: round3(opened.proxy / streamsOf('proxy')), gateway: round3(opened.gateway / streamsOf('gateway')) },
      responses: responsesResults, translated: translatedResults,
      steal: steal === null ? null : round3(steal), disturbedPhases: others.disturbed(), bad,
    })}\n`);
  } finally {
    await cleanup();
  }
  return bad === 0 ? 0 : 1;
}

if (require.main === module) {
  // As a child process (`--role`): a server of the bench; else the bench itself.
  if (process.argv.includes('--role')) {
    const role = parseFlags('proxy.ts', ROLE_FLAGS, {
      check: (v) => (v.key === '' ? '--key is required' : v.role === 'proxy' && v.upstream === 0 ? '--upstream is required' : null),
    });
    if (role.role === 'provider') runProvider(role.key);
    else runProxy(role.upstream, role.key);
  } else {
    runMain('proxy bench', main);
  }
}
