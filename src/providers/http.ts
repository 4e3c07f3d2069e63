import { request as httpRequest, type Agent as HttpAgent, type IncomingMessage, type ClientRequest, type RequestOptions } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import type { ProviderConfig } from '../config/types.js';
import { type ErrorCode, type ErrorDetails, type ErrorSpec, upstreamStatusSpec } from '../errors.js';
import { DOCUMENT_TOKENS } from '../billing/estimate.js';
import { MAX_TOKENS } from '../money.js';
import { ConnectionPool, queuedMs, type PoolOptions } from './pool.js';
import { WIRES } from '../protocols/index.js';
import { credential, type ProviderKind } from './kinds.js';
import { backoffMs, RETRY_STATUSES, retryAfterMs } from './retry.js';
import { EventTooLarge, SseSplitter } from './sse.js';
import { usageField } from './usage-field.js';
import { Watch, Watchlist } from './watchlist.js';
import type { CountRequest, Exchange, Provider } from './types.js';
import { responsesFilesOf, responsesInputOf } from '../translate/chat-to-responses-input.js';
import { countAnswer, type CountEndpoint } from '../translate/count.js';

/** The most of a provider's non-streamed answer the gateway will hold to meter it (an embeddings batch can be tens of MB). */
export const MAX_ANSWER_BYTES = 64 * 1024 * 1024;
/**
 * The largest answer the gateway parses whole: JSON can take twenty times its size in heap, so
 * a few calls of 64 MiB answers built to be expensive (`[{},{},...]`) would exhaust it. A larger
 * answer whose usage cannot be read from its bytes is charged as an estimate, its output counted
 * as its length; a translated one cannot be translated.
 */
export const MAX_PARSED_ANSWER_BYTES = 8 * 1024 * 1024;
/** The longest stream event the gateway will hold to look at it, in characters (a provider over it is cut). */
export const MAX_EVENT_CHARS = 8 * 1024 * 1024;
/** The most of a provider's error body read for its message. */
const MAX_ERROR_BYTES = 64 * 1024;

// Connection pools live as long as the process and are shared across config reloads, keyed by
// origin, so a reload neither drops warm connections nor leaks old pools.
const pools = new Map<string, ConnectionPool>();
function poolFor(url: URL, hostname: string, port: number, forCounts: boolean): ConnectionPool {
  const name = forCounts ? `count ${url.origin}` : url.origin;
  let pool = pools.get(name);
  if (pool === undefined) {
    pool = new ConnectionPool({ protocol: url.protocol === 'https:' ? 'https:' : 'http:', hostname, port }, forCounts ? { maxSockets: COUNT_SOCKETS } : {});
    pools.set(name, pool);
  }
  return pool;
}

/**
 * Token counts go over a pool of their own per origin, a quarter the size of the calls' pool. A
 * count holds no slot (CONTRACT section 8), so one key's burst of counts could otherwise take
 * every socket of the origin's pool and keep other accounts' model calls waiting for one (found
 * in review: 3,000 counts of a plan without an RPM limit held 1,024 sockets, and a call waited
 * 2.9 s). Counts beyond these wait within their own timeout; at Anthropic's usual 100 to 300 ms
 * a count, 256 connections carry about a thousand counts a second.
 */
const COUNT_SOCKETS = 256;

/** Puts a pool of one's own in place for an origin (or its counts) before its first call (tests: a small one). */
export function useOriginPool(origin: string, pool: ConnectionPool, forCounts = false): void {
  pools.set(forCounts ? `count ${origin}` : origin, pool);
}

/**
 * Where one endpoint's calls go, worked out once per provider: a plain options object (Node
 * would otherwise convert a URL on every call) and the Host header, since the request headers
 * are passed as a flat array, which Node writes as they are instead of collecting them first.
 */
interface Target {
  send: typeof httpRequest;
  /** The origin's pool, typed as what http.request takes (it takes any object with addRequest). */
  agent: HttpAgent;
  hostname: string;
  port: number;
  path: string;
  host: string;
}

function targetOf(url: URL, forCounts = false): Target {
  const https = url.protocol === 'https:';
  const hostname = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
  const port = Number(url.port) || (https ? 443 : 80);
  return {
    send: https ? httpsRequest : httpRequest,
    agent: poolFor(url, hostname, port, forCounts) as unknown as HttpAgent,
    hostname,
    port,
    path: url.pathname + url.search,
    host: url.host,
  };
}

/** `name` (a raw header name) is `lower` (lower case, same length), in any case. */
function is(name: string, lower: string): boolean {
  // Most providers send lower-case names; the first letter rules out most others unlowered.
  return name === lower || ((name.charCodeAt(0) | 0x20) === lower.charCodeAt(0) && name.toLowerCase() === lower);
}

/**
 * The content type of a provider's answer and the headers passed on to the client as they are
 * (openai-processing-ms, openai-version, anthropic-organization-id; the provider's request id
 * renamed `x-upstream-request-id`), read in one pass over rawHeaders: cheaper than
 * `res.headers`, which builds an object of every header. Names are told apart by length
 * first, so most are never lower-cased or hashed.
 */
function answerHeaders(res: IncomingMessage): { contentType: string; encoding: string | null; passed: string[] } {
  let contentType = 'application/json';
  let encoding: string | null = null;
  const passed: string[] = [];
  let upstreamId: string | undefined;
  let requestId: string | undefined;
  const raw = res.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    switch (name.length) {
      case 10:
        if (is(name, 'request-id')) requestId ??= raw[i + 1]!;
        break;
      case 12:
        // Media types are case-insensitive (found in review: `Text/Event-Stream` was read as a whole answer).
        if (is(name, 'content-type')) contentType = raw[i + 1]!.toLowerCase();
        else if (is(name, 'x-request-id')) upstreamId = raw[i + 1]!;
        break;
      case 14:
        if (is(name, 'openai-version')) passed.push('openai-version', raw[i + 1]!);
        break;
      case 16:
        if (is(name, 'content-encoding')) encoding = raw[i + 1]!.trim().toLowerCase();
        break;
      case 20:
        if (is(name, 'openai-processing-ms')) passed.push('openai-processing-ms', raw[i + 1]!);
        break;
      case 25:
        if (is(name, 'anthropic-organization-id')) passed.push('anthropic-organization-id', raw[i + 1]!);
        break;
    }
  }
  upstreamId ??= requestId;
  if (upstreamId !== undefined) passed.push('x-upstream-request-id', upstreamId);
  return { contentType, encoding, passed };
}

