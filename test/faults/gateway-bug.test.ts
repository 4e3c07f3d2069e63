import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { BilledCall } from '../../src/billing/call.js';
import { FakeUpstream, json, openaiCompletion, openaiStream } from '../helpers/fake-upstream.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * A bug of the gateway's own in handling a provider's answer (an exception where none was
 * expected) runs from a socket's event or after a ledger's promise, where nothing would catch
 * it: the process would end, with every other call in it. It fails that call instead (500, or
 * a cut once bytes were sent), charged as an abnormal end, its slot released; the gateway
 * serves the next call. The bug is simulated by making one method of the billed call throw once.
 */
describe('fault: a bug in handling an answer fails the call, not the process', () => {
  const up = new FakeUpstream();
  let gw: Running;
  before(async () => {
    const base = await up.start();
    up.fallback = (req, res, body) => {
      if (body.stream === true) openaiStream(['a', 'b'], { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 })(req, res, body);
      else json(res, 200, openaiCompletion('hi', { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }));
    };
    gw = await startGateway(testConfig({
      plans: { p: { rpm: 10_000, concurrency: 1 } },
      accounts: { acct_b: { plan: 'p' } },
      keys: { key_b: { account: 'acct_b', key: 'sk-b' } },
      models: { gpt: { provider: 'up', price: { inputPerMillion: 1, outputPerMillion: 1 } } },
      providers: { up: { protocol: 'openai', baseUrl: `${base}/v1`, timeoutMs: 2000 } },
    }));
  });
  after(async () => {
    await gw.close();
    await up.close();
  });

  /** Makes BilledCall's `method` throw on its next call only. */
  function breakOnce(method: 'head' | 'end' | 'settle'): void {
    const proto = BilledCall.prototype as unknown as Record<string, unknown>;
    const original = proto[method];
    proto[method] = function broken() {
      proto[method] = original;
      throw new Error(`a simulated bug in ${method}`);
    };
  }

  async function servesNext(): Promise<void> {
    await until(() => gw.gateway.inFlight === 0, 3000, 'the slot released');
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-b', chatBody('gpt'));
    assert.equal(res.status, 200);
    await res.text();
  }

  test('before anything was sent (the answer\'s head): 500 internal_error, charged once', async () => {
    const charges = entriesOf(gw, 'acct_b').length;
    breakOnce('head');
    const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-b', chatBody('gpt'));
    assert.equal(res.status, 500);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'internal_error');
    await servesNext();
    assert.equal(entriesOf(gw, 'acct_b').length, charges + 2, 'the broken call and the next, once each');
  });

  test('charging the final event of a stream (found in review: the call then hung, its slot held): the answer is cut, the slot released', async () => {
    breakOnce('settle');
    await assert.rejects(async () => (await postJson(`${gw.url}/v1/chat/completions`, 'sk-b', chatBody('gpt', 'hi', { stream: true }))).text());
    await servesNext();
  });

  for (const stream of [false, true]) {
    test(`after the charge settled (the answer's end, ${stream ? 'streamed' : 'whole'}): ${stream ? 'the answer is cut' : '500 (its head was not sent)'}, charged once`, async () => {
      const charges = entriesOf(gw, 'acct_b').length;
      breakOnce('end');
      const answer = postJson(`${gw.url}/v1/chat/completions`, 'sk-b', chatBody('gpt', 'hi', stream ? { stream: true } : {}));
      if (stream) {
        // Cut: the stream's first events left, so its head did.
        await assert.rejects(async () => (await answer).text());
      } else {
        // A whole answer's head waits for its bytes (BilledCall.head): the bug is a 500 instead.
        const res = await answer;
        assert.equal(res.status, 500);
        assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'internal_error');
      }
      await servesNext();
      assert.equal(entriesOf(gw, 'acct_b').length, charges + 2);
    });
  }
});
