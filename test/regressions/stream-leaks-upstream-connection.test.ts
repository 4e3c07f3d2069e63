// A streamed answer used to leave its provider connection out of the keep-alive pool
// (removeAllListeners('end') dropped Node's own listener): one new connection per stream,
// and after 1,024 streams every call to that provider hung.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FakeUpstream, openaiStream } from '../helpers/fake-upstream.js';
import { chatBody, postJson, startGateway, testConfig } from '../helpers/gateway.js';

test('streams through the gateway reuse one keep-alive connection to the provider', async () => {
  const up = new FakeUpstream();
  const base = await up.start();
  let connections = 0;
  up['server']!.on('connection', () => connections++);
  const gw = await startGateway(testConfig({
    accounts: { acct_a: { plan: 'pro' } },
    keys: { key_a: { account: 'acct_a', key: 'sk-client' } },
    models: { 'gpt-x': { provider: 'oai', price: 'free' } },
    providers: { oai: { protocol: 'openai', baseUrl: `${base}/v1` } },
  }));
  try {
    for (let i = 0; i < 10; i++) {
      up.queue.push(openaiStream(['a', 'b'], { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 }));
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-client', chatBody('gpt-x', 'x', { stream: true }));
      assert.ok((await res.text()).endsWith('data: [DONE]\n\n'));
    }
    assert.equal(connections, 1);
  } finally {
    await gw.close();
    await up.close();
  }
});