/** The timer of one call, as the steps after its headers see it. */
interface Call {
  /** The call has its outcome: stop the timer. */
  end(): void;
  /** A body is now being read: it gets timeoutMs of its own. */
  readingBody(): void;
  /** Whether the body being read was cut because its timeoutMs passed. */
  timedOut(): boolean;
  /** Set when Node's parser could not read the answer's body (an `HPE_…` error, after its head). */
  unread: boolean;
}

type Outcome =
  | { kind: 'response'; res: IncomingMessage }
  | { kind: 'error'; error: Error };

/**
 * A provider reached over HTTP(S) in the OpenAI or Anthropic protocol. Retries connection
 * errors and 429/502/503/504/529 before the first byte reaches the client; relays answers as
 * they arrive (streams event by event, with backpressure); meters from the provider's usage.
 */
export class HttpProvider implements Provider {
  /** Where each endpoint's calls go, parsed once. */
  private readonly targets = new Map<string, Target>();
  /** Every call's `timeoutMs`. */
  private readonly timeouts: Watchlist;
  /** One credential header pair per key (none when the provider needs no key), built once. */
  private readonly credentials: Array<[string, string]>;
  /** The key the next call starts with: calls take the keys in turn. */
  private nextKey = 0;

  /** Where clients' token counts go (the kind's count, over the counts' own connections). */
  private readonly countTarget: Target;
  /** Where a call's input is counted before it is sent (the kind's count, over the calls' connections). */
  private readonly inputCountTarget: Target;

  constructor(private readonly config: ProviderConfig, private readonly kind: ProviderKind) {
    this.timeouts = new Watchlist(config.timeoutMs);
    this.credentials = config.apiKeys.map((key) => credential(config.authHeader ?? kind.authHeader, key));
    for (const [endpoint, path] of Object.entries(kind.paths)) this.targets.set(endpoint, targetOf(new URL(config.baseUrl + path)));
    const countUrl = new URL(config.baseUrl + kind.count.path);
    this.countTarget = targetOf(countUrl, true);
    // Part of an admitted call (which holds its slot), so over the calls' connections: on the
    // counts' own, clients' counts to the same origin, which hold no slot, could keep calls
    // waiting for them (found in review).
    this.inputCountTarget = targetOf(countUrl);
  }

  get countsAs(): CountEndpoint {
    return this.kind.count.endpoint;
  }

  /**
   * A client's token count, on the kind's own count: passed through when the client called the
   * same one (the model swapped; Anthropic's anthropic-version and anthropic-beta kept, the
   * provider's JSON relayed as it is), else its translation (made by the route, before
   * admission) answered in the client's form. One attempt under `timeoutMs`, its errors mapped
   * as a call's are; a server without the count (a 405, or a 404 not in the provider's error
   * envelope: a compatible one) is the request's 400 when no other deployment can count (see
   * noCount), and an answer without a believable count a 502: never a made-up figure.
   */
  countTokens(request: CountRequest): void {
    const passed = request.endpoint === this.kind.count.endpoint;
    const upstream = { ...request.upstream, model: request.model.upstreamModel };
    // A translated count takes none of the client's headers, as a translated call takes none (an
    // OpenAI client's anthropic-beta would count what its calls will not be billed).
    const headers = this.kind.count.endpoint === 'messages' ? this.kind.headers(passed ? (name) => request.header(name) : () => undefined) : [];
    this.ask(this.countTarget, JSON.stringify(upstream), request, headers, this.takeKey(), this.config.timeoutMs, request.attempts, request.onAbort, (outcome) => {
      if (outcome.kind === 'timeout') {
        return request.unavailable(() => request.fail('upstream_timeout', {
          // Still waiting for one of the counts' connections: the gateway's own queue took the time.
          message: outcome.queued ? `No connection to the provider came free within ${this.config.timeoutMs} ms (the gateway's connections for token counts are all busy).`
            : `The provider did not answer within ${this.config.timeoutMs} ms.`,
        }));
      }
      if (outcome.kind === 'unreachable') {
        return request.unavailable(() => request.fail('upstream_error', { message: `The provider could not be reached (${describe(outcome.error)}).` }));
      }
      const { status, answer, complete } = outcome;
      if (status >= 200 && status < 300 && complete) {
        const counted = inputTokensIn(answer);
        if (counted !== null) return request.answer(passed ? answer : countAnswer(request.endpoint, counted));
      }
      if (status >= 200 && status < 300) return request.fail('upstream_error', { message: 'The provider\'s count was cut off, too large or unreadable.' });
      if (noCountHere(status, answer)) {
        return request.noCount(`The model "${request.model.id}" cannot count tokens: its provider's server has no ${this.kind.count.path} (it answered ${status}).`);
      }
      // What a routed call fails over on moves the count on too (a refusal of the request is its answer).
      failAsAnswered(refusedRequest(status) ? request : {
        fail: (code, details) => request.unavailable(() => request.fail(code, details)),
        failWith: (code, spec, message) => request.unavailable(() => request.failWith(code, spec, message)), // a 408
      }, status, answer, outcome.waitMs);
    });
  }

