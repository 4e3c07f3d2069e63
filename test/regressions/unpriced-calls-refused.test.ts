import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, startGateway, testConfig, type Running } from '../helpers/gateway.js';

/**
 * Found in review: calls the gateway cannot price were passed through. An OpenAI
 * `service_tier` of "priority" is billed about twice the standard price (and "flex" half) while
 * the gateway charges its own; a Responses call with `background: true` is answered "queued",
 * with no usage, before it is generated, so it was charged its input estimate alone while the
 * provider billed the whole generation; Anthropic's `speed: "fast"` and a regional
 * `inference_geo` raise its prices. Each is the client's 400 naming the field, before
 * admission; the standard tier still works.
 */
describe('regression: calls the gateway cannot price are refused', () => {
  let gw: Running;
  before(async () => {
    gw = await startGateway(testConfig());
  });
  after(async () => {
    await gw.close();
  });

  const refused = async (path: string, body: Record<string, unknown>, param: string) => {
    const res = await postJson(`${gw.url}${path}`, 'sk-alice', body);
    assert.equal(res.status, 400, `${path} ${JSON.stringify(body)}`);
    assert.equal(((await res.json()) as { error: { param: string } }).error.param, param);
  };

  test('service_tier other than "auto" or "default", on chat and Responses', async () => {
    for (const tier of ['priority', 'flex', 'scale', 7]) {
      await refused('/v1/chat/completions', { model: 'echo-1', service_tier: tier, messages: [{ role: 'user', content: 'hi' }] }, 'service_tier');
      await refused('/v1/responses', { model: 'echo-1', service_tier: tier, input: 'hi' }, 'service_tier');
    }
    for (const tier of ['auto', 'default', null]) {
      const res = await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', { model: 'echo-1', service_tier: tier, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(res.status, 200, String(tier));
      await res.text();
    }
  });

  test('Anthropic\'s fast mode and regional inference (found in review: passed through, billed 2 to 6 and 1.1 times the prices charged)', async () => {
    const messages = (extra: Record<string, unknown>) => ({ model: 'echo-1', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }], ...extra });
    for (const speed of ['fast', 'turbo', 1]) await refused('/v1/messages', messages({ speed }), 'speed');
    for (const geo of ['us', 'eu', true]) await refused('/v1/messages', messages({ inference_geo: geo }), 'inference_geo');
    for (const extra of [{ speed: 'standard' }, { speed: null }, { inference_geo: 'global' }, {}]) {
      const res = await postJson(`${gw.url}/v1/messages`, 'sk-alice', messages(extra));
      assert.equal(res.status, 200, JSON.stringify(extra));
      await res.text();
    }
  });

  test('a background Responses call', async () => {
    await refused('/v1/responses', { model: 'echo-1', background: true, input: 'hi' }, 'background');
    const res = await postJson(`${gw.url}/v1/responses`, 'sk-alice', { model: 'echo-1', background: false, input: 'hi' });
    assert.equal(res.status, 200);
    await res.text();
  });
});
