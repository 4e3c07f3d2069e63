import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { after, before, test } from 'node:test';
import { chatBody, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a pipelined request's answer waits behind the one before it with no socket
 * of its own, and Node never emits its 'close' when the connection dies meanwhile. Its
 * concurrency slot, its Idempotency-Key and the gateway's in-flight count were held until
 * restart (twice on a plan of concurrency 2: every later call 429). The connection's close now
 * releases it.
 */
let gw: Running;
before(async () => {
  gw = await startGateway(testConfig());
});
after(() => gw.close());

function rawRequest(model: string, idempotencyKey: string): string {
  const body = JSON.stringify(chatBody(model));
  return `POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-alice\r\nContent-Type: application/json\r\n` +
    `Idempotency-Key: ${idempotencyKey}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

test('regression: a pipelined call whose connection dies while it waits is released (slot, Idempotency-Key, in-flight count)', async () => {
  const port = new URL(gw.url).port;
  const socket = connect(Number(port), '127.0.0.1');
  await new Promise<void>((resolve) => socket.once('connect', resolve));
  socket.on('error', () => {});
  // The first waits 300 ms for its provider; the second is answered at once, behind it.
  socket.write(rawRequest('slow-1', 'first') + rawRequest('echo-1', 'second'));
  await until(() => gw.gateway.inFlight === 2, 2000, 'both calls admitted');
  socket.destroy();
  await until(() => gw.gateway.inFlight === 0, 2000, 'every call released');
  const account = gw.gateway.directory.accounts.get('acct_alice')!;
  assert.equal((await gw.gateway.limiter.snapshot(account)).inFlight, 0);
  const again = await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', chatBody('echo-1'), { 'idempotency-key': 'second' });
  assert.equal(again.status, 200, 'the Idempotency-Key is free again');
  await again.text();
});

test('regression: many pipelined calls waiting on one connection share one close listener (found in review: Node warned of a listener leak past ten)', async () => {
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.name);
  process.on('warning', onWarning);
  try {
    const port = new URL(gw.url).port;
    const socket = connect(Number(port), '127.0.0.1');
    await new Promise<void>((resolve) => socket.once('connect', resolve));
    socket.on('error', () => {});
    let text = rawRequest('slow-1', 'w0');
    for (let i = 1; i < 15; i++) text += rawRequest('echo-1', `w${i}`);
    socket.write(text);
    await until(() => gw.gateway.inFlight === 15, 2000, 'all admitted');
    socket.destroy();
    await until(() => gw.gateway.inFlight === 0, 2000, 'every call released');
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(warnings.filter((w) => w === 'MaxListenersExceededWarning'), []);
  } finally {
    process.off('warning', onWarning);
  }
});

test('regression: a release that throws (a bug) still ends its call, and the calls queued after it on the dying connection are released (the loop stopped at it, and the drain waited for ever)', async () => {
  const limiter = gw.gateway.limiter;
  const release = limiter.release.bind(limiter);
  let thrown = 0;
  limiter.release = (t) => {
    if (thrown++ === 0) throw new Error('a bug in release');
    release(t);
  };
  try {
    const port = new URL(gw.url).port;
    const socket = connect(Number(port), '127.0.0.1');
    await new Promise<void>((resolve) => socket.once('connect', resolve));
    socket.on('error', () => {});
    socket.write(rawRequest('slow-1', 't0') + rawRequest('echo-1', 't1') + rawRequest('echo-1', 't2'));
    await until(() => gw.gateway.inFlight === 3, 2000, 'all admitted');
    socket.destroy();
    await until(() => gw.gateway.inFlight === 0, 2000, 'every call over');
    assert.equal(thrown, 3, 'every release tried');
    await until(() => gw.logs.some((line) => line.includes('internal error releasing a call')), 2000, 'the fault logged');
  } finally {
    limiter.release = release;
  }
});

test('regression: a pipelined usage read whose connection dies while it waits gives back its slot and Idempotency-Key (found in review: held for good)', async () => {
  const port = new URL(gw.url).port;
  const socket = connect(Number(port), '127.0.0.1');
  await new Promise<void>((resolve) => socket.once('connect', resolve));
  socket.on('error', () => {});
  const account = gw.gateway.directory.accounts.get('acct_alice')!;
  const before = (await gw.gateway.limiter.snapshot(account)).inFlight; // (the throwing release above kept one)
  socket.write(`${rawRequest('slow-1', 'r0')}GET /v1/usage HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-alice\r\nIdempotency-Key: u1\r\n\r\n`);
  await until(async () => (await gw.gateway.limiter.snapshot(account)).inFlight === before + 2, 2000, 'both admitted');
  socket.destroy();
  await until(async () => (await gw.gateway.limiter.snapshot(account)).inFlight === before, 2000, 'both given back');
  const again = await fetch(`${gw.url}/v1/usage`, { headers: { authorization: 'Bearer sk-alice', 'idempotency-key': 'u1' } });
  assert.equal(again.status, 200, 'the Idempotency-Key is free again');
  await again.text();
});

