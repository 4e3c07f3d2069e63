import assert from 'node:assert/strict';
import { createServer, request, type Agent, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { after, describe, test } from 'node:test';
import { ConnectionPool } from '../../src/providers/pool.js';

/** A provider stand-in that counts the connections it accepts; `answer` decides how each request is answered. */
async function server(answer: (req: IncomingMessage, res: ServerResponse) => void, keepAliveTimeout = 65_000) {
  const sockets = new Set<Socket>();
  let accepted = 0;
  const srv: Server = createServer({ keepAliveTimeout }, (req, res) => {
    req.resume();
    req.on('end', () => answer(req, res));
  });
  srv.on('connection', (s: Socket) => {
    accepted++;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as AddressInfo).port;
  return {
    port,
    accepted: () => accepted,
    /** Closes the server side of every open connection (a provider dropping idle connections). */
    dropAll: () => { for (const s of sockets) s.destroy(); },
    close: () => new Promise<void>((r) => { srv.closeAllConnections(); srv.close(() => r()); }),
  };
}

function call(pool: ConnectionPool, port: number): { done: Promise<{ status: number; body: string; reused: boolean }>; abort: () => void } {
  let abort = () => {};
  const done = new Promise<{ status: number; body: string; reused: boolean }>((resolve, reject) => {
    const req = request({
      method: 'POST', hostname: '127.0.0.1', port, path: '/', agent: pool as unknown as Agent,
      headers: ['host', `127.0.0.1:${port}`, 'content-length', '2'],
    }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode!, body, reused: req.reusedSocket }));
    });
    req.on('error', reject);
    abort = () => req.destroy();
    req.end('hi');
  });
  return { done, abort };
}

/** Polls `check` until it holds (timers, not a fixed sleep), failing after `ms`. */
async function until(check: () => boolean, ms = 3000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not reached in time');
    await new Promise((r) => setTimeout(r, 5));
  }
}

const pool = (port: number, options = {}) => new ConnectionPool({ protocol: 'http:', hostname: '127.0.0.1', port }, options);

describe('ConnectionPool', () => {
  const servers: Array<{ close: () => Promise<void> }> = [];
  after(() => Promise.all(servers.map((s) => s.close())));

  test('calls one after another share one kept-alive connection', async () => {
    const s = await server((_req, res) => res.end('ok'));
    servers.push(s);
    const p = pool(s.port);
    const reused: boolean[] = [];
    for (let i = 0; i < 20; i++) {
      const a = await call(p, s.port).done;
      assert.equal(a.body, 'ok');
      reused.push(a.reused);
    }
    assert.equal(s.accepted(), 1);
    assert.deepEqual(reused, [false, ...Array(19).fill(true)]);
    assert.deepEqual(p.size, { open: 1, idle: 1, waiting: 0 });
  });

  test('at most maxSockets connections; the others wait and get freed ones, none lost', async () => {
    const held: ServerResponse[] = [];
    const s = await server((_req, res) => {
      held.push(res);
      if (held.length === 2) setImmediate(() => { for (const r of held.splice(0)) r.end('ok'); });
    });
    servers.push(s);
    const p = pool(s.port, { maxSockets: 2 });
    const calls = Array.from({ length: 7 }, () => call(p, s.port));
    calls[3]!.abort(); // gone while waiting: it fails, and the socket it is handed goes on
    await assert.rejects(calls[3]!.done);
    // The other 6 are answered two at a time, on the same two connections.
    const answers = await Promise.all(calls.filter((_, i) => i !== 3).map((c) => c.done));
    assert.deepEqual(answers.map((a) => a.body), Array(6).fill('ok'));
    assert.equal(s.accepted(), 2);
    assert.deepEqual(p.size, { open: 2, idle: 2, waiting: 0 });
  });

  test('a connection the provider closes while idle leaves the pool; the next call opens a new one', async () => {
    const s = await server((_req, res) => res.end('ok'));
    servers.push(s);
    const p = pool(s.port);
    await call(p, s.port).done;
    s.dropAll();
    await until(() => p.size.open === 0);
    assert.deepEqual(p.size, { open: 0, idle: 0, waiting: 0 });
    const a = await call(p, s.port).done;
    assert.equal(a.body, 'ok');
    assert.equal(a.reused, false);
    assert.equal(s.accepted(), 2);
  });

  test('idle connections are dropped after idleMs, and sooner when the provider\'s Keep-Alive hint says so', async () => {
    const s = await server((_req, res) => res.end('ok'));
    servers.push(s);
    const p = pool(s.port, { idleMs: 60 });
    await call(p, s.port).done;
    assert.equal(p.size.idle, 1);
    await until(() => p.size.open === 0); // the sweep closes it
    const a = await call(p, s.port).done;
    assert.equal(a.reused, false);

    // Node's server announces `Keep-Alive: timeout=1`: less the 1 s margin, nothing is kept.
    const short = await server((_req, res) => res.end('ok'), 1000);
    servers.push(short);
    const q = pool(short.port);
    await call(q, short.port).done;
    await call(q, short.port).done;
    assert.equal(short.accepted(), 2);
    await until(() => q.size.open === 0);
  });

  test('a refused connection fails the call and frees its slot', async () => {
    const s = await server((_req, res) => res.end('ok'));
    const port = s.port;
    await s.close();
    const p = pool(port, { maxSockets: 1 });
    await assert.rejects(call(p, port).done, /ECONNREFUSED/);
    await until(() => p.size.open === 0);
    await assert.rejects(call(p, port).done, /ECONNREFUSED/); // the slot came back
  });

  test('an error on an idle connection closes it quietly', async () => {
    const s = await server((_req, res) => res.end('ok'));
    servers.push(s);
    const p = pool(s.port);
    let socket: Socket | undefined;
    const req = request({ method: 'GET', hostname: '127.0.0.1', port: s.port, path: '/', agent: p as unknown as Agent }, (res) => res.resume());
    req.on('socket', (sock: Socket) => { socket = sock; });
    req.end();
    await until(() => p.size.idle === 1);
    socket!.destroy(new Error('boom')); // would crash the process without a listener
    await until(() => p.size.open === 0);
    assert.equal(p.size.idle, 0);
  });
});
