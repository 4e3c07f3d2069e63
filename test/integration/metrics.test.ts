import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { chatBody, postJson, startGateway, testConfig } from '../helpers/gateway.js';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** A strict reader of the Prometheus text format: fails on anything malformed. */
function parseExposition(text: string): { samples: Sample[]; types: Map<string, string> } {
  assert.ok(text.endsWith('\n'), 'ends with a newline');
  const types = new Map<string, string>();
  const helps = new Set<string>();
  const samples: Sample[] = [];
  for (const line of text.slice(0, -1).split('\n')) {
    let m = /^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$/.exec(line);
    if (m) { helps.add(m[1]!); continue; }
    m = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/.exec(line);
    if (m) {
      assert.ok(!types.has(m[1]!), `TYPE ${m[1]} twice`);
      types.set(m[1]!, m[2]!);
      continue;
    }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.e+]+|\+Inf|NaN)$/.exec(line);
    assert.ok(m, `malformed line: ${line}`);
    const labels: Record<string, string> = {};
    if (m[3]) {
      for (const pair of m[3].match(/[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"/g) ?? []) {
        const eq = pair.indexOf('=');
        labels[pair.slice(0, eq)] = pair.slice(eq + 2, -1);
      }
    }
    const family = m[1]!.replace(/_(bucket|sum|count)$/, '');
    assert.ok(types.has(m[1]!) || types.get(family) === 'histogram', `sample ${m[1]} before its TYPE`);
    assert.ok(helps.has(m[1]!) || helps.has(family), `sample ${m[1]} without HELP`);
    samples.push({ name: m[1]!, labels, value: Number(m[4]) });
  }
  return { samples, types };
}

const find = (samples: Sample[], name: string, labels: Record<string, string>) =>
  samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;

describe('/metrics', () => {
  test('Prometheus text: requests, latency, admissions, tokens, spend, store health', async () => {
    const gw = await startGateway(testConfig({
      plans: { tiny: { rpm: 3, concurrency: 5 }, pro: { rpm: 100 } },
      accounts: { acct_bob: { plan: 'tiny' }, acct_alice: { plan: 'pro' } },
      keys: { key_bob: { account: 'acct_bob', key: 'sk-bob' }, key_alice: { account: 'acct_alice', key: 'sk-alice' } },
    }));
    try {
      for (let i = 0; i < 4; i++) await (await fetch(`${gw.url}/v1/models`, { headers: { 'x-api-key': 'sk-bob' } })).text();
      await (await fetch(`${gw.url}/v1/models`)).text();
      await (await postJson(`${gw.url}/v1/chat/completions`, 'sk-alice', chatBody('paid-1', 'x'.repeat(40)))).text();
      const res = await fetch(`${gw.url}/metrics`);
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type')!, /^text\/plain; version=0\.0\.4/);
      const text = await res.text();
      const { samples, types } = parseExposition(text);
      assert.equal(find(samples, 'mg_requests_total', { route: '/v1/models', status: '200' }), 3);
      assert.equal(find(samples, 'mg_requests_total', { route: '/v1/models', status: '429' }), 1);
      assert.equal(find(samples, 'mg_requests_total', { route: '/v1/models', status: '401' }), 1);
      assert.equal(find(samples, 'mg_admissions_total', { result: 'rate_limit_exceeded' }), 1);
      assert.equal(find(samples, 'mg_admissions_total', { result: 'admitted' }), 4);
      assert.equal(find(samples, 'mg_tokens_total', { model: 'paid-1', direction: 'input' }), 10);
      assert.equal(find(samples, 'mg_spend_usd_total', { model: 'paid-1' }), 0.00003);
      assert.equal(find(samples, 'mg_limiter_up', {}), 1);
      assert.equal(find(samples, 'mg_in_flight_requests', {}), 0);
      assert.equal(types.get('mg_request_duration_seconds'), 'histogram');
      const buckets = samples.filter((s) => s.name === 'mg_request_duration_seconds_bucket' && s.labels.route === '/v1/models');
      for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i]!.value >= buckets[i - 1]!.value, 'buckets are cumulative');
      assert.equal(buckets.at(-1)!.labels.le, '+Inf');
      assert.equal(buckets.at(-1)!.value, find(samples, 'mg_request_duration_seconds_count', { route: '/v1/models' }));
      assert.ok(!/sk-|key_bob|acct_/.test(text), 'no key or account labels');
      const promtool = spawnSync('promtool', ['check', 'metrics'], { input: text });
      if (promtool.error === undefined) assert.equal(promtool.status, 0, promtool.stderr.toString());
    } finally {
      await gw.close();
    }
  });

  test('server.metrics false removes the endpoint', async () => {
    const gw = await startGateway(testConfig({ server: { host: '127.0.0.1', port: 0, metrics: false } }));
    try {
      assert.equal((await fetch(`${gw.url}/metrics`)).status, 404);
    } finally {
      await gw.close();
    }
  });
});
