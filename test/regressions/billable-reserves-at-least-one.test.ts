import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { FakeUpstream, json, openaiCompletion } from '../helpers/fake-upstream.js';
import { chatBody, entriesOf, postJson, startGateway, testConfig, until, type Running } from '../helpers/gateway.js';

/**
 * Found in review: a billable call whose estimate is 0 (a model priced for cache reads or
 * searches only) reserved nothing, and a Redis settlement sent again after its first answer was
 * lost cannot tell whether it was applied but by its reservation being gone: such a call was
 * charged twice. A billable call reserves at least a micro-dollar.
 */
const up = new FakeUpstream();
let gw: Running;
before(async () => {
  const base = await up.start();
  gw = await startGateway(testConfig({
    plans: { p: { rpm: 1000, concurrency: 5 } },
    accounts: { acct_c: { plan: 'p' } },
    keys: { key_c: { account: 'acct_c', key: 'sk-c' } },
    models: { cached: { provider: 'oai', price: { inputPerMillion: 0, outputPerMillion: 0, cacheReadPerMillion: 1, webSearchPerThousand: 0 } } },
    providers: { oai: { protocol: 'openai', baseUrl: `${base}/v1` } },
  }));
});
after(async () => {
  await gw.close();
  await up.close();
});

test('regression: a billable call whose estimate is 0 reserves a micro-dollar, given back when it settles', async () => {
  let answer: (() => void) | null = null;
  up.queue.push((_req, res) => {
    answer = () => json(res, 200, openaiCompletion('ok', { prompt_tokens: 2000, completion_tokens: 1, total_tokens: 2001, prompt_tokens_details: { cached_tokens: 1000 } } as never));
  });
  const call = postJson(`${gw.url}/v1/chat/completions`, 'sk-c', chatBody('cached'));
  await until(() => answer !== null, 5000, 'the call upstream');
  const account = gw.gateway.directory.accounts.get('acct_c')!;
  assert.equal((await gw.gateway.limiter.snapshot(account)).reservedMicro, 1);
  answer!();
  assert.equal((await call).status, 200);
  assert.equal(entriesOf(gw, 'acct_c').at(-1)!.amountMicro, -1000, '1,000 cache reads at $1 a million');
  assert.equal((await gw.gateway.limiter.snapshot(account)).reservedMicro, 0);
});