  /**
   * One POST to a counting endpoint (`target`, over its pool) with the credential `key`, under
   * `timeoutMs` in all: sent again once on a new connection when a kept-alive one turns out
   * closed while idle, and, up to `attempts` in all, after what section 6 retries a call after
   * (no connection, 502, 503, 504, 529, a 429 with a short Retry-After), with the same back-off
   * (found in review: one 503 failed the call a retry would have saved). `done` gets the answer
   * or why there is none, once, unless the client left first.
   */
  private ask(
    target: Target, body: string, of: { readonly requestId: string; readonly tenant: string }, extraHeaders: readonly string[], key: number, timeoutMs: number, attempts: number,
    onAbort: (stop: () => void) => void, done: (outcome: CountOutcome) => void,
  ): void {
    const headers = [
      'host', target.host, 'content-type', 'application/json', 'content-length', String(Buffer.byteLength(body)),
      'accept', 'application/json', 'accept-encoding', 'identity', 'x-request-id', of.requestId,
      ...extraHeaders, ...this.config.headers,
    ];
    if (key >= 0) headers.push(...this.credentials[key]!);
    const deadlineAt = performance.now() + timeoutMs;
    let over = false;
    let n = 1;
    let backoff: NodeJS.Timeout | null = null;
    const finish = (then: () => void) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      if (backoff !== null) clearTimeout(backoff);
      then();
    };
    const outcome = (o: CountOutcome) => {
      if (over) return;
      const retried = o.kind === 'unreachable'
        || (o.kind === 'answer' && RETRY_STATUSES.has(o.status) && (o.status !== 429 || o.waitMs === null || o.waitMs <= 5000));
      if (retried && n < attempts) {
        const wait = backoffMs(n, o.kind === 'answer' ? o.waitMs : null);
        if (wait < deadlineAt - performance.now()) {
          n++;
          backoff = setTimeout(() => {
            backoff = null;
            send(false);
          }, wait);
          return;
        }
      }
      finish(() => done(o));
    };
    let req: ClientRequest;
    const timer = setTimeout(() => finish(() => {
      const queued = backoff === null && (req.socket == null || queuedMs(req) >= timeoutMs / 2);
      req.destroy();
      done({ kind: 'timeout', queued });
    }), timeoutMs);
    onAbort(() => finish(() => req.destroy()));
    const send = (fresh: boolean) => {
      const options: FreshOptions = { method: 'POST', hostname: target.hostname, port: target.port, path: target.path, agent: target.agent, headers, fresh, tenant: of.tenant };
      req = target.send(options);
      const sent = req;
      const sentAt = performance.now();
      let answered = false;
      req.on('error', (err) => {
        if (sent !== req) return; // an earlier attempt's, answered already
        if (!over && !answered && closedWhileIdle(sent, err, performance.now() - sentAt)) return send(true);
        outcome({ kind: 'unreachable', error: err });
      });
      req.on('upgrade', upgraded((err) => { if (sent === req) outcome({ kind: 'unreachable', error: err }); }));
      req.on('response', (res) => {
        answered = true;
        const waitMs = retryAfterMs(res.headers, Date.now());
        readSome(res, MAX_ERROR_BYTES, (answer, complete) => outcome({ kind: 'answer', status: res.statusCode ?? 0, waitMs, answer, complete }));
      });
      req.end(body);
    };
    send(false);
  }

  /**
   * Counts, before a Responses call whose input the provider holds or fetches beyond what the
   * request carries (see inputBeyondRequest), or a chat call holding a file (a translated
   * Messages call's PDF too: found in review, a 100-page PDF left early was charged one fixed
   * figure of 3,000 tokens), or a Messages call holding a document (the same, on Anthropic's
   * count_tokens), the input it will bill, and notes it: a client that
   * left before the final usage was charged only what its request carried, while the provider bills
   * all of it (found in review: a stored conversation of 300,000 tokens, continued again and
   * again by calls cut after their first event, cost the gateway its price each time and the
   * client nothing). With the call's own credential, within COUNT_TIMEOUT_MS. Only a server
   * without the endpoint (see noCountHere: a compatible one) lets the call go on uncounted; any other
   * failure to count is the call's, free, as the same failure of the call would be (found in
   * review: a count the provider rate-limited, or one left waiting, let the call go on uncounted).
   */
  private countInput(ex: Exchange, key: number, beyond: InputBeyond, then: () => void, filesOnly = false): void {
    // A chat call (a translated Messages call too) is counted in the Responses form the endpoint takes.
    const converted = ex.endpoint === 'chat';
    const upstream: Record<string, unknown> = { model: ex.model.upstreamModel };
    const files = filesOnly ? responsesFilesOf(ex.body) : null;
    if (files !== null) upstream.input = [{ role: 'user', content: files }];
    else if (converted) Object.assign(upstream, responsesInputOf(ex.body));
    else for (const field of ex.endpoint === 'messages' ? MESSAGES_COUNTED_FIELDS : COUNTED_FIELDS) if (ex.body[field] !== undefined) upstream[field] = ex.body[field];
    // Anthropic's count takes the call's own anthropic-version and anthropic-beta (a file by id needs its beta).
    const headers = ex.endpoint === 'messages' ? this.kind.headers((name) => ex.header(name)) : [];
    // A file's count fetches and reads it (a PDF's pages): it gets the call's own timeoutMs, and
    // its timeout moves nothing on (below); the rest is a tokenizer's work.
    const timeoutMs = beyond === 'file' ? this.config.timeoutMs : Math.min(this.config.timeoutMs, COUNT_TIMEOUT_MS);
    this.ask(this.inputCountTarget, JSON.stringify(upstream), ex, headers, key, timeoutMs, ex.maxAttempts, (stop) => ex.onAbort(stop), (outcome) => {
      if (ex.aborted) return;
      try {
        if (outcome.kind === 'answer') {
          const { status } = outcome;
          if (status >= 200 && status < 300) {
            const counted = outcome.complete ? inputTokensIn(outcome.answer) : null;
            // Nothing believable (cut, too large, not a count): the call goes on estimated, and it shows.
            if (counted === null) {
              ex.upstreamFailed('count_garbage');
              return then();
            }
            // The files alone: the estimate's text and the count's files (found in review: the
            // count alone dropped the text), in place of the estimate's fixed figure for each.
            return ex.noteInputCount(files === null ? counted : Math.max(0, ex.inputTokens - DOCUMENT_TOKENS * files.length) + counted, then);
          }
          if (noCountHere(status, outcome.answer)) return then();
          // A converted input the count refuses (a part or tool it reads otherwise, a chat-only
          // model) is the conversion's fault, not the call's: its files, what the estimate misses,
          // are counted alone, and refused again the call goes on, estimated as before. A 401 or
          // 403 too (a server in front may guard the count's path alone; a bad key fails the call
          // itself the same way).
          if (converted && refusedRequest(status)) {
            if (filesOnly || status === 401 || status === 403) return then();
            return this.countInput(ex, key, beyond, then, true);
          }
          ex.noteDelivered(false);
          ex.upstreamFailed(failureKind(status), outcome.waitMs);
          return failAsAnswered(ex, status, outcome.answer, outcome.waitMs);
        }
        ex.noteDelivered(false);
        if (outcome.kind === 'timeout') {
          // With a file, not 'timeout': a slow count may be the request's doing (a slow file URL),
          // and must not move the call on or cool the deployment down, fleet-wide (found in
          // review). Without one, the deployment is as slow as a call's timeout says.
          ex.upstreamFailed(outcome.queued ? 'queued' : beyond === 'file' ? 'count_timeout' : 'timeout');
          return ex.fail('upstream_timeout', {
            message: outcome.queued ? `No connection to the provider came free within ${timeoutMs} ms to count the call's input (the gateway's connections to it are all busy).`
              : `The provider did not count the call's input within ${timeoutMs} ms.`,
          });
        }
        ex.upstreamFailed('connection');
        ex.fail('upstream_error', { message: `The provider could not be reached (${describe(outcome.error)}).` });
      } catch (err) {
        ex.crash(err); // runs from a socket's events: a bug fails this call, never the process
      }
    });
  }

  handle(ex: Exchange): void {
    const key = this.takeKey();
    const beyond = ex.endpoint === 'responses' ? inputBeyondRequest(ex.body)
      : (ex.endpoint === 'chat' && chatHoldsFile(ex.body)) || (ex.endpoint === 'messages' && messagesHoldDocument(ex.body)) ? 'file' : null;
    if (beyond !== null) {
      // The count and the call go with the same credential: another key may be another project,
      // which cannot see the stored response.
      return this.countInput(ex, key, beyond, () => this.send(ex, key));
    }
    this.send(ex, key);
  }

  /** Sends the call with credential `key` first, retrying before the first byte as section 6 says, and relays the answer. */
  private send(ex: Exchange, key: number): void {
    const target = this.targets.get(ex.endpoint)!;
    const wire = WIRES[ex.endpoint];
    const body = wire.upstreamBody(ex);
    const headers = [
      'host', target.host,
      'content-type', 'application/json',
      'content-length', String(Buffer.byteLength(body)),
      'accept', ex.stream ? 'text/event-stream' : 'application/json',
      'accept-encoding', 'identity', // the gateway reads usage out of the answer
      'x-request-id', ex.requestId,
      ...this.kind.headers((name) => ex.header(name)),
      ...this.config.headers,
    ];
    // The credential goes last, so a retry after a 429 can put another key in its place.
    if (key >= 0) headers.push(...this.credentials[key]!);
    const options = {
      method: 'POST', hostname: target.hostname, port: target.port, path: target.path, agent: target.agent, headers, tenant: ex.tenant,
    };
    // The call's timeout covers the answer's headers, retries included, then, re-armed, the
    // body of a non-streamed answer or of an error. It is a Watch on the provider's list, not
    // a Node timer per call (which costs several µs per request; bench/MORE.md).
    const deadlineAt = performance.now() + this.config.timeoutMs;
    let phase: 'headers' | 'body' | 'over' = 'headers';
    let bodyTimedOut = false;
    let current: ClientRequest | null = null;
    /** The current attempt's request while it waits for its answer (null between attempts). */
    let pending: ClientRequest | null = null;
    let waiting: NodeJS.Timeout | null = null;
    // Whether the provider has the whole request, asked only when the call ends without an
    // answer: then it may bill the call, so the client is charged (a listener per attempt for
    // the same fact costs more on every call).
    const delivered = () => pending !== null && pending.writableFinished;
    const watch = new Watch(() => {
      if (waiting !== null) clearTimeout(waiting);
      if (phase === 'headers' && !ex.aborted) ex.noteDelivered(delivered());
      if (phase === 'body') bodyTimedOut = true;
      // Still waiting for one of the origin's connections, or it waited for one most of the
      // time: the gateway's own queue, not the provider, took the time (found in review: counted
      // as the provider's timeout, it cooled healthy deployments down, fleet-wide; the second
      // case too, a provider given 100 ms of its 1,000).
      const queued = phase === 'headers' && pending !== null && (pending.socket == null || queuedMs(pending) >= this.config.timeoutMs / 2);
      current?.destroy(); // a body being read is cut: its reader reports it incomplete
      if (phase !== 'headers' || ex.aborted) return;
      phase = 'over';
      ex.upstreamFailed(queued ? 'queued' : 'timeout');
      ex.fail('upstream_timeout', {
        message: queued ? `No connection to the provider came free within ${this.config.timeoutMs} ms (the gateway's connections to it are all busy).`
          : `The provider did not answer within ${this.config.timeoutMs} ms.`,
      });
    });
    const timeouts = this.timeouts;
    timeouts.arm(watch);
    const call: Call = {
      end() {
        phase = 'over';
        timeouts.remove(watch);
        if (waiting !== null) clearTimeout(waiting);
      },
      readingBody() {
        phase = 'body';
        timeouts.arm(watch);
      },
      timedOut: () => bodyTimedOut,
      unread: false,
    };
    ex.onAbort(() => {
      if (phase === 'headers') ex.noteDelivered(delivered());
      call.end();
      current?.destroy();
    });

    /** Attempt `n`; `fresh`: sent again, once, on a new connection (see closedWhileIdle). */
    const attempt = (n: number, fresh = false): void => {
      if (phase !== 'headers') return;
      const sent: FreshOptions = fresh ? { ...options, fresh } : options;
      const req = target.send(sent);
      current = req;
      pending = req;
      let done = false;
      const sentAt = performance.now();
      const settle = (outcome: Outcome) => {
        if (done || phase !== 'headers') return;
        done = true;
        pending = null;
        this.onOutcome(ex, outcome, n, deadlineAt, performance.now() - sentAt, call, (wait, otherKey) => {
          if (otherKey) {
            key = (key + 1) % this.credentials.length;
            headers[headers.length - 1] = this.credentials[key]![1];
          }
          waiting = setTimeout(() => { waiting = null; attempt(n + 1); }, wait);
        });
      };
      // A bug in what an outcome leads to fails this call, never the process (these run from sockets' events).
      req.on('response', (res) => {
        ex.observeUpstream((performance.now() - sentAt) / 1000);
        try {
          settle({ kind: 'response', res });
        } catch (err) {
          res.destroy();
          call.end();
          ex.crash(err);
        }
      });
      const failed = (error: Error) => {
        if (done && unreadable(error)) call.unread = true; // the answer's body: its reader cuts it
        if (!done && phase === 'headers' && !ex.aborted && closedWhileIdle(req, error, performance.now() - sentAt)) {
          done = true;
          pending = null;
          return attempt(n, true);
        }
        try {
          settle({ kind: 'error', error });
        } catch (err) {
          call.end();
          ex.crash(err);
        }
      };
      req.on('error', failed);
      req.on('upgrade', upgraded(failed));
      req.end(body);
      // From when the provider has it all (not while it is queued for a connection; an earlier
      // attempt's time no longer counts: found in review), and only for a model whose unseen
      // reasoning is estimated from it: a listener is not free.
      if (ex.model.reasoningTokensPerSecond !== 0) {
        ex.noteSent(false);
        req.once('finish', () => ex.noteSent(true));
      }
    };
    attempt(1);
  }

  /** The index of the key a call starts with, the keys taken in turn; -1 when the provider has none. */
  private takeKey(): number {
    const n = this.credentials.length;
    if (n === 0) return -1;
    const key = this.nextKey;
    this.nextKey = key + 1 === n ? 0 : key + 1;
    return key;
  }

  /**
   * What one attempt's outcome leads to: another attempt (on another key after a 429, when
   * there is one), the answer relayed, or an error answered.
   */
  private onOutcome(
    ex: Exchange, outcome: Outcome, n: number, deadlineAt: number, tookMs: number, call: Call, retry: (waitMs: number, otherKey: boolean) => void,
  ): void {
    if (ex.aborted) return call.end();
    // Another attempt only when the time left covers its wait and an attempt as long as this one
    // (found in review: one sent 40 ms before the deadline turned a free 503 into a charged 504).
    const timeFor = (wait: number) => wait + tookMs < deadlineAt - performance.now();
    if (outcome.kind === 'error' && unreadable(outcome.error)) {
      // The provider answered, in bytes that are not HTTP Node can read (headers too large, a
      // malformed line, two lengths): an answer that cannot be read, as a bad chunk is, not a
      // connection that failed (found in review: retried, failed over and cooled down, free).
      ex.noteDelivered(true);
      ex.upstreamFailed('garbage');
      call.end();
      return ex.fail('upstream_error', { message: `The provider's answer could not be read (${describe(outcome.error)}).` });
    }
    if (outcome.kind === 'error') {
      ex.noteDelivered(false); // a refused call is not billed
      ex.upstreamFailed('connection');
      const wait = backoffMs(n, null);
      if (n < ex.maxAttempts && timeFor(wait)) return retry(wait, false);
      call.end();
      return ex.fail('upstream_error', { message: `The provider could not be reached (${describe(outcome.error)}).` });
    }
    const res = outcome.res;
    const status = res.statusCode ?? 0;
    if (status >= 200 && status < 300) {
      ex.noteDelivered(true); // it answered: whatever becomes of the answer, it bills the call
      return this.relay(ex, res, call);
    }
    ex.noteDelivered(false); // an error status: the provider refused the call
    const providerWait = retryAfterMs(res.headers, Date.now());
    ex.upstreamFailed(failureKind(status), providerWait);

    // A 429 is about one key: with another key the next attempt need not wait for this one's Retry-After.
    const otherKey = status === 429 && this.credentials.length > 1;
    if (RETRY_STATUSES.has(status)) {
      const wait = backoffMs(n, otherKey ? null : providerWait);
      if (n < ex.maxAttempts && timeFor(wait) && (status !== 429 || otherKey || providerWait === null || providerWait <= 5000)) {
        discard(res, this.config.timeoutMs);
        return retry(wait, otherKey);
      }
    }
    readAnswer(ex, res, MAX_ERROR_BYTES, call, (answer) => {
      if (!ex.aborted) failAsAnswered(ex, status, answer, providerWait);
    });
  }

  /** A 2xx answer: streamed event by event, or read whole, metered, then sent. */
  private relay(ex: Exchange, res: IncomingMessage, call: Call): void {
    const { contentType, encoding, passed } = answerHeaders(res);
    ex.onAbort(() => res.destroy());
    if (encoding !== null && encoding !== 'identity') {
      // The gateway asked for identity: it reads usage out of the answer and relays it as it is.
      call.end();
      res.destroy();
      ex.upstreamFailed('garbage');
      return ex.fail('upstream_error', { message: `The provider answered in an encoding it was not asked for (${encoding}).` });
    }

    if (!contentType.startsWith('text/event-stream')) {
      readAnswer(ex, res, MAX_ANSWER_BYTES, call, (answer, complete) => {
        if (ex.aborted) return;
        if (!complete) {
          if (call.timedOut()) {
            // Not 'timeout': the provider has the request and answered, so routing must not
            // move the call to another deployment (found in review).
            ex.upstreamFailed('body_timeout');
            return ex.fail('upstream_timeout', { message: `The provider's answer did not arrive whole within ${this.config.timeoutMs} ms.` });
          }
          ex.upstreamFailed('cut');
          return ex.fail('upstream_error', { message: 'The provider\'s answer was cut off or too large.' });
        }
        // Usage is read out of the answer's bytes; the whole answer is decoded and parsed only
        // when that fails (no usage field, unbelievable counts, or something that may not be JSON).
        const wire = WIRES[ex.endpoint];
        // (Too large to parse whole, its usage field is read all the same: its tokens are exact.)
        const whole = answer.length <= MAX_PARSED_ANSWER_BYTES && wire.billsOutsideUsage?.(answer) === true;
        const found = whole ? undefined : usageField(answer);
        let usage = found === undefined ? null : wire.usage({ usage: found });
        if (usage === null && answer.length > MAX_PARSED_ANSWER_BYTES) {
          // Charged as an estimate, not parsed (found in review: heap); an embedding's vectors
          // are no generated output (found in review: 12.9 MB of them were charged as such).
          if (ex.endpoint !== 'embeddings') ex.noteOutput(answer.length);
        } else if (usage === null) {
          let json: unknown;
          try {
            json = JSON.parse(answer.toString('utf8'));
          } catch {
            ex.upstreamFailed('garbage');
            return ex.fail('upstream_error', { message: 'The provider answered something that is not JSON.' });
          }
          try {
            usage = wire.usage(json);
            if (usage === null) {
              ex.noteOutput(wire.outputChars(json)); // charged as an estimate
              const searches = wire.searchesOf?.(json) ?? 0;
              if (searches > 0) ex.noteUsage({ inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: searches });
            }
          } catch {
            // Nested too deeply to walk: an answer the client cannot be given either.
            ex.upstreamFailed('garbage');
            return ex.fail('upstream_error', { message: 'The provider\'s answer could not be read.' });
          }
        }
        ex.settle(usage, () => {
          passed.push('content-length', String(answer.length));
          ex.head(res.statusCode!, contentType, passed);
          ex.end(answer);
        });
      });
      return;
    }

    call.end(); // a stream has its own idle timer instead
    passed.push('cache-control', 'no-cache');
    ex.head(res.statusCode!, contentType, passed);
    const watcher = WIRES[ex.endpoint].watch(ex);
    const splitter = new SseSplitter(MAX_EVENT_CHARS);
    let ended = false;
    /** Whether the provider sent any event. */
    let eventful = false;
    // While the gateway waits for a slow client (backpressure), the provider's silence is ours,
    // not its own: the idle timer then does nothing, and restarts when the client has read.
    let waitingForClient = false;
    const idle: NodeJS.Timeout = setTimeout(() => onIdle(), this.config.streamIdleTimeoutMs);
    const onIdle = () => {
      // After the final event the rest of the provider's answer is drained for the socket's
      // reuse, but not for ever: a provider that neither ends nor closes loses the connection.
      if (ended) return void res.destroy();
      if (waitingForClient) return;
      res.destroy();
      cut(`no data from the provider for ${this.config.streamIdleTimeoutMs} ms`);
    };
    ex.onAbort(() => clearTimeout(idle));
    /**
     * Settles the charge, then sends the provider's `last` event (or '') as the client's and
     * ends. The idle timer keeps running: it bounds the drain of what the provider sends after.
     */
    const endWith = (last: string) => {
      ended = true;
      ex.settle(watcher.usage(), () => {
        const text = last === '' ? '' : ex.clientEvent(last);
        if (text !== null) ex.end(text);
      });
    };
    /** `unread`: the provider sent what the gateway cannot read (not a connection that failed). */
    const cut = (why: string, unread = false) => {
      if (ended || ex.aborted) return;
      ended = true;
      clearTimeout(idle);
      if (!eventful) {
        // Not one event: nothing reached the client (the answer's head waits for its first
        // bytes: BilledCall.head), a failure before its first byte, which moves a routed call on
        // (CONTRACT section 10) and is otherwise an error answer, not a dropped connection
        // (found in review). The provider had the request: charged as a call it may bill.
        ex.upstreamFailed(unread ? 'garbage' : 'connection');
        return ex.fail('upstream_error', { message: `The provider's stream broke off before its first event (${why}).` });
      }
      ex.upstreamFailed('cut');
      ex.cut(why, watcher.usage());
    };
    // A translated call could not translate an event, and has ended the call (cut, or an error answer).
    const untranslatable = () => {
      ended = true;
      clearTimeout(idle);
      res.destroy();
    };
    const resume = () => {
      waitingForClient = false;
      idle.refresh();
      res.resume();
    };
    const onData = (chunk: Buffer) => {
      if (ended) return;
      idle.refresh();
      let out = '';
      let all = true;
      for (const event of splitter.push(chunk)) {
        eventful = true;
        const seen = watcher.see(event);
        if (seen.final) {
          // The final event leaves only after the charge is settled. The rest of the provider's
          // answer is read and dropped (ended is set), so its socket returns to the pool (within
          // the idle timeout: see onIdle).
          if (out !== '') ex.write(out);
          endWith(seen.forward ? event : '');
          res.resume();
          return;
        }
        const text = seen.forward ? ex.clientEvent(event) : '';
        if (text === null) return untranslatable();
        if (text !== event) all = false;
        out += text;
      }
      // Every event of a chunk that was exactly whole events went on unchanged: its bytes are the answer's.
      if (out !== '' && !ex.write(out, all && splitter.whole ? chunk : undefined)) {
        res.pause(); // backpressure: a slow client slows the provider, the gateway does not buffer
        waitingForClient = true;
        ex.whenDrained(resume);
      }
    };
    res.on('data', (chunk: Buffer) => {
      // One try per chunk, not per event: an event over the bound, or one too deeply nested to
      // look at (JSON.stringify's stack), cuts this call; the process goes on.
      try {
        onData(chunk);
      } catch (err) {
        res.destroy();
        // After the final event (its charge, its answer's end) it can only be a bug: the call
        // fails; a cut would do nothing now, and the client would wait for an end that never comes.
        if (ended) return ex.crash(err);
        cut(err instanceof EventTooLarge ? `the provider sent an event over ${MAX_EVENT_CHARS} characters` : 'the provider sent an event the gateway cannot read', true);
      }
    });
    const onEnd = () => {
      const rest = splitter.rest();
      // Ended before its first event: nothing to relay (found in review: a 200 with no body).
      if (rest === '' && !eventful) return cut('the provider\'s stream ended before its first event');
      if (rest !== '') {
        let seen;
        try {
          seen = watcher.see(rest);
        } catch {
          return cut('the provider sent an event the gateway cannot read', true);
        }
        // A final event without its blank line (the stream ended instead) still waits for the charge.
        if (seen.final) return endWith(seen.forward ? rest : '');
        const text = seen.forward ? ex.clientEvent(rest) : '';
        if (text === null) return untranslatable();
        if (text !== '') ex.write(text);
      }
      endWith('');
    };
    res.on('end', () => {
      if (ended) return;
      try {
        onEnd();
      } catch (err) {
        ended = true;
        clearTimeout(idle);
        ex.crash(err); // a bug: this call fails, never the process
      }
    });
    // After bytes Node's parser could not read (bad chunk framing), an unreadable answer: not
    // failed over or cooled down as a connection that broke off is (found in review).
    res.on('error', () => cut('the provider\'s stream broke off', call.unread));
    res.on('close', () => {
      clearTimeout(idle);
      if (!res.complete) cut(call.unread ? 'the provider sent bytes that are not HTTP' : 'the provider\'s stream broke off', call.unread);
    });
  }
}

