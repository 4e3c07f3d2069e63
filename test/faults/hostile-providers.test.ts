import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { MAX_ANSWER_BYTES, MAX_EVENT_CHARS, MAX_PARSED_ANSWER_BYTES } from '../../src/providers/http.js';
import { FakeUpstream, json } from '../helpers/fake-upstream.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Providers having a bad day: one endless stream line, an endless answer, headers then
 * silence, an answer in an encoding nobody asked for, a redirect. After each: the client gets
 * an error or a cut (never a hang), the call is charged by CONTRACT section 7 (the provider
 * had the request), its slot is back, memory is bounded, and the gateway serves the next call.
 */

const last = (gw: Running): LedgerEntry | undefined => entriesOf(gw, 'acct_p').at(-1);

/** The call fails for the client: an error answer (before the first event: nothing was sent), or a body cut short. */
async function cutShort(answer: Promise<Response>): Promise<void> {
  const res = await answer;
  if (res.status === 502) {
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'upstream_error');
    return;
  }
  assert.equal(res.status, 200);
  await assert.rejects(res.text(), 'the stream is cut, not ended');
}

describe('fault: hostile providers', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 100_000, concurrency: 1 } },
      accounts: { acct_p: { plan: 'p' } },
      keys: { key_p: { account: 'acct_p', key: 'sk-p' } },
      models: { bad: { provider: 'up', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
      providers: { up: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 800, streamIdleTimeoutMs: 400 } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
  });

  /** The next ordinary call works (the slot came back: concurrency is 1). */
  async function stillServes(): Promise<void> {
    await until(() => gw.gateway.inFlight === 0, 5000, 'the slot back');
    up.queue.push((_req, res) => json(res, 200, { id: 'ok', choices: [], usage: { prompt_tokens: 1, completion_tokens: 1 } }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 200);
    await res.text();
    assert.equal((await fetch(`${gw.url}/healthz`)).status, 200);
  }

  test('one endless stream line (200 MB, slowly) is cut at the event bound; memory stays bounded', async () => {
    const before = process.memoryUsage();
    let sent = 0;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"');
      const piece = 'x'.repeat(256 * 1024);
      const more = () => {
        if (res.destroyed || sent > 200 * 1024 * 1024) return res.end();
        sent += piece.length;
        if (res.write(piece)) setImmediate(more);
        else res.once('drain', more);
      };
      more();
    });
    await cutShort(postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad', 'hi', { stream: true })));
    const grown = process.memoryUsage().heapUsed + process.memoryUsage().external - before.heapUsed - before.external;
    assert.ok(sent < 64 * 1024 * 1024, `the provider was stopped after ${sent} bytes (bound ${MAX_EVENT_CHARS} characters)`);
    assert.ok(grown < 200 * 1024 * 1024, `memory grew ${grown} bytes`);
    await until(() => last(gw)?.estimated === true, 5000, 'charged as an abnormal end');
    await stillServes();
  });

  test('an endless non-streamed answer is 502 at the answer bound, charged an estimate', async () => {
    let sent = 0;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const piece = Buffer.alloc(1024 * 1024, 0x20);
      const more = () => {
        if (res.destroyed) return;
        sent += piece.length;
        if (res.write(piece)) setImmediate(more);
        else res.once('drain', more);
      };
      more();
    });
    const count = entriesOf(gw, 'acct_p').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 502);
    await res.text();
    assert.ok(sent <= MAX_ANSWER_BYTES + 32 * 1024 * 1024, `read ${sent} bytes`);
    assert.equal(entriesOf(gw, 'acct_p').length, count + 1);
    assert.equal(last(gw)!.estimated, true);
    await stillServes();
  });

  test('an answer over the parse bound with no usage (9 MB of `{}`s, about 200 MB of heap once parsed) is relayed unparsed, charged an estimate from its length, at most the model output limit (found in review)', async () => {
    const body = `{"id":"x","choices":[${'{},'.repeat(3 * 1024 * 1024)}{}]}`;
    assert.ok(body.length > MAX_PARSED_ANSWER_BYTES);
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body);
    });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 200);
    assert.equal((await res.text()).length, body.length, 'relayed whole');
    const charge = last(gw)!;
    assert.equal(charge.estimated, true);
    // Its output counted as its length, up to the model's output limit (128,000 by default):
    // no provider bills more.
    assert.equal(charge.outputTokens, Math.min(Math.ceil(body.length / 4), 128_000));
    await stillServes();
  });

  test('a provider answering 101 Switching Protocols fails the call at once, not at its timeout (found in review: without a listener, Node closes such a request and says nothing else)', async () => {
    const switching = (_req: unknown, res: import('node:http').ServerResponse) => {
      res.socket!.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: evil\r\n\r\n');
    };
    for (let i = 0; i < 4; i++) up.queue.push(switching); // each attempt, should the call be retried
    const count = entriesOf(gw, 'acct_p').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 502, 'not the 504 of the timeout');
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /switched protocols \(101\)/);
    assert.equal(entriesOf(gw, 'acct_p').length, count, 'free: the provider gave no answer');
    up.queue.length = 0;
    await stillServes();
  });

  test('stream headers, then silence: cut after streamIdleTimeoutMs, charged an estimate', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
    });
    const started = Date.now();
    await cutShort(postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad', 'hi', { stream: true })));
    assert.ok(Date.now() - started < 3000);
    assert.equal(last(gw)!.estimated, true);
    await stillServes();
  });

  test('after its final event the provider keeps the connection open: the client is served, and the upstream is let go after streamIdleTimeoutMs', async () => {
    let upstreamClosed = false;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: 'stop' }], usage: null })}\n\n`);
      res.write(`data: ${JSON.stringify({ id: 'c', choices: [], usage: { prompt_tokens: 1, completion_tokens: 1 } })}\n\ndata: [DONE]\n\n`);
      const trickle = setInterval(() => res.write(': still here\n\n'), 100); // never ends on its own
      res.on('close', () => {
        upstreamClosed = true;
        clearInterval(trickle);
      });
    });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad', 'hi', { stream: true }));
    assert.ok((await res.text()).endsWith('data: [DONE]\n\n'));
    assert.equal(last(gw)!.estimated, false);
    await until(() => upstreamClosed, 3000, 'the gateway closed the upstream connection');
    await stillServes();
  });

  test('an error answer retried whose body never ends: the next attempt answers, and the connection left behind is let go', async () => {
    let firstClosed = false;
    up.queue.push((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/json', 'content-length': '1000' });
      res.write('{'); // and nothing more, for ever
      res.on('close', () => (firstClosed = true));
    });
    up.queue.push((_req, res) => json(res, 200, { id: 'ok', choices: [], usage: { prompt_tokens: 1, completion_tokens: 1 } }));
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 200);
    await res.text();
    await until(() => firstClosed, 3000, 'the gateway let the first connection go');
    await stillServes();
  });

  test('a Retry-After past reason (1e23 seconds, or 400 digits) reaches the client as at most an hour', async () => {
    for (const wait of ['99999999999999999999999', '9'.repeat(400)]) {
      up.queue.push((_req, res) => json(res, 429, { error: { message: 'slow down' } }, { 'retry-after': wait }));
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), '3600');
      await res.text();
    }
    await stillServes();
  });

  test('an answer in an encoding the gateway did not ask for (garbage gzip) is 502, charged an estimate', async () => {
    up.queue.push((_req, res) => {
      const body = Buffer.concat([gzipSync('{"usage":{"prompt_tokens":1}}').subarray(0, 10), Buffer.from('garbage')]);
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': body.length });
      res.end(body);
    });
    const count = entriesOf(gw, 'acct_p').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 502);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /encoding it was not asked for \(gzip\)/);
    assert.equal(entriesOf(gw, 'acct_p').length, count + 1);
    await stillServes();
  });

  test('a redirect is not followed: 502, free (the provider did not take the call)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(302, { location: 'http://127.0.0.1:1/elsewhere' });
      res.end();
    });
    const hits = up.hits;
    const count = entriesOf(gw, 'acct_p').length;
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-p', chatBody('bad'));
    assert.equal(res.status, 502);
    await res.text();
    assert.equal(up.hits, hits + 1, 'one request, no follow');
    assert.equal(entriesOf(gw, 'acct_p').length, count);
    await stillServes();
  });
});
