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
    // An Anthropic client's structured-output schema is input (OpenAI bills it once translated; found in review: a 979 KB schema was charged 5 tokens).
    assert.ok(estimateInputTokens({ model: 'm', messages: [], output_config: { format: { type: 'json_schema', schema: { type: 'object', description: 'x'.repeat(4000) } } } })! >= 1000);
    const system = 's'.repeat(400);
    assert.equal(estimateInputTokens({ system, messages: [] }), 100);
    assert.equal(estimateInputTokens({ tools: [{ name: 'lookup' }] }), chars('name'.length + 'lookup'.length));
  });

  test('images and documents count a fixed number of tokens for their bytes; a text document counts its text', () => {
    const image = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'A'.repeat(100_000) } };
    // Per image, only "type" + "image" + "source" (15 characters) besides its fixed figure.
    assert.equal(estimateInputTokens({ messages: [{ role: 'user', content: [image, image] }] }), chars('role'.length + 'user'.length + 'content'.length + 30) + 2 * IMAGE_TOKENS);
    const pdf = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'B'.repeat(100_000) } };
    const text = { type: 'document', source: { type: 'text', media_type: 'text/plain', data: 't'.repeat(4000) } };
    const withPdf = estimateInputTokens({ messages: [{ role: 'user', content: [pdf] }] })!;
    const withText = estimateInputTokens({ messages: [{ role: 'user', content: [text] }] })!;
    assert.equal(withPdf, chars(15 + 'typedocumentsource'.length) + DOCUMENT_TOKENS);
    assert.ok(withText > 1000 && withText < 1100, `a text document counts as its text: ${withText}`);
    for (const type of ['image_url', 'input_image']) {
      assert.equal(estimateInputTokens({ input: [{ type, image_url: 'https://example.com/a.png' }] }), chars(`type${type}image_url`.length) + IMAGE_TOKENS);
    }
    for (const type of ['file', 'input_file', 'input_audio']) {
      assert.equal(estimateInputTokens({ input: [{ type, file_data: 'Z'.repeat(9999) }] }), chars(`type${type}file_data`.length) + DOCUMENT_TOKENS);
    }
    assert.equal(estimateInputTokens({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${'A'.repeat(9999)}`, detail: 'high' } }] }] }),
      chars('roleusercontenttypeimage_urlimage_url'.length) + IMAGE_TOKENS, 'a chat image part: its url is its bytes');
    // Responses items holding an image (found in review: a 1 MB screenshot counted as 250,000 tokens of text).
    const png = `data:image/png;base64,${'A'.repeat(1_000_000)}`;
    assert.equal(estimateInputTokens({ input: [{ type: 'computer_call_output', call_id: 'c', output: { type: 'computer_screenshot', image_url: png } }] }),
      chars('typecomputer_call_outputcall_idcoutputtypecomputer_screenshotimage_url'.length) + IMAGE_TOKENS);
    assert.equal(estimateInputTokens({ input: [{ type: 'image_generation_call', id: 'ig', status: 'completed', result: 'A'.repeat(1_000_000) }] }),
      chars('typeimage_generation_callidigstatuscompletedresult'.length) + IMAGE_TOKENS);
  });

  test('only a media part\'s bytes are not counted as text: its other text, a tool call\'s input and JSON schemas count whatever `type` they hold (found in review: a `type` of "image" hid everything under it)', () => {
    const big = 'x'.repeat(400_000); // 100,000 tokens
    const at = (body: Record<string, unknown>) => estimateInputTokens(body)!;
    // A document's context and title are text the provider bills.
    const doc = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVBERi0=' }, context: big, title: 't' };
    assert.ok(at({ messages: [{ role: 'user', content: [doc] }] }) > 100_000);
    // A tool call's input is free-form JSON, billed as text, even one that says it is an image.
    const toolUse = { type: 'tool_use', id: 't1', name: 'f', input: { type: 'image', source: { type: 'base64', data: big } } };
    assert.ok(at({ messages: [{ role: 'assistant', content: [toolUse] }] }) > 100_000);
    const server = { type: 'server_tool_use', id: 't2', name: 'web_search', input: { type: 'image', note: big } };
    assert.ok(at({ messages: [{ role: 'assistant', content: [server] }] }) > 100_000);
    // JSON schemas of tools and response formats.
    assert.ok(at({ tools: [{ name: 'f', input_schema: { type: 'image', data: big } }] }) > 100_000);
    assert.ok(at({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'image_url', image_url: big } } }] }) > 100_000);
    assert.ok(at({ response_format: { type: 'json_schema', json_schema: { name: 'r', schema: { type: 'file', file_data: big } } } }) > 100_000);
    assert.ok(at({ text: { format: { type: 'json_schema', name: 'r', schema: { type: 'input_file', file_data: big } } } }) > 100_000);
    // A Responses call's stored prompt: its variables travel in the request.
    assert.ok(at({ prompt: { id: 'pmpt_1', variables: { x: big } } }) > 100_000);
    assert.equal(at({ prompt: { id: 'pmpt_1', variables: { img: { type: 'input_image', image_url: big } } } }),
      chars('idpmpt_1variablesimgtypeinput_imageimage_url'.length) + IMAGE_TOKENS, 'an image variable is an image');
    // Images inside a tool result are still images.
    const result = { type: 'tool_result', tool_use_id: 't1', content: [{ type: 'image', source: { type: 'base64', data: big } }] };
    assert.ok(at({ messages: [{ role: 'user', content: [result] }] }) < IMAGE_TOKENS + 100);
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