/**
 * Reads an answer the gateway has no use for to its end, so that its connection can be reused;
 * one that has not ended within `ms` (a provider that sends an error body slowly, or never
 * ends it) is let go, or each retry of such a provider would keep a connection for ever.
 */
function discard(res: IncomingMessage, ms: number): void {
  const timer = setTimeout(() => res.destroy(), ms);
  timer.unref();
  res.once('close', () => clearTimeout(timer));
  res.resume();
}

/**
 * Reads an answer's body whole under the call's timer, which it stops when done; a bug in
 * `then` fails the call (it runs from the socket's events), never the process.
 */
function readAnswer(ex: Exchange, res: IncomingMessage, limit: number, call: Call, then: (answer: Buffer, complete: boolean) => void): void {
  call.readingBody();
  readSome(res, limit, (answer, complete) => {
    call.end();
    try {
      then(answer, complete);
    } catch (err) {
      ex.crash(err);
    }
  });
}

/** Reads up to `limit` bytes of a response; `complete` is false if it was cut or too big. */
function readSome(res: IncomingMessage, limit: number, then: (answer: Buffer, complete: boolean) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  let called = false;
  const done = (complete: boolean) => {
    if (called) return;
    called = true;
    then(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size), complete);
  };
  res.on('data', (chunk: Buffer) => {
    if (size + chunk.length > limit) {
      res.destroy();
      done(false);
      return;
    }
    size += chunk.length;
    chunks.push(chunk);
  });
  res.on('end', () => done(true));
  // Cut before its end (the connection broke, or the client left): 'close' without 'end'.
  res.on('close', () => done(false));
}

