/**
 * A small closed-loop HTTP/1.1 load generator for one GET endpoint, and the correctness checks
 * of the answers the benches load: `checkModels` (`GET /v1/models`) and `checkChat` (a
 * non-streamed chat completion, as rawhttp.ts's `once` returns it).
 *
 * Node's http client costs more CPU per request than a lean server does, so on a 2-core box
 * it would measure itself. The target is first checked with node:http (status, headers, the
 * models list), then loaded with `closedLoop` from rawhttp.ts: a precomputed request Buffer on
 * raw keep-alive `node:net` sockets, one request in flight per connection (no pipelining), a
 * fixed number of connections, a fixed duration.
 *
 * Library: `load(options)`. CLI:
 *   node --import tsx bench/load.ts --url http://127.0.0.1:PORT [--key KEY] [--path /v1/models]
 *     [--duration 5] [--connections 32] [--models echo-1:mock,other:owner]
 */
import { request as httpRequest } from 'node:http';
import { int, num, parseFlags, runMain, str } from './cli.js';
import { closedLoop, rawRequest, type Answer } from './rawhttp.js';

// ---------------------------------------------------------------------------------------------
// Correctness check (node:http, one request): status, headers and the exact body.
// ---------------------------------------------------------------------------------------------

/** A model as `/v1/models` should list it; `created` is the server's start time, not known here. */
export interface ExpectedModel {
  id: string;
  owned_by: string;
  /** The config's displayName and outputTokenLimit; default: the id, and the config's default 128,000. */
  display_name?: string;
  max_tokens?: number;
}

/**
 * The `/v1/models` body the gateway answers for these models (src/directory.ts): OpenAI's list
 * with Anthropic's fields too, sorted by id. bench/baseline.ts serves it; `checkModels` expects it.
 */
export function modelsListBody(models: ExpectedModel[], createdS: number): string {
  const sorted = [...models].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const data = sorted.map((m) => ({
    id: m.id, object: 'model', created: createdS, owned_by: m.owned_by,
    type: 'model', display_name: m.display_name ?? m.id, created_at: new Date(createdS * 1000).toISOString(), max_tokens: m.max_tokens ?? 128_000,
  }));
  return JSON.stringify({ object: 'list', data, has_more: false, first_id: sorted[0]?.id ?? null, last_id: sorted.at(-1)?.id ?? null });
}

export interface CheckResult {
  ok: boolean;
  problems: string[];
  status: number;
  /** Byte length of the checked 200 body: every answer under load must have this length. */
  bodyBytes: number;
}

/**
 * GETs `url + path` once with node:http and checks it against the `/v1/models` contract: 200,
 * `content-type: application/json`, an `x-request-id`, a right `content-length`, and a body equal
 * byte for byte to `modelsListBody(expected)`, with `created` taken from the answer after checking
 * it is a plausible integer timestamp. With `expected` null only the shape is checked.
 */
export function checkModels(url: string, path: string, headers: Record<string, string>, expected: ExpectedModel[] | null): Promise<CheckResult> {
  return new Promise((resolve) => {
    const problems: string[] = [];
    const req = httpRequest(new URL(path, url), { method: 'GET', headers, agent: false, timeout: 5000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks);
        const body = raw.toString('utf8');
        const status = res.statusCode ?? 0;
        if (status !== 200) problems.push(`status ${status}, want 200 (body ${body.slice(0, 200)})`);
        if (res.headers['content-type'] !== 'application/json') problems.push(`content-type ${JSON.stringify(res.headers['content-type'])}`);
        if (typeof res.headers['x-request-id'] !== 'string' || res.headers['x-request-id'] === '') problems.push('no x-request-id header');
        if (res.headers['content-length'] !== String(raw.length)) problems.push(`content-length ${JSON.stringify(res.headers['content-length'])} but ${raw.length} body bytes`);
        if (res.headers['transfer-encoding'] !== undefined) problems.push('chunked answer: the load generator needs content-length');
        if (status === 200) problems.push(...compareModelsBody(body, expected));
        resolve({ ok: problems.length === 0, problems, status, bodyBytes: raw.length });
      });
    });
    req.on('timeout', () => req.destroy(new Error('timed out after 5 s')));
    req.on('error', (err) => resolve({ ok: false, problems: [`request failed: ${err.message}`], status: 0, bodyBytes: 0 }));
    req.end();
  });
}

