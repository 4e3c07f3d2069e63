import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { accessLog, entriesOf, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Clients that try to hold the gateway: headers trickled a byte at a time (slowloris), more
 * connections than it should hold, a request without Host, an Expect it does not support, and
 * a client that never reads its answer. Each is answered in the envelope, or cut, within its
 * stated bound; ordinary clients stay fast meanwhile; nothing is held afterwards.
 */

function open(url: string): Promise<Socket> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => resolve(socket));
    socket.on('error', reject);
  });
}

/** Everything a raw connection receives until it closes (or `ms` pass). */
function received(socket: Socket, ms = 5000): Promise<{ text: string; closedAt: number }> {
  return new Promise((resolve) => {
    let text = '';
    socket.on('data', (d: Buffer) => { text += d.toString('latin1'); });
    const done = () => resolve({ text, closedAt: performance.now() });
    socket.on('close', done);
    setTimeout(() => { socket.destroy(); }, ms).unref();
  });
}

describe('fault: hostile clients', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, maxBodyBytes: 65_536, requestTimeoutMs: 1500, headersTimeoutMs: 1000, clientIdleTimeoutMs: 500, maxConnections: 400 },
      plans: { p: { rpm: 100_000, concurrency: 1 } },
      accounts: { acct_h: { plan: 'p' } },
      keys: { key_h: { account: 'acct_h', key: 'sk-h' } },
      models: { big: { provider: 'up', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
      providers: { up: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 5000 } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  test('slowloris: 300 connections trickling their headers get 408 in the envelope within the timeouts; others stay fast', async () => {
    const started = performance.now();
    const sockets = await Promise.all(Array.from({ length: 300 }, () => open(gw.url)));
    const ends = sockets.map((s) => received(s));
    const header = 'GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ';
    let i = 0;
    const trickle = setInterval(() => {
      for (const s of sockets) if (!s.destroyed) s.write(header[Math.min(i, header.length - 1)]!);
      i++;
    }, 200);
    try {
      const latencies: number[] = [];
      for (let n = 0; n < 40; n++) {
        const t = performance.now();
        const res = await fetch(`${gw.url}/healthz`);
        await res.text();
        latencies.push(performance.now() - t);
      }
      const results = await Promise.all(ends);
      for (const r of results) {
        assert.match(r.text, /^HTTP\/1\.1 408 /);
        assert.match(r.text, /"code":"request_timeout"/);
        assert.match(r.text, /x-request-id: req_/);
        assert.ok(r.closedAt - started < 3500, `closed after ${Math.round(r.closedAt - started)} ms (timeouts 1000 / 1500 ms)`);
      }
      latencies.sort((a, b) => a - b);
      assert.ok(latencies.at(-1)! < 500, `an ordinary client waited ${Math.round(latencies.at(-1)!)} ms`);
    } finally {
      clearInterval(trickle);
      for (const s of sockets) s.destroy();
    }
  });

  test('a client that never closes its side after its 408 or 400 loses the connection within a second (found in review: it was held for ever)', async () => {
    const connections = () => new Promise<number>((resolve) => gw.server.getConnections((_e, n) => resolve(n)));
    gw.server.closeIdleConnections(); // the keep-alive connections of the tests before
    await until(async () => (await connections()) === 0, 3000, 'no connection left from before');
    const before = 0;
    for (const request of ['GET /v1/models HTTP/1.1\r\nHost: x\r\n', 'GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n']) {
      const { hostname, port } = new URL(gw.url);
      // allowHalfOpen: the client's side stays open after the gateway's FIN, as a hostile client's would.
      const socket = await new Promise<Socket>((resolve, reject) => {
        const s = connect({ port: Number(port), host: hostname, allowHalfOpen: true }, () => resolve(s));
        s.on('error', () => {});
        s.once('connect', () => resolve(s));
        s.once('error', reject);
      });
      let text = '';
      socket.on('data', (d: Buffer) => { text += d.toString('latin1'); });
      try {
        socket.write(request);
        // The 408 comes after headersTimeoutMs (1 s, checked every 0.5 s).
        await until(() => /^HTTP\/1\.1 (408|400) /.test(text), 3000, 'the answer');
        await until(async () => (await connections()) <= before, 2000, 'the connection let go while the client keeps its side open');
      } finally {
        socket.destroy();
      }
    }
  });

  test('a malformed request pipelined after a streamed answer is not answered inside it: the connection is cut', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, delta: { content: 'a' }, finish_reason: null }] })}\n\n`);
      setTimeout(() => res.end(`data: ${JSON.stringify({ id: 'c', choices: [], usage: { prompt_tokens: 1, completion_tokens: 1 } })}\n\ndata: [DONE]\n\n`), 300);
    });
    const socket = await open(gw.url);
    const end = received(socket);
    const body = JSON.stringify({ model: 'big', stream: true, messages: [{ role: 'user', content: 'x' }] });
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-h\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    await new Promise((r) => setTimeout(r, 100));
    socket.write('GET / HTTP/1.1\r\nBad Header\r\n\r\n');
    const { text } = await end;
    assert.match(text, /^HTTP\/1\.1 200 /);
    assert.doesNotMatch(text, /HTTP\/1\.1 400/, 'no second answer inside the stream');
    await until(() => gw.gateway.inFlight === 0, 3000, 'the slot back');
  });

  test('maxConnections: connections beyond it are closed as they arrive; those held keep working', async () => {
    const held = await Promise.all(Array.from({ length: 400 }, () => open(gw.url)));
    const counted = () => new Promise<number>((resolve) => gw.server.getConnections((_err, n) => resolve(n)));
    try {
      await until(async () => (await counted()) >= 400, 3000, 'the server holding 400 connections');
      // The next one is closed as it arrives (or refused): its request is never answered.
      const extra = await open(gw.url).catch(() => null);
      if (extra !== null) {
        const r = received(extra, 2000);
        extra.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n', () => {});
        assert.equal((await r).text, '', 'closed without an answer');
      }
      held[0]!.write('GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
      assert.match((await received(held[0]!)).text, /^HTTP\/1\.1 200 /);
    } finally {
      for (const s of held) s.destroy();
    }
    await until(async () => (await fetch(`${gw.url}/healthz`)).status === 200, 3000, 'accepting again');
  });

  test('HTTP/1.1 without Host is 400, two Host headers are 400, headers over Node\'s limit are 431, an Expect other than 100-continue is 417: all the gateway\'s own answers; the absolute form is served (found in review: 400 for all, two Hosts served, absolute form 404)', async () => {
    for (const [raw, status, code] of [
      ['GET /healthz HTTP/1.1\r\n\r\n', 400, 'invalid_request'],
      ['GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n', 400, 'invalid_request'],
      [`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 431, 'headers_too_large'],
      ['GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n', 417, 'expectation_failed'],
      ['GET http://gateway.example:8080/v1/models?x=1 HTTP/1.1\r\nHost: gateway.example:8080\r\nAuthorization: Bearer sk-h\r\nConnection: close\r\n\r\n', 200, null],
    ] as const) {
      const s = await open(gw.url);
      const answer = received(s);
      s.write(raw);
      const { text } = await answer;
      assert.match(text, new RegExp(`^HTTP/1\\.1 ${status} `));
      assert.match(text, /x-request-id: req_/);
      if (code === null) {
        assert.match(text, /"id":"big"/, 'the model list');
        continue;
      }
      assert.match(text, new RegExp(`"code":"${code}"`));
      assert.match(text, /"type":"error"/);
      // Logged and counted like any request, under its request id (found in review: Node's
      // rejections, answered from the server's clientError, were in neither).
      const id = /x-request-id: (req_\w+)/.exec(text)![1];
      await until(() => accessLog(gw).some((l) => l.request_id === id && l.status === status), 2000, `the log line of ${id}`);
    }
    const metrics = await (await fetch(`${gw.url}/metrics`)).text();
    assert.match(metrics, /mg_requests_total\{route="unmatched",status="431"\} 1/);
  });

  test('a request that times out reading its body is logged once, by its own handler (found in review: also as its 408, under another id)', async () => {
    const posts = () => accessLog(gw).filter((l) => l.path === '/v1/chat/completions' && l.status !== 200);
    const before = posts().length;
    const s = await open(gw.url);
    const answer = received(s);
    s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-h\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"');
    const { text } = await answer; // requestTimeoutMs (1.5 s), checked every 0.5 s
    assert.match(text, /^HTTP\/1\.1 408 /);
    const id = /x-request-id: (req_\w+)/.exec(text)![1];
    // Its own line (the 408 was answered, and would have been logged, before it).
    await until(() => posts().length > before, 3000, 'its line');
    assert.equal(accessLog(gw).filter((l) => l.request_id === id).length, 0, 'not a second line for the 408');
  });

  test('a client that reads a large answer slowly but steadily is not cut (found in review)', async () => {
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('y'.repeat(6_000_000))));
    const s = await open(gw.url);
    const body = JSON.stringify({ model: 'big', messages: [{ role: 'user', content: 'hi' }] });
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-h\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
    // About 256 KB every 100 ms: some 2.5 s for the answer, five times clientIdleTimeoutMs (500 ms).
    let got = 0;
    let budget = 0;
    const done = new Promise<void>((resolve) => s.on('close', resolve));
    s.on('data', (chunk: Buffer) => {
      got += chunk.length;
      budget -= chunk.length;
      if (budget <= 0) s.pause();
    });
    s.pause();
    const reader = setInterval(() => {
      budget = 256 * 1024;
      s.resume();
    }, 100);
    await done;
    clearInterval(reader);
    assert.ok(got > 6_000_000, `received ${got} bytes: the whole answer`);
  });

  test('a client that never reads a non-streamed answer is cut after clientIdleTimeoutMs; its slot returns', async () => {
    // 8 MB: more than the socket buffers between the gateway and the client hold.
    up.queue.push((_req, res) => json(res, 200, openaiCompletion('x'.repeat(8_000_000))));
    const s = await open(gw.url);
    const body = JSON.stringify({ model: 'big', messages: [{ role: 'user', content: 'hi' }] });
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-h\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    s.pause(); // and never read
    const before = entriesOf(gw, 'acct_h').length;
    try {
      await until(() => entriesOf(gw, 'acct_h').length === before + 1, 5000, 'the charge');
      await until(() => gw.gateway.inFlight === 0, 5000, 'the idle reader cut, its slot back');
      assert.equal(entriesOf(gw, 'acct_h').at(-1)!.estimated, false, 'the provider\'s usage was known: charged exactly');
      // Concurrency 1: the next call is admitted.
      up.queue.push((_req, res) => json(res, 200, openaiCompletion('ok')));
      const next = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: 'Bearer sk-h', 'content-type': 'application/json' }, body });
      assert.equal(next.status, 200);
      await next.text();
    } finally {
      s.destroy();
    }
  });
});