/** The provider's own error message from an OpenAI or Anthropic error body. */
function providerMessage(text: string): string | null {
  try {
    const json = JSON.parse(text) as { error?: { message?: unknown }; message?: unknown };
    if (typeof json.error?.message === 'string') return json.error.message;
    if (typeof json.message === 'string') return json.message;
  } catch {
    // not JSON
  }
  const trimmed = text.trim();
  return trimmed === '' ? null : trimmed.slice(0, 500);
}

/**
 * Whether a count's answer says the server has no count: a 405, or a 404 that is not the
 * provider's own error about the request (a vLLM's `{"detail":"Not Found"}`, an Ollama's page,
 * Azure's "Resource not found"). A 404 whose error names what the request got wrong is about
 * the request (found in review: OpenAI's unknown `previous_response_id`, or Anthropic's unknown
 * model, was taken for a missing count).
 */
function noCountHere(status: number, answer: Buffer): boolean {
  if (status === 405) return true;
  if (status !== 404) return false;
  try {
    const json = JSON.parse(answer.toString('utf8')) as { error?: unknown };
    if (json === null || typeof json !== 'object' || json.error === null || typeof json.error !== 'object') return true;
    // What the request got wrong is named: a field (OpenAI's `param`), a `code`
    // (previous_response_not_found, model_not_found), or Anthropic's not_found_error. Azure's
    // unknown path names nothing, `{"code":"404","message":"Resource not found"}`, nor does
    // OpenAI's "Invalid URL" (found in review: a Responses call with a stored context was failed
    // with Azure's 404, never sent).
    const error = json.error as { param?: unknown; code?: unknown; type?: unknown };
    const names = (v: unknown) => typeof v === 'string' && v !== '' && !/^\d+$/.test(v);
    return !(names(error.param) || names(error.code) || error.type === 'not_found_error');
  } catch {
    return true;
  }
}