function compareModelsBody(body: string, expected: ExpectedModel[] | null): string[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    return [`body is not JSON: ${body.slice(0, 200)}`];
  }
  const data = (parsed as { data?: unknown }).data;
  if (!Array.isArray(data) || data.length === 0) return [`body has no data list: ${body.slice(0, 200)}`];
  const created = (data[0] as { created?: unknown }).created;
  const nowS = Date.now() / 1000;
  if (typeof created !== 'number' || !Number.isInteger(created) || created > nowS + 1 || created < nowS - 86_400) {
    return [`implausible created ${JSON.stringify(created)}`];
  }
  const models: ExpectedModel[] = expected ?? data.map((m: { id?: unknown; owned_by?: unknown; display_name?: unknown; max_tokens?: unknown }) =>
    ({ id: String(m.id), owned_by: String(m.owned_by), display_name: String(m.display_name), max_tokens: Number(m.max_tokens) }));
  const want = modelsListBody(models, created);
  return body === want ? [] : [`body differs\n    got  ${body}\n    want ${want}`];
}

/**
 * Checks one non-streamed chat completion answer (kept by `once`): 200, JSON content type,
 * content-length framing, an x-request-id, and a completion of `model` whose message is
 * `content` (the mock provider echoes the prompt), with consistent usage.
 */
