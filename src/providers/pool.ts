import type { ClientRequest } from 'node:http';
import { connect as tcpConnect, isIP, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { connect as tlsConnect } from 'node:tls';

/** How long an idle socket is kept at most (below the usual load balancers' idle limits). */
export const IDLE_MS = 30_000;
/** How much sooner than the provider's `Keep-Alive: timeout=N` an idle socket is dropped (as http.Agent does). */
const HINT_MARGIN_MS = 1_000;

/** The pool's own request options (Node passes a request's options on to addRequest). */
export interface PoolOptions {
  /** Take no idle connection, but a new one. */
  fresh?: boolean;
  /** Who the request is for (an account): while every connection is busy, tenants are served in turn. */
  tenant?: string;
}

/** What Node's ClientRequest expects of an agent, beyond addRequest. */
interface RequestInternals extends ClientRequest {
  onSocket(socket: Socket): void;
  shouldKeepAlive: boolean;
  res?: { rawHeaders: string[] } | null;
  /** Set on a request that waited for a connection: since when (performance.now()), then for how long. */
  queuedAt?: number;
  queuedMs?: number;
}

/**
 * How long a request waited in its pool for a connection (0: it had one at once), once it has
 * one: time the gateway's own queue took, not the provider (see the call's timeout).
 */
export function queuedMs(req: ClientRequest): number {
  return (req as RequestInternals).queuedMs ?? 0;
}

/**
 * A keep-alive connection pool for one provider origin, given to `http.request` as its
 * `agent` (Node takes any object with `addRequest`). It keeps the idle sockets in one LIFO
 * list. http.Agent does the same job in a general way that costs about a fifth of the
 * gateway's CPU per proxied call here: it copies the request options into dictionary objects
 * twice per call, builds and looks up a name string in several maps, and builds the answer's
 * header object to read the keep-alive hint (bench/MORE.md). The protocol with Node's client
 * is http.Agent's own: the socket is handed over with `req.onSocket`, and the client emits
 * 'free' on it when the answer is over and the connection may be reused.
 *
 * While every connection is busy, requests wait in a queue per tenant, and a connection that
 * comes free goes to the tenants in turn, each one's oldest first: one account's burst (say a
 * plan without a concurrency limit, thousands of calls) waits behind its own calls, not in
 * front of every other account's (one queue made them wait for the whole burst).
 */
export class ConnectionPool {
  /** Read by ClientRequest: with a keep-alive agent, requests ask for keep-alive. */
  readonly keepAlive = true;
  readonly protocol: 'http:' | 'https:';
  readonly defaultPort: number;
  /** Idle sockets, most recently freed last, with the time each may stay idle until. */
  private readonly idle: Socket[] = [];
  private readonly idleUntil: number[] = [];
  /**
   * Requests waiting for a socket while maxSockets are open, per tenant; the Map's order is the
   * turn (a tenant served goes to its end).
   */
  private readonly waiting = new Map<string, RequestInternals[]>();
  private waitingCount = 0;
  private open = 0;
  private readonly sweeper: NodeJS.Timeout;

  readonly maxSockets: number;
  private readonly idleMs: number;

  constructor(
    private readonly origin: { protocol: 'http:' | 'https:'; hostname: string; port: number },
    options: { maxSockets?: number; idleMs?: number } = {},
  ) {
    this.protocol = origin.protocol;
    this.defaultPort = origin.protocol === 'https:' ? 443 : 80;
    this.maxSockets = options.maxSockets ?? 1024;
    this.idleMs = options.idleMs ?? IDLE_MS;
    this.sweeper = setInterval(() => this.dropExpired(performance.now()), this.idleMs / 2);
    this.sweeper.unref();
  }

  /** Connections open now (busy and idle), idle ones, and requests waiting: for tests. */
  get size(): { open: number; idle: number; waiting: number } {
    return { open: this.open, idle: this.idle.length, waiting: this.waitingCount };
  }

  /**
   * Called by ClientRequest for every request, with its options: `fresh: true` (a request sent
   * again because its kept-alive connection was found closed) takes no idle connection, which
   * may be as stale, but a new one.
   */
  addRequest(req: ClientRequest, options?: PoolOptions): void {
    const request = req as RequestInternals;
    const now = performance.now();
    for (;;) {
      if (options?.fresh === true) break;
      const socket = this.idle.pop();
      if (socket === undefined) break;
      const until = this.idleUntil.pop()!;
      if (socket.destroyed || until <= now) {
        socket.destroy();
        continue;
      }
      socket.removeListener('error', onIdleError);
      socket.ref();
      request.reusedSocket = true;
      request.onSocket(socket);
      return;
    }
    if (this.open < this.maxSockets) return request.onSocket(this.connect());
    request.queuedAt = now;
    const tenant = options?.tenant ?? '';
    const queue = this.waiting.get(tenant);
    if (queue === undefined) this.waiting.set(tenant, [request]);
    else queue.push(request);
    this.waitingCount++;
  }

  /** The request a freed connection goes to: the oldest of the tenant whose turn it is. */
  private nextWaiting(): RequestInternals | undefined {
    if (this.waitingCount === 0) return undefined;
    const [tenant, queue] = this.waiting.entries().next().value!;
    const next = queue.shift()!;
    this.waiting.delete(tenant);
    if (queue.length > 0) this.waiting.set(tenant, queue); // to the end of the turn
    this.waitingCount--;
    next.queuedMs = performance.now() - next.queuedAt!;
    return next;
  }

  private connect(): Socket {
    const { protocol, hostname, port } = this.origin;
    const socket = protocol === 'https:'
      // SNI only for names (RFC 6066); the certificate is checked against the host either way.
      ? tlsConnect({ host: hostname, port, servername: isIP(hostname) === 0 ? hostname : undefined, ALPNProtocols: ['http/1.1'] })
      : tcpConnect({ host: hostname, port });
    // As http.Agent: no Nagle delay on a request's last segment; TCP keep-alive probes on idle
    // connections. (Set on the socket, so they apply to TLS sockets as well.)
    socket.setNoDelay(true);
    socket.setKeepAlive(true, 1000);
    this.open++;
    socket.on('free', () => this.onFree(socket));
    socket.on('close', () => this.onClose(socket));
    socket.on('agentRemove', () => this.onClose(socket)); // taken over (an upgrade): no longer ours
    return socket;
  }

  /** The client is done with the socket: the next waiting request gets it, or it goes idle. */
  private onFree(socket: Socket): void {
    const req = (socket as Socket & { _httpMessage?: RequestInternals | null })._httpMessage;
    if (!socket.writable || req == null || !req.shouldKeepAlive) {
      socket.destroy();
      return;
    }
    // The next waiting request gets it. One destroyed while it waited gets it too, as with
    // http.Agent: Node then ends that request ('error', 'close') and frees the socket again.
    const next = this.nextWaiting();
    if (next !== undefined) {
      next.reusedSocket = true;
      next.onSocket(socket);
      return;
    }
    const idleMs = idleLimit(req, this.idleMs);
    if (idleMs <= 0) {
      socket.destroy();
      return;
    }
    (socket as Socket & { _httpMessage?: unknown })._httpMessage = null;
    socket.unref(); // an idle connection does not keep the process alive
    socket.once('error', onIdleError);
    this.idle.push(socket);
    this.idleUntil.push(performance.now() + idleMs);
  }

  private onClose(socket: Socket): void {
    if (socket.listenerCount('free') === 0) return; // counted out already ('agentRemove', then 'close')
    socket.removeAllListeners('free');
    this.open--;
    const at = this.idle.indexOf(socket);
    if (at !== -1) {
      this.idle.splice(at, 1);
      this.idleUntil.splice(at, 1);
    }
    // A slot opened: the next waiting request gets a new connection.
    const next = this.nextWaiting();
    if (next !== undefined) next.onSocket(this.connect());
  }

  /** Idle sockets past their time, oldest first (they sit at the start of the list). */
  private dropExpired(now: number): void {
    let n = 0;
    while (n < this.idle.length && this.idleUntil[n]! <= now) n++;
    if (n === 0) return;
    const expired = this.idle.splice(0, n);
    this.idleUntil.splice(0, n);
    for (const socket of expired) socket.destroy();
  }
}

function onIdleError(this: Socket): void {
  this.destroy();
}

/** How long a freed socket may stay idle: at most `most`, less when the provider's Keep-Alive hint says so. */
function idleLimit(req: RequestInternals, most: number): number {
  const raw = req.res?.rawHeaders;
  if (raw == null) return most;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length !== 10 || (name !== 'keep-alive' && name.toLowerCase() !== 'keep-alive')) continue;
    const hint = /^\s*timeout=(\d+)/i.exec(raw[i + 1]!);
    if (hint !== null) return Math.min(most, Number(hint[1]) * 1000 - HINT_MARGIN_MS);
  }
  return most;
}