/** What answers with an error: a call, or a count. */
interface Failing {
  fail(code: ErrorCode, details?: ErrorDetails): void;
  failWith(code: string, spec: ErrorSpec, message: string): void;
}

/** Answers a provider's error status (not 2xx) as section 6 maps it, with the provider's message where it helps. */
function failAsAnswered(to: Failing, status: number, answer: Buffer, providerWaitMs: number | null): void {
  const retryAfterS = providerWaitMs === null ? 1 : Math.ceil(providerWaitMs / 1000);
  const message = providerMessage(answer.toString('utf8'));
  if (status === 429) return to.fail('upstream_rate_limited', { retryAfterS, ...(message ? { message } : {}) });
  if (status === 503 || status === 529) return to.fail('upstream_overloaded', { retryAfterS });
  if (status === 504) return to.fail('upstream_timeout');
  if (status === 401 || status === 403) return to.fail('upstream_error', { message: 'The provider rejected the gateway\'s own credentials.' });
  if (status >= 400 && status < 500) return to.failWith(`upstream_${status}`, upstreamStatusSpec(status), message ?? `The provider answered ${status}.`);
  to.fail('upstream_error', { message: `The provider answered ${status}.` });
}

/** How an error status is reported (Exchange.upstreamFailed; routing fails over on some). */
function failureKind(status: number): string {
  return status === 408 || status === 429 || status === 503 || status === 529 ? String(status) : status < 500 ? '4xx' : '5xx';
}