export function checkChat(a: Answer, model: string, content: string): CheckResult {
  const problems: string[] = [];
  const text = a.body?.toString('utf8') ?? '';
  const headers = new Map((a.head ?? '').split('\r\n').slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
  if (a.status !== 200) problems.push(`status ${a.status} (body ${text.slice(0, 200)})`);
  if (headers.get('content-type') !== 'application/json') problems.push(`content-type ${JSON.stringify(headers.get('content-type'))}`);
  if (a.chunked || headers.get('content-length') !== String(a.bodyBytes)) problems.push(`content-length ${JSON.stringify(headers.get('content-length'))} but ${a.bodyBytes} body bytes${a.chunked ? ', chunked' : ''}`);
  if (!headers.get('x-request-id')) problems.push('no x-request-id header');
  try {
    const c = JSON.parse(text) as {
      id?: unknown; object?: unknown; model?: unknown;
      choices?: Array<{ message?: { role?: unknown; content?: unknown }; finish_reason?: unknown }>;
      usage?: { prompt_tokens?: unknown; completion_tokens?: unknown; total_tokens?: unknown };
    };
    if (c.object !== 'chat.completion') problems.push(`object ${JSON.stringify(c.object)}`);
    if (typeof c.id !== 'string' || !c.id.startsWith('chatcmpl-')) problems.push(`id ${JSON.stringify(c.id)}`);
    if (c.model !== model) problems.push(`model ${JSON.stringify(c.model)}`);
    const choice = c.choices?.[0];
    if (choice?.message?.role !== 'assistant' || choice.message.content !== content) problems.push(`message ${JSON.stringify(choice?.message)}`);
    if (choice?.finish_reason !== 'stop') problems.push(`finish_reason ${JSON.stringify(choice?.finish_reason)}`);
    const u = c.usage;
    if (typeof u?.prompt_tokens !== 'number' || u.prompt_tokens <= 0 || typeof u.completion_tokens !== 'number' || u.completion_tokens <= 0 ||
      u.total_tokens !== u.prompt_tokens + u.completion_tokens) problems.push(`usage ${JSON.stringify(u)}`);
  } catch {
    problems.push(`body is not JSON: ${text.slice(0, 200)}`);
  }
  return { ok: problems.length === 0, problems, status: a.status, bodyBytes: a.bodyBytes };
}

// ---------------------------------------------------------------------------------------------
// The load loop.
// ---------------------------------------------------------------------------------------------

export interface LoadOptions {
  /** Base URL, `http://127.0.0.1:PORT` (only loopback is allowed). */
  url: string;
  path?: string;
  /** Extra request headers, e.g. `{ authorization: 'Bearer KEY' }`. */
  headers?: Record<string, string>;
  connections: number;
  durationS: number;
  /** What the body must be; null checks only the shape. */
  expected?: ExpectedModel[] | null;
  /** The server's process id, to report its CPU use over the timed window (Linux /proc). */
  serverPid?: number;
}

export interface LoadResult {
  /** Responses completed inside the timed window, per second. */
  rps: number;
  requests: number;
  elapsedS: number;
  p50Us: number;
  p99Us: number;
  p999Us: number;
  maxUs: number;
  /** Responses by status code (the timed window plus the drain of in-flight requests). */
  statuses: Record<string, number>;
  /** 200 answers whose body length differs from the checked one. */
  badBodies: number;
  /** Socket errors, unexpected closes and unparsable answers. */
  errors: number;
  /** CPU used in the timed window, in cores (1 = one core busy): this process, and the server's if known. */
  loaderCpu: number;
  serverCpu: number | null;
  /** The node:http correctness check done before loading. */
  check: CheckResult;
}

/** Checks the target with node:http, then loads it for `durationS` seconds. */
export async function load(options: LoadOptions): Promise<LoadResult> {
  const target = new URL(options.url);
  if (target.hostname !== '127.0.0.1' || target.protocol !== 'http:') throw new Error(`only http://127.0.0.1 is allowed, got ${options.url}`);
  const port = Number(target.port);
  const path = options.path ?? '/v1/models';
  const headers = options.headers ?? {};

  const check = await checkModels(options.url, path, headers, options.expected ?? null);
  const empty = { rps: 0, requests: 0, elapsedS: 0, p50Us: 0, p99Us: 0, p999Us: 0, maxUs: 0, statuses: {}, badBodies: 0, errors: 0, loaderCpu: 0, serverCpu: null, check };
  if (!check.ok) return empty;

  const r = await closedLoop({
    port, requests: [rawRequest('GET', port, path, headers)], durationS: options.durationS, connections: options.connections,
    expectBytes: check.bodyBytes, watch: options.serverPid === undefined ? {} : { server: options.serverPid },
  });
  const serverS = r.cpuS.server ?? null;
  return {
    rps: r.rps,
    requests: r.requests,
    elapsedS: r.elapsedS,
    p50Us: r.total.quantileUs(0.5),
    p99Us: r.total.quantileUs(0.99),
    p999Us: r.total.quantileUs(0.999),
    maxUs: r.total.maxUs,
    statuses: Object.fromEntries(Object.entries(r.statuses).sort((x, y) => Number(x[0]) - Number(y[0]))),
    badBodies: r.badBodies,
    errors: r.errors,
    loaderCpu: r.loaderCpuS / r.elapsedS,
    serverCpu: serverS === null ? null : serverS / r.elapsedS,
    check,
  };
}

/** True when the run saw only correct 200 answers. */
export function clean(r: LoadResult): boolean {
  const non200 = Object.entries(r.statuses).some(([s, n]) => s !== '200' && n > 0);
  return r.check.ok && !non200 && r.badBodies === 0 && r.errors === 0 && r.requests > 0;
}

// ---------------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------------

function cli(): void {
  const flags = parseFlags('load.ts', {
    url: str({ default: 'http://127.0.0.1:8080', arg: 'URL', help: 'the server, http://127.0.0.1:PORT' }),
    key: str({ default: null, arg: 'KEY', help: 'sent as Authorization: Bearer KEY' }),
    path: str({ default: '/v1/models', arg: 'PATH', help: 'the GET path' }),
    durationS: num({ name: 'duration', default: 5, help: 'seconds of load' }),
    connections: int({ default: 32, help: 'keep-alive connections' }),
    models: str({ default: null, arg: 'ID:OWNER,...', help: 'the exact models list expected (else only its shape is checked)' }),
  });
  runMain('load', async () => {
    const r = await load({
      url: flags.url,
      path: flags.path,
      headers: flags.key === null ? {} : { authorization: `Bearer ${flags.key}` },
      durationS: flags.durationS,
      connections: flags.connections,
      expected: flags.models === null ? null : flags.models.split(',').map((m) => {
        const [id, owned_by] = m.split(':');
        return { id: id!, owned_by: owned_by ?? '' };
      }),
    });
    if (!r.check.ok) process.stderr.write(`correctness check failed:\n  ${r.check.problems.join('\n  ')}\n`);
    process.stdout.write(`${JSON.stringify(r, (k, v) => (k === 'check' ? { ok: v.ok, problems: v.problems } : typeof v === 'number' ? Math.round(v * 10) / 10 : v))}\n`);
    return clean(r) ? 0 : 1;
  });
}

if (require.main === module) cli();