describe('fault: a client that never reads answers that are not billed calls', () => {
  let gw: Running;
  before(async () => {
    // 1,000 models: a list of about 100 KB.
    const models = Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`model-${i}`, { provider: 'mock' }]));
    gw = await startGateway(testConfig({
      server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 1500, headersTimeoutMs: 1000, clientIdleTimeoutMs: 500 },
      plans: { p: { rpm: 100_000 } },
      accounts: { acct_r: { plan: 'p' } },
      keys: { key_r: { account: 'acct_r', key: 'sk-r' } },
      models,
      providers: { mock: { protocol: 'mock' } },
    }));
  });
  after(() => gw.close());

  test('100 model lists asked for at once (pipelined, whole requests) and never read: the connection is cut after twice clientIdleTimeoutMs (found in review: it was held for ever)', async () => {
    const connections = () => new Promise<number>((resolve, reject) => gw.server.getConnections((err, n) => (err ? reject(err) : resolve(n))));
    const idle = await connections();
    const s = await open(gw.url);
    s.pause(); // never reads
    // About 10 MB of answers, more than the socket buffers hold; the requests are whole, so no
    // request timeout applies to them.
    s.write('GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-r\r\n\r\n'.repeat(100));
    try {
      await until(async () => (await connections()) === idle + 1, 2000, 'the connection open');
      const start = performance.now();
      await until(async () => (await connections()) === idle, 5000, 'the stalled connection cut');
      assert.ok(performance.now() - start >= 900, 'not before its client was idle for twice clientIdleTimeoutMs (500 ms)');
      await until(() => gw.logs.some((l) => l.includes('cut connections whose clients read nothing')), 2000, 'the cut logged');
      const ok = await fetch(`${gw.url}/v1/models`, { headers: { authorization: 'Bearer sk-r' } });
      assert.equal(ok.status, 200, 'others are served');
      await ok.text();
    } finally {
      s.destroy();
    }
  });
});