/** What a count gave: the provider's answer (with its Retry-After), or why there is none. */
type CountOutcome =
  | { kind: 'answer'; status: number; waitMs: number | null; answer: Buffer; complete: boolean }
  | { kind: 'unreachable'; error: Error }
  | { kind: 'timeout'; queued: boolean };

/** The Responses fields OpenAI's input count takes: those that make up the input (the rest it refuses). */
const COUNTED_FIELDS = [
  'conversation', 'input', 'instructions', 'parallel_tool_calls', 'personality', 'previous_response_id', 'reasoning', 'text', 'tool_choice', 'tools', 'truncation',
];

/** The Messages fields Anthropic's count takes (the rest it refuses). */
const MESSAGES_COUNTED_FIELDS = ['messages', 'system', 'tools', 'tool_choice', 'thinking'];

/** The longest a call waits for its input count (a tokenizer's work, answered in well under a second). */
const COUNT_TIMEOUT_MS = 10_000;

/**
 * A Responses call whose input the provider holds or fetches beyond what the request carries,
 * and bills: a stored response or conversation it continues, a stored item it refers to
 * (`item_reference`, or an item of an id alone), or a file (`input_file`: a PDF's pages, a file
 * by URL or id), which the gateway's estimate counts as one fixed figure (found in review: a
 * file by URL billed 250,000 tokens was charged 3,017 when its client left early): which of
 * them ('file' when it holds any file), or null for a call that carries its whole input.
 */
