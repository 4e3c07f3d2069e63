import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_TOKENS } from '../../src/money.js';
import { DOCUMENT_TOKENS, estimateInputTokens, IMAGE_TOKENS, MAX_DEPTH } from '../../src/billing/estimate.js';
import { postJson, startGateway, testConfig } from '../helpers/gateway.js';

const chars = (n: number) => Math.ceil(n / 4);

describe('the input estimate', () => {
  test('counts every key and value under the input fields, 4 characters to a token, and nothing else', () => {
    // "role" + "user" + "content" + "hello" = 20 characters.
    assert.equal(estimateInputTokens({ model: 'm', stream: true, max_tokens: 9, messages: [{ role: 'user', content: 'hello' }] }), 5);
    assert.equal(estimateInputTokens({ model: 'm', metadata: { user_id: 'x'.repeat(1000) }, messages: [] }), 0, 'metadata is not billed input');
    const system = 's'.repeat(400);
    assert.equal(estimateInputTokens({ system, messages: [] }), 100);
    assert.equal(estimateInputTokens({ tools: [{ name: 'lookup' }] }), chars('name'.length + 'lookup'.length));
  });

  test('images and documents count a fixed number of tokens; a text document counts its text', () => {
    const image = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'A'.repeat(100_000) } };
    assert.equal(estimateInputTokens({ messages: [{ role: 'user', content: [image, image] }] }), chars('role'.length + 'user'.length + 'content'.length) + 2 * IMAGE_TOKENS);
    const pdf = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'B'.repeat(100_000) } };
    const text = { type: 'document', source: { type: 'text', media_type: 'text/plain', data: 't'.repeat(4000) } };
    const withPdf = estimateInputTokens({ messages: [{ role: 'user', content: [pdf] }] })!;
    const withText = estimateInputTokens({ messages: [{ role: 'user', content: [text] }] })!;
    assert.equal(withPdf, chars(15) + DOCUMENT_TOKENS);
    assert.ok(withText > 1000 && withText < 1100, `a text document counts as its text: ${withText}`);
    for (const type of ['image_url', 'input_image']) {
      assert.equal(estimateInputTokens({ input: [{ type, image_url: 'https://example.com/a.png' }] }), IMAGE_TOKENS);
    }
    for (const type of ['file', 'input_file', 'input_audio']) {
      assert.equal(estimateInputTokens({ input: [{ type, file_data: 'Z'.repeat(9999) }] }), DOCUMENT_TOKENS);
    }
  });

  test('embeddings: token ids count one token each', () => {
    assert.equal(estimateInputTokens({ input: [[1, 2, 3], [4, 5]] }), 5);
    assert.equal(estimateInputTokens({ input: 'abcdefgh' }), 2);
  });

  test('bounded: at most MAX_TOKENS; deeper than MAX_DEPTH is refused (null), without recursion', () => {
    let deep: unknown = 'x';
    for (let i = 0; i < MAX_DEPTH + 1; i++) deep = [deep];
    assert.equal(estimateInputTokens({ messages: [{ role: 'user', content: deep }] }), null);
    assert.equal(estimateInputTokens({ metadata: deep }), null, 'depth is checked everywhere: the whole body is sent upstream');
    let ok: unknown = 'x';
    for (let i = 0; i < MAX_DEPTH - 4; i++) ok = [ok];
    assert.equal(typeof estimateInputTokens({ messages: [{ role: 'user', content: ok }] }), 'number');
    // A million levels would overflow any recursive walker's stack.
    const n = 1_000_000;
    const parsed = JSON.parse(`{"messages":${'['.repeat(n)}${']'.repeat(n)}}`) as Record<string, unknown>;
    assert.equal(estimateInputTokens(parsed), null);
    const images = Array.from({ length: 700_000 }, () => ({ type: 'image' }));
    assert.equal(estimateInputTokens({ messages: [{ role: 'user', content: images }] }), MAX_TOKENS);
  });

  test('over a real socket: a deeply nested body is 400, not a 500', async () => {
    const gw = await startGateway();
    try {
      const n = 100_000;
      const body = `{"model":"echo-1","messages":[{"role":"user","content":"hi","extra":${'['.repeat(n)}${']'.repeat(n)}}]}`;
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: 'POST', headers: { authorization: 'Bearer sk-alice', 'content-type': 'application/json' }, body,
      });
      assert.equal(res.status, 413, 'the test config\'s 4 KB body limit answers first');
      await res.text();
    } finally {
      await gw.close();
    }
    const big = await startGateway({ ...testConfig(), server: { host: '127.0.0.1', port: 0, maxBodyBytes: 1 << 20 } });
    try {
      const n = 100_000;
      const body = `{"model":"echo-1","messages":[{"role":"user","content":"hi","extra":${'['.repeat(n)}${']'.repeat(n)}}]}`;
      const res = await postJson(`${big.url}/v1/chat/completions`, 'sk-alice', body);
      assert.equal(res.status, 400);
      const err = ((await res.json()) as { error: { code: string; message: string } }).error;
      assert.equal(err.code, 'invalid_request');
      assert.match(err.message, /nests deeper than 128/);
    } finally {
      await big.close();
    }
  });
});
