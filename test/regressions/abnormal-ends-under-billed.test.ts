import assert from 'node:assert/strict';
import { request, type IncomingMessage } from 'node:http';
import { createServer } from 'node:net';
import { after, before, beforeEach, describe, test } from 'node:test';
import type { LedgerEntry } from '../../src/ledger/types.js';
import { estimateInputTokens } from '../../src/billing/estimate.js';
import { anthropicStream, FakeUpstream, json } from '../helpers/fake-upstream.js';
import { entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found: calls that ended abnormally were billed below what the provider bills:
 * - a cut or unfinished Anthropic stream was charged message_start's partial usage
 *   (output_tokens: 1) as final, not marked estimated;
 * - a client that left mid-answer was charged a text-only estimate, even when the provider had
 *   already reported the real input;
 * - a client that did not read paused the provider (backpressure), and the stream-idle timer
 *   took that pause for provider silence: the stream was cut and charged the partial usage;
 * - a provider timeout after it had the request, or an unreadable answer, was charged 0.
 * CONTRACT section 7: the larger of the reported usage and the estimate, marked estimated;
 * only a call the provider refused is free.
 */

const PRICE = { inputPerMillion: 1, outputPerMillion: 2 };
const body = (text = 'hi', extra: Record<string, unknown> = {}) => ({ model: 'claude-x', max_tokens: 100, messages: [{ role: 'user', content: text }], ...extra });

describe('regression: abnormal ends were under-billed', () => {
  const up = new FakeUpstream();
  let gw: Running;
  let patient: Running; // clients get 5 s to read
  let impatient: Running; // clients get 500 ms
  let closedPort = 0;

  const config = (clientIdleTimeoutMs: number, base: string) => testConfig({
    server: { host: '127.0.0.1', port: 0, maxBodyBytes: 65_536, clientIdleTimeoutMs },
    plans: { p: { rpm: 10_000, concurrency: 5 } },
    accounts: { acct_a: { plan: 'p' } },
    keys: { key_a: { account: 'acct_a', key: 'sk-a' } },
    models: {
      'claude-x': { provider: 'ant', price: PRICE },
      'claude-gone': { provider: 'gone', price: PRICE },
      'gpt-run': { provider: 'oai', price: PRICE },
    },
    providers: {
      ant: { protocol: 'anthropic', baseUrl: base, timeoutMs: 500, streamIdleTimeoutMs: 300 },
      gone: { protocol: 'anthropic', baseUrl: `http://127.0.0.1:${closedPort}`, timeoutMs: 500 },
      oai: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 500, streamIdleTimeoutMs: 300 },
    },
  });

  before(async () => {
    const base = await up.start();
    closedPort = await new Promise<number>((resolve) => {
      const s = createServer().listen(0, '127.0.0.1', () => {
        const port = (s.address() as { port: number }).port;
        s.close(() => resolve(port));
      });
    });
    patient = await startGateway(config(5000, base));
    impatient = await startGateway(config(500, base));
    gw = patient;
  });
  after(async () => {
    await patient?.close();
    await impatient?.close();
    await up.close();
  });
  beforeEach(() => {
    up.queue.length = 0;
    up.fallback = (_req, res) => json(res, 500, { error: { message: 'no behaviour queued' } });
  });

  const last = (g: Running = gw): LedgerEntry => entriesOf(g, 'acct_a').at(-1)!;
  const count = (g: Running = gw) => entriesOf(g, 'acct_a').length;

  test('a stream cut after message_start is charged at least the reported input, and marked estimated', async () => {
    up.queue.push(anthropicStream(['aaaa', 'bbbb'], { input: 5000, output: 40 }, { cutAfter: 4, delayMs: 20 }));
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-a', body('hi', { stream: true }));
    await assert.rejects(res.text());
    const charge = last();
    assert.equal(charge.estimated, true, 'partial usage is never recorded as final');
    assert.equal(charge.inputTokens, 5000);
    assert.equal(charge.outputTokens, 2, 'the 8 characters relayed, not message_start\'s 1');
  });

  test('a client that leaves after message_start is charged the reported input, not a text estimate', async () => {
    up.queue.push(anthropicStream(Array.from({ length: 40 }, () => 'zzzz'), { input: 9000, output: 40 }, { delayMs: 30 }));
    await new Promise<void>((resolve, reject) => {
      const req = request(`${gw.url}/v1/messages`, { method: 'POST', headers: { authorization: 'Bearer sk-a', 'content-type': 'application/json' } }, (res) => {
        res.on('data', (chunk: Buffer) => {
          if (chunk.toString().includes('zzzz')) req.destroy();
        });
      });
      req.on('error', () => {});
      req.on('close', () => resolve());
      req.end(JSON.stringify(body('hi', { stream: true })));
      setTimeout(() => reject(new Error('no stream')), 5000).unref();
    });
    await until(() => gw.gateway.inFlight === 0, 5000, 'the slot back');
    const charge = last();
    assert.equal(charge.estimated, true);
    assert.equal(charge.inputTokens, 9000);
    assert.ok(charge.outputTokens >= 1, `output ${charge.outputTokens}`);
  });

  test('a client that pauses reading (backpressure) is not provider silence: the stream completes and is charged its final usage', async () => {
    // About 16 MB of events: more than the socket buffers between the gateway and the client hold.
    const pieces = Array.from({ length: 4000 }, () => 'p'.repeat(4000));
    up.queue.push(anthropicStream(pieces, { input: 12, output: 100_000 }));
    const text = await new Promise<string>((resolve, reject) => {
      const req = request(`${gw.url}/v1/messages`, { method: 'POST', headers: { authorization: 'Bearer sk-a', 'content-type': 'application/json' } }, (res: IncomingMessage) => {
        res.pause();
        // Paused five times longer than the provider's stream-idle timeout (300 ms).
        setTimeout(() => {
          let seen = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => { seen = (seen + chunk).slice(-2000); });
          res.on('end', () => resolve(seen));
          res.on('error', reject);
          res.resume();
        }, 1500);
      });
      req.on('error', reject);
      req.end(JSON.stringify(body('hi', { stream: true, max_tokens: 4_000_000 / 1000 })));
    }).catch((err: Error) => `failed: ${err.message}`);
    assert.ok(text.includes('message_stop'), `the stream ended whole: ${text.slice(-200)}`);
    const charge = last();
    assert.equal(charge.estimated, false);
    assert.equal(charge.outputTokens, 100_000);
  });

  test('a client that reads nothing for clientIdleTimeoutMs is cut, charged an estimate, and its slot returns', async () => {
    const pieces = Array.from({ length: 4000 }, () => 'q'.repeat(4000));
    up.queue.push(anthropicStream(pieces, { input: 12, output: 100_000 }));
    const before = count(impatient);
    const req = request(`${impatient.url}/v1/messages`, { method: 'POST', headers: { authorization: 'Bearer sk-a', 'content-type': 'application/json' } }, (res) => {
      res.pause(); // and never read
      res.on('error', () => {});
    });
    req.on('error', () => {});
    req.end(JSON.stringify(body('hi', { stream: true })));
    try {
      await until(() => count(impatient) === before + 1 && impatient.gateway.inFlight === 0, 5000, 'the idle client cut');
      const charge = last(impatient);
      assert.equal(charge.estimated, true);
      assert.equal(charge.inputTokens, 12, 'message_start\'s input is above the estimate of "hi"');
      assert.ok(charge.outputTokens > 0);
      impatient.gateway.logger.flush();
      assert.ok(impatient.logs.some((l) => l.includes('read nothing for 500 ms')), 'the cut is logged with its reason');
    } finally {
      req.destroy();
    }
  });

  test('a provider that had the request and timed out is charged an estimate; refusals are free', async () => {
    up.queue.push(() => { /* had the request; never answers */ });
    const before = count();
    const timedOut = await postJson(`${gw.url}/v1/messages`, 'sk-a', body('x'.repeat(400)));
    assert.equal(timedOut.status, 504);
    await timedOut.text();
    assert.equal(count(), before + 1);
    assert.equal(last().estimated, true);
    assert.equal(last().inputTokens, estimateInputTokens(body('x'.repeat(400))));

    // Refused: an error status, or no connection at all. Nothing to bill.
    up.queue.push((_req, res) => json(res, 400, { type: 'error', error: { type: 'invalid_request_error', message: 'bad' } }));
    const refused = await postJson(`${gw.url}/v1/messages`, 'sk-a', body());
    assert.equal(refused.status, 400);
    await refused.text();
    const unreachable = await postJson(`${gw.url}/v1/messages`, 'sk-a', body('hi', { model: 'claude-gone' }));
    assert.equal(unreachable.status, 502);
    await unreachable.text();
    assert.equal(count(), before + 1);
  });

  test('an unreadable answer is charged an estimate (the provider billed it)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"id": "msg_1", "content": [ this is not json');
    });
    const before = count();
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-a', body());
    assert.equal(res.status, 502);
    await res.text();
    assert.equal(count(), before + 1);
    assert.equal(last().estimated, true);
  });

  test('running usage in every chunk (a compatible server) is not final when the stream breaks off', async () => {
    // Found in review: an OpenAI-protocol stream's last seen usage was taken as final, though
    // servers with continuous usage stats send a running count in every chunk.
    const running = (n: number) => `data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, delta: { content: 'word' } }], usage: { prompt_tokens: 3, completion_tokens: n, total_tokens: 3 + n } })}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(running(1) + running(2));
      setTimeout(() => res.socket?.destroy(), 30); // no usage chunk, no [DONE]
    });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-run', stream: true, messages: [{ role: 'user', content: 'x'.repeat(400) }] });
    await assert.rejects(res.text());
    const charge = last();
    assert.equal(charge.estimated, true, 'a running count is not the final usage');
    assert.equal(charge.inputTokens, estimateInputTokens({ messages: [{ role: 'user', content: 'x'.repeat(400) }] }), 'the larger of the reported 3 and the estimate');
  });

  test('usage a provider reports past any real count is not believed: an estimate is charged instead', async () => {
    up.queue.push((_req, res) => json(res, 200, {
      id: 'msg_1', type: 'message', role: 'assistant', model: 'x', content: [{ type: 'text', text: 'abcdabcd' }],
      stop_reason: 'end_turn', usage: { input_tokens: 1e300, output_tokens: 2 },
    }));
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-a', body());
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(last().estimated, true);
    assert.equal(last().inputTokens, estimateInputTokens(body()));
    assert.equal(last().outputTokens, 2, 'the answer\'s 8 characters of text');
  });

  test('usage without its output count is not believed (it would charge the output as 0, or message_start\'s 1): an estimate of what was relayed', async () => {
    const text = 'y'.repeat(4000); // 1,000 tokens at 4 characters a token
    // A chat completion, whole, and streamed with a usage chunk that has no completion_tokens.
    up.queue.push((_req, res) => json(res, 200, {
      id: 'c', object: 'chat.completion', created: 1, model: 'x',
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }], usage: { prompt_tokens: 10 },
    }));
    let res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-run', messages: [{ role: 'user', content: 'x' }] });
    assert.equal(res.status, 200);
    await res.text();
    assert.equal(last().estimated, true);
    assert.equal(last().outputTokens, 1000);
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, delta: { content: text }, finish_reason: 'stop' }] })}\n\n` +
        `data: ${JSON.stringify({ id: 'c', choices: [], usage: { prompt_tokens: 10 } })}\n\ndata: [DONE]\n\n`);
    });
    let charges = entriesOf(gw, 'acct_a').length;
    res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-run', stream: true, messages: [{ role: 'user', content: 'x' }] });
    assert.ok((await res.text()).endsWith('data: [DONE]\n\n'));
    await until(() => entriesOf(gw, 'acct_a').length === charges + 1, 2000, 'charged');
    assert.equal(last().estimated, true);
    assert.equal(last().outputTokens, 1000);
    // An Anthropic stream whose message_delta carries no output_tokens.
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const events: Array<[string, unknown]> = [
        ['message_start', { type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', content: [], model: 'x', usage: { input_tokens: 10, output_tokens: 1 } } }],
        ['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }],
        ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } }],
        ['content_block_stop', { type: 'content_block_stop', index: 0 }],
        ['message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: {} }],
        ['message_stop', { type: 'message_stop' }],
      ];
      res.end(events.map(([type, data]) => `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`).join(''));
    });
    charges = entriesOf(gw, 'acct_a').length;
    res = await postJson(`${gw.url}/v1/messages`, 'sk-a', body('x', { stream: true }));
    assert.ok((await res.text()).includes('message_stop'));
    await until(() => entriesOf(gw, 'acct_a').length === charges + 1, 2000, 'charged');
    assert.equal(last().estimated, true);
    assert.equal(last().outputTokens, 1000);
    assert.equal(last().inputTokens, 10, 'the input the provider reported (larger than the estimate)');
  });

  const sse = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

  test('message_start without an output count (a compatible server) still gives its input: a cut stream is charged it (found in review: it was dropped)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(sse('message_start', { message: { id: 'm', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 50_000 } } }) +
        sse('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) +
        sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'abcd' } }));
      setTimeout(() => res.socket?.destroy(), 30);
    });
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-a', body('hi', { stream: true }));
    await assert.rejects(res.text());
    assert.deepEqual([last().estimated, last().inputTokens, last().outputTokens], [true, 50_000, 1]);
  });

  test('a final count below one reported earlier is not taken lower (found in review: message_delta saying input 0 after message_start said 50,000 charged no input)', async () => {
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(sse('message_start', { message: { id: 'm', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 50_000, output_tokens: 1 } } }) +
        sse('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) +
        sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'abcd' } }) +
        sse('content_block_stop', { index: 0 }) +
        sse('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { input_tokens: 0, output_tokens: 5 } }) +
        sse('message_stop', {}));
    });
    const res = await postJson(`${gw.url}/v1/messages`, 'sk-a', body('hi', { stream: true }));
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual([last().estimated, last().inputTokens, last().outputTokens], [false, 50_000, 5]);
  });

  test('a running input count without cache detail, then a final one that splits out cached tokens: counted once (found in the review of the floor: the larger of each kind counted 800 cached tokens twice)', async () => {
    const chunk = (usage: Record<string, unknown>, choices: unknown[] = [{ index: 0, delta: { content: 'word' } }]) => `data: ${JSON.stringify({ id: 'c', choices, usage })}\n\n`;
    up.queue.push((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(chunk({ prompt_tokens: 1000, completion_tokens: 1 }) + chunk({ prompt_tokens: 1000, completion_tokens: 2 }) +
        chunk({ prompt_tokens: 1000, completion_tokens: 2, prompt_tokens_details: { cached_tokens: 800 } }, []) + 'data: [DONE]\n\n');
    });
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-a', { model: 'gpt-run', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'x' }] });
    assert.ok((await res.text()).endsWith('data: [DONE]\n\n'));
    assert.deepEqual([last().estimated, last().inputTokens, last().outputTokens], [false, 1000, 2]);
  });
});