function inputBeyondRequest(body: Record<string, unknown>): InputBeyond | null {
  let beyond: InputBeyond | null = (body.previous_response_id !== undefined && body.previous_response_id !== null)
    || (body.conversation !== undefined && body.conversation !== null) ? 'stored' : null;
  const input = body.input;
  if (!Array.isArray(input)) return beyond;
  for (const item of input) {
    if (item === null || typeof item !== 'object') continue;
    const it = item as Record<string, unknown>;
    // A message's content, or a tool call's output (found in review: a file there was not counted).
    if (it.type === 'input_file' || holdsPart(it.content, 'input_file') || holdsPart(it.output, 'input_file')) return 'file';
    if (it.type === 'item_reference' || (it.type === undefined && it.role === undefined)) beyond = 'stored';
  }
  return beyond;
}

/** A refusal of the request or its credential: a 4xx other than a timeout's (408) or a rate limit's (429). */
function refusedRequest(status: number): boolean {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}

/** Whether a chat call holds a file part (a PDF's pages, a file by id), which the estimate counts as one fixed figure. */
function chatHoldsFile(body: Record<string, unknown>): boolean {
  const messages = body.messages;
  if (!Array.isArray(messages)) return false;
  for (const m of messages) if (m !== null && typeof m === 'object' && holdsPart((m as { content?: unknown }).content, 'file')) return true;
  return false;
}

/**
 * Whether a Messages call holds a document (a PDF inline, by URL or by file id), in a message or
 * in a tool's result: Anthropic bills every page, the estimate counts one fixed figure (found in
 * review: a 100-page PDF whose client left early was charged 3,000 tokens, as it was on OpenAI).
 */
function messagesHoldDocument(body: Record<string, unknown>): boolean {
  const messages = body.messages;
  if (!Array.isArray(messages)) return false;
  for (const m of messages) {
    const content = m !== null && typeof m === 'object' ? (m as { content?: unknown }).content : undefined;
    if (!Array.isArray(content)) continue;
    for (const part of content) {
      if (part === null || typeof part !== 'object') continue;
      const type = (part as { type?: unknown }).type;
      if (type === 'document' || (type === 'tool_result' && holdsPart((part as { content?: unknown }).content, 'document'))) return true;
    }
  }
  return false;
}

/** Why a call's input is counted first: it refers to stored input, or holds a file (which the provider may fetch). */
type InputBeyond = 'stored' | 'file';

/** Whether `parts` is an array holding a part of this `type`. */
function holdsPart(parts: unknown, type: string): boolean {
  if (!Array.isArray(parts)) return false;
  for (const part of parts) if (part !== null && typeof part === 'object' && (part as { type?: unknown }).type === type) return true;
  return false;
}

/** The `input_tokens` of an input count's answer, or null when it has no believable one. */
function inputTokensIn(answer: Buffer): number | null {
  try {
    const json = JSON.parse(answer.toString('utf8')) as { input_tokens?: unknown };
    const n = json.input_tokens;
    return typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= MAX_TOKENS ? n : null;
  } catch {
    return null;
  }
}

/**
 * A provider that answers 101 Switching Protocols gives no answer, and without a listener for
 * it Node closes the connection and says nothing more: the call would wait out its timeoutMs
 * (found in review). With one (an event name of its own, cheaper to listen to than 'close' on
 * every call), the connection is closed and the attempt fails at once, like a connection error.
 */
function upgraded(failed: (err: Error) => void): (res: IncomingMessage, socket: Duplex) => void {
  return (_res, socket) => {
    socket.destroy();
    failed(new Error('it switched protocols (101) instead of answering'));
  };
}

function describe(error: Error): string {
  return (error as NodeJS.ErrnoException).code ?? error.message;
}

/** Request options with the pool's own: `fresh`, a new connection, and `tenant` (see ConnectionPool.addRequest). */
type FreshOptions = RequestOptions & PoolOptions;

/**
 * A request that failed on a kept-alive connection the provider had closed while it sat idle in
 * the pool (it reset the connection, or closed it as the request arrived), before any answer:
 * the provider most likely never took the request, so it is sent again at once, as no failure
 * of the provider's (found in review: it cooled a healthy deployment down, fleet-wide, and moved
 * calls to the fallback; servers such as uvicorn close idle connections after 5 s). Once: on a
 * new connection (`fresh`), where the same failure is the provider's (found in review: sent
 * again on each stale idle connection in turn, a request that crashed the provider went seven
 * times).
 */
function closedWhileIdle(req: ClientRequest, error: Error, heldMs: number): boolean {
  if (!req.reusedSocket || heldMs >= IDLE_CLOSE_RACE_MS) return false;
  const code = (error as NodeJS.ErrnoException).code;
  return code === 'ECONNRESET' || code === 'EPIPE' || code === 'ECONNABORTED';
}

/**
 * How soon after a request was sent a reset can still be the provider closing the connection
 * as it sat idle (one round trip, with room): a later one came after the provider worked on the
 * request, and is its failure (found in review: a request held 1.5 s and reset was sent again).
 */
const IDLE_CLOSE_RACE_MS = 1000;

/** An answer Node's HTTP parser could not read (its errors are `HPE_…`): the provider answered. */
function unreadable(error: Error): boolean {
  const code = (error as NodeJS.ErrnoException).code;
  return typeof code === 'string' && code.startsWith('HPE_');
}
