import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { demoConfig } from '../../src/config/demo.js';
import { validateConfig } from '../../src/config/validate.js';
import { costMicro, microToUsd, parseUsd } from '../../src/money.js';
import { sha, testConfig } from '../helpers/gateway.js';

const opts = { baseDir: '/srv/gw', env: { OPENAI_KEY: 'sk-up' } };

function errorsWithEnv(raw: unknown, env: Record<string, string>): string[] {
  const r = validateConfig(raw, { ...opts, env });
  assert.equal(r.ok, false, 'expected the config to be rejected');
  return (r as { errors: string[] }).errors;
}

function errorsOf(raw: unknown): string[] {
  const r = validateConfig(raw, opts);
  assert.equal(r.ok, false, 'expected the config to be rejected');
  return (r as { errors: string[] }).errors;
}

describe('config validation', () => {
  test('the demo config and the test config are valid', () => {
    assert.equal(validateConfig(demoConfig(), opts).ok, true);
    assert.equal(validateConfig(testConfig(), opts).ok, true);
  });

  test('defaults: server values, memory limiter, file ledger under the config folder', () => {
    const r = validateConfig({}, opts);
    assert.ok(r.ok);
    assert.deepEqual(r.config.server, {
      host: '127.0.0.1', port: 8080, maxBodyBytes: 4194304, requestTimeoutMs: 30000, drainDelayMs: 0,
      drainTimeoutMs: 30000, clientIdleTimeoutMs: 120000, headersTimeoutMs: 10000, maxConnections: 10000, metrics: true, logLevel: 'info', logBufferBytes: 4_194_304,
    });
    assert.deepEqual(r.config.limiter, { store: 'memory' });
    assert.deepEqual(r.config.ledger, { store: 'file', dir: '/srv/gw/data' });
  });

  test('every problem is reported, each by its JSON path', () => {
    const errors = errorsOf({
      server: { port: 70000, colour: 'blue' },
      plans: { free: { rpm: -1, concurrency: 'lots', dailyCapUsd: '1.0000001' } },
      accounts: { acct_a: { plan: 'gold' } },
      keys: {
        k1: { account: 'acct_x', sha256: 'abc' },
        k2: { account: 'acct_a', key: 'x', sha256: sha('x') },
        k3: { account: 'acct_a', key: 'dup', models: ['nope'] },
        k4: { account: 'acct_a', key: 'dup' },
      },
      models: { m: { provider: 'ghost' }, n: {} },
      providers: { p: { protocol: 'grpc' }, o: { protocol: 'openai', apiKeyEnv: 'MISSING_VAR', latencyMs: 5 } },
      limiter: { store: 'redis' },
      ledger: { store: 'tape' },
    });
    const expected = [
      'server.colour: unknown key',
      'server.port: must be an integer from 0 to 65535',
      'plans.free.rpm: must be an integer from 0 to 1000000000, or "unlimited"',
      'plans.free.concurrency: must be an integer from 0 to 1000000000, or "unlimited"',
      'plans.free.dailyCapUsd: has more than 6 decimal places',
      'accounts.acct_a.plan: unknown plan "gold"',
      'keys.k1.account: unknown account "acct_x"',
      'keys.k1.sha256: must be 64 hexadecimal characters',
      'keys.k2: needs exactly one of "sha256"',
      'keys.k3.models[0]: unknown model "nope"',
      'keys.k4: has the same key as keys.k3',
      'models.m.provider: unknown provider "ghost"',
      'models.n.provider: is required',
      'providers.p.protocol: must be "openai", "anthropic" or "mock"',
      'providers.o.latencyMs: unknown key',
      'providers.o.apiKeyEnv: environment variable MISSING_VAR is not set',
      'limiter.url: is required when store is "redis"',
      'ledger.store: must be "memory", "file" or "postgres"',
    ];
    for (const prefix of expected) {
      assert.ok(errors.some((e) => e.startsWith(prefix)), `missing "${prefix}" in:\n${errors.join('\n')}`);
    }
  });

  test('unknown top-level keys and non-objects are rejected', () => {
    assert.ok(errorsOf({ plugins: [] })[0]!.startsWith('plugins: unknown key'));
    assert.deepEqual(errorsOf([]), ['(root): must be an object']);
    assert.ok(errorsOf({ plans: { 'bad id!': {} } })[0]!.startsWith('plans["bad id!"]: id must be'));
  });

  test('accounts inherit plan limits and may override each, "unlimited" included', () => {
    const r = validateConfig(testConfig({
      accounts: { acct_alice: { plan: 'free', rpm: 'unlimited', dailyCapUsd: '2.5', balanceUsd: 10 } },
      keys: { key_alice: { account: 'acct_alice', key: 'sk-plain', rpm: 3 } },
    }), opts);
    assert.ok(r.ok);
    const a = r.config.accounts.get('acct_alice')!;
    assert.equal(a.rpm, null);
    assert.equal(a.concurrency, undefined);
    assert.equal(a.dailyCapMicro, 2_500_000);
    assert.equal(a.balanceMicro, 10_000_000);
    const k = r.config.keys.get('key_alice')!;
    assert.equal(k.sha256, sha('sk-plain'));
    assert.equal(k.rpm, 3);
    assert.equal(r.warnings.length, 1, 'a plaintext key warns');
    assert.ok(!JSON.stringify(r.warnings).includes('sk-plain'), 'the warning never shows the key');
  });

  test('providers: apiKeyEnv is read at load; base URLs default to the official ones', () => {
    const r = validateConfig({
      providers: {
        o: { protocol: 'openai', apiKeyEnv: 'OPENAI_KEY' },
        a: { protocol: 'anthropic', baseUrl: 'http://127.0.0.1:9/' },
      },
    }, opts);
    assert.ok(r.ok);
    assert.deepEqual(r.config.providers.get('o')!.apiKeys, ['sk-up']);
    assert.deepEqual(r.config.providers.get('a')!.apiKeys, []);
    assert.equal(r.config.providers.get('o')!.baseUrl, 'https://api.openai.com/v1');
    assert.equal(r.config.providers.get('a')!.baseUrl, 'http://127.0.0.1:9');
    assert.ok(errorsOf({ providers: { a: { protocol: 'anthropic', baseUrl: 'ftp://x' } } })[0]!.includes('http://'));
  });

  test('found in review: what validated and then failed every call or the start is refused at load, by its path', () => {
    // A key read from a file, with its newline: trimmed. One with a line break inside: refused.
    const r = validateConfig({ providers: { o: { protocol: 'openai', apiKeyEnv: 'NL' } } }, { ...opts, env: { NL: 'sk-abc\n' } });
    assert.ok(r.ok);
    assert.deepEqual(r.config.providers.get('o')!.apiKeys, ['sk-abc']);
    assert.deepEqual(errorsWithEnv({ providers: { o: { protocol: 'openai', apiKeyEnv: 'BAD' } } }, { BAD: 'sk-a\nb' }),
      ['providers.o.apiKeyEnv: environment variable BAD holds characters an HTTP header cannot carry']);
    // A base URL the endpoint's path is appended to: no query, fragment, credentials or spaces.
    for (const baseUrl of ['https://h/openai/v1?api-version=1', 'https://h/v1#f', 'https://h/v1?', 'https://h/v1#', 'https://u:p@h/v1', ' https://h/v1 ']) {
      const errors = errorsOf({ providers: { p: { protocol: 'openai', baseUrl } } });
      assert.equal(errors.length, 1, baseUrl);
      assert.match(errors[0]!, /^providers\.p\.baseUrl: must /, baseUrl);
    }
    assert.deepEqual(errorsOf({ limiter: { store: 'redis', url: 'not a url' } }), ['limiter.url: must be a redis://, rediss:// or unix:// URL, got "not a url"']);
    assert.deepEqual(errorsOf({ limiter: { store: 'redis', url: 'http://h:6379' } }), ['limiter.url: must be a redis://, rediss:// or unix:// URL, got "http://h:6379"']);
    for (const url of ['redis://:pw@h:6379/2', 'rediss://u:pw@h', 'unix:///run/redis.sock', 'unix://:pw@/run/r.sock?db=2']) assert.ok(validateConfig({ limiter: { store: 'redis', url } }, opts).ok, url);
    // Keys of any length (a JWT can be long), spaces inside included.
    assert.ok(validateConfig({ providers: { o: { protocol: 'openai', apiKeyEnv: 'LONG' } } }, { ...opts, env: { LONG: `ey${'x'.repeat(6000)} y` } }).ok);
    for (const baseUrl of ['http://[::1]:8000/v1', 'https://r.openai.azure.com/openai/v1', 'http://10.0.0.7:8000/v1/']) {
      assert.ok(validateConfig({ providers: { p: { protocol: 'openai', baseUrl } } }, opts).ok, baseUrl);
    }
    // A body is decoded to one string: its bound stays well under V8's longest.
    assert.match(errorsOf({ server: { maxBodyBytes: 2 ** 29 } })[0]!, /^server\.maxBodyBytes: /);
    assert.ok(validateConfig({ server: { maxBodyBytes: 500 * 1024 * 1024 } }, opts).ok);
    assert.ok(!validateConfig({ server: { maxBodyBytes: 500 * 1024 * 1024 + 1 } }, opts).ok);
    // A value shown in a message is cut short.
    assert.ok(errorsOf({ ledger: { store: 'x'.repeat(100_000) } })[0]!.length < 300);
  });

  test('providers: several keys, where the key goes, static headers; each mistake named', () => {
    const env = { K1: 'sk-1', K2: 'sk-2' };
    const r = validateConfig({
      providers: {
        azure: { protocol: 'openai', baseUrl: 'https://r.openai.azure.com/openai/v1', apiKeyEnv: ['K1', 'K2'], authHeader: 'api-key', headers: { 'X-Team': 'ml', 'OpenAI-Organization': 'org-1' } },
      },
    }, { ...opts, env });
    assert.ok(r.ok);
    const azure = r.config.providers.get('azure')!;
    assert.deepEqual([azure.apiKeys, azure.authHeader, azure.headers, azure.outputLimitField], [['sk-1', 'sk-2'], 'api-key', ['x-team', 'ml', 'openai-organization', 'org-1'], 'max_completion_tokens']);
    const ollama = validateConfig({ providers: { ollama: { protocol: 'openai', baseUrl: 'http://127.0.0.1:11434/v1', outputLimitField: 'max_tokens' } } }, opts);
    assert.ok(ollama.ok);
    assert.equal(ollama.config.providers.get('ollama')!.outputLimitField, 'max_tokens');
    const errors = validateConfig({
      providers: {
        p: { protocol: 'openai', apiKeyEnv: ['K1', 'NOPE'], authHeader: 'basic', headers: { Authorization: 'x', 'bad name': 'v', 'x-ok': 'line\nbreak', 'Content-Length': '1' }, outputLimitField: 'num_predict' },
        q: { protocol: 'anthropic', apiKeyEnv: [], headers: 'x', outputLimitField: 'max_tokens' },
        m: { protocol: 'mock', headers: {} },
      },
    }, { ...opts, env }) as { errors: string[] };
    assert.deepEqual(errors.errors, [
      'providers.p.apiKeyEnv[1]: environment variable NOPE is not set',
      'providers.p.authHeader: must be "bearer", "x-api-key" or "api-key", got "basic"',
      'providers.p.outputLimitField: must be "max_completion_tokens" or "max_tokens", got "num_predict"',
      'providers.p.headers.Authorization: is set by the gateway itself (authHeader says where the key goes)',
      'providers.p.headers["bad name"]: is not a valid header name',
      'providers.p.headers.x-ok: must be a string of at most 4096 characters without line breaks',
      'providers.p.headers.Content-Length: is set by the gateway itself',
      'providers.q.outputLimitField: unknown key (allowed: protocol, baseUrl, apiKeyEnv, authHeader, headers, timeoutMs, streamIdleTimeoutMs)',
      'providers.q.apiKeyEnv: must name 1 to 64 environment variables',
      'providers.q.headers: must be an object of header names to values',
      'providers.m.headers: unknown key (allowed: protocol, latencyMs, tokensPerSecond)',
    ]);
  });

  test('models: deployments (weights, fallbacks, own upstream names) and the routing section; each mistake named', () => {
    const r = validateConfig({
      routing: { maxAttempts: 2 },
      models: {
        m: { price: 'free', upstreamModel: 'up-m', deployments: [{ provider: 'a', weight: 2.5 }, { provider: 'b', upstreamModel: 'b-m', fallback: true }] },
        single: { provider: 'a' },
      },
      providers: { a: { protocol: 'mock' }, b: { protocol: 'mock' } },
    }, opts);
    assert.ok(r.ok);
    assert.deepEqual(r.config.routing, { maxAttempts: 2, cooldownMs: 5000 });
    const m = r.config.models.get('m')!;
    assert.deepEqual(m.deployments, [
      { provider: 'a', upstreamModel: 'up-m', weight: 2.5, fallback: false },
      { provider: 'b', upstreamModel: 'b-m', weight: 1, fallback: true },
    ]);
    assert.deepEqual([m.provider, m.upstreamModel], ['a', 'up-m'], 'the first deployment is the model\'s provider');
    assert.deepEqual(r.config.models.get('single')!.deployments, [{ provider: 'a', upstreamModel: 'single', weight: 1, fallback: false }]);
    const errors = errorsOf({
      routing: { maxAttempts: 0, cooldownMs: -1, jitter: true },
      models: {
        both: { provider: 'a', deployments: [{ provider: 'a' }] },
        empty: { deployments: [] },
        bad: { deployments: [{ provider: 'a', weight: 0 }, { provider: 'a' }, { provider: 'zz', weight: 'x' }, 'a', { provider: 'a', fallback: 'no', extra: 1 }] },
        allFallback: { deployments: [{ provider: 'a', fallback: true }] },
        priced: { deployments: [{ provider: 'a' }, { provider: 'o' }] },
        neither: {},
      },
      providers: { a: { protocol: 'mock' }, o: { protocol: 'openai', apiKeyEnv: 'OPENAI_KEY' } },
    });
    assert.deepEqual(errors, [
      'routing.jitter: unknown key (allowed: maxAttempts, cooldownMs)',
      'routing.maxAttempts: must be an integer from 1 to 16',
      'routing.cooldownMs: must be an integer from 0 to 86400000',
      'models.both.provider: cannot be given with "deployments" (name the provider in each deployment)',
      'models.empty.deployments: must be an array of 1 to 16 deployments',
      'models.bad.deployments[0].weight: must be a number above 0 and at most 1000000',
      'models.bad.deployments[1].provider: names "a" a second time in this model',
      'models.bad.deployments[2].provider: unknown provider "zz"',
      'models.bad.deployments[2].weight: must be a number above 0 and at most 1000000',
      'models.bad.deployments[3]: must be an object',
      'models.bad.deployments[4].extra: unknown key (allowed: provider, upstreamModel, weight, fallback)',
      'models.bad.deployments[4].provider: names "a" a second time in this model',
      'models.bad.deployments[4].fallback: must be true or false',
      'models.allFallback.deployments: needs at least one deployment that is not a fallback',
      'models.priced.price: is required for a model of a real provider (write "free" if it really costs nothing)',
      'models.neither.provider: is required (or "deployments")',
    ]);
  });
});

describe('money', () => {
  test('USD amounts become integer micro-dollars without float error', () => {
    assert.equal(parseUsd(0.15), 150_000);
    assert.equal(parseUsd('0.000001'), 1);
    assert.equal(parseUsd(1e-6), 1);
    assert.equal(parseUsd('100'), 100_000_000);
    assert.equal(parseUsd(-2.5), -2_500_000);
    assert.equal(typeof parseUsd(1e-7), 'string');
    // Below 1e-6 a number is written with an exponent: not rounded to 0 (a cap of 4e-8 is not a cap of 0).
    for (const tiny of [4e-8, -4e-8, 5e-324]) assert.equal(typeof parseUsd(tiny), 'string', String(tiny));
    assert.equal(typeof parseUsd('1,5'), 'string');
    assert.equal(typeof parseUsd(true), 'string');
    assert.equal(typeof parseUsd(Infinity), 'string');
    assert.equal(typeof parseUsd(1e300), 'string');
    // Refused before any regular expression (found in review: 100,000 zeros took 10 s, quadratic).
    const began = performance.now();
    assert.equal(typeof parseUsd(`1.${'0'.repeat(100_000)}1`), 'string');
    assert.ok(performance.now() - began < 250, 'at once');
    assert.equal(parseUsd(`1.${'0'.repeat(50)}`), 1_000_000, 'a long amount within the bound is still read');
  });

  test('cost is tokens x price per million, rounded up to a micro-dollar', () => {
    const price = { input: 150_000, output: 600_000, cacheRead: 75_000, cacheWrite: 0, cacheWrite1h: 0, webSearchPerThousand: 0, webSearchesPerCall: 0, audioInput: null, audioOutput: null };
    assert.equal(costMicro(price, { inputTokens: 1_000_000, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 }), 150_000);
    assert.equal(costMicro(price, { inputTokens: 1, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 }), 1);
    assert.equal(costMicro(price, { inputTokens: 10, outputTokens: 10, cacheReadTokens: 100, cacheWriteTokens: 0 }), 15);
    assert.equal(microToUsd(1_234_567), 1.234567);
    // Cache writes kept for an hour at their own price (found in review: all at the five-minute one).
    const sonnet = { input: 3_000_000, output: 15_000_000, cacheRead: 300_000, cacheWrite: 3_750_000, cacheWrite1h: 6_000_000, webSearchPerThousand: 10_000_000, webSearchesPerCall: 0, audioInput: null, audioOutput: null };
    assert.equal(costMicro(sonnet, { inputTokens: 10, outputTokens: 5, cacheReadTokens: 0, cacheWriteTokens: 1000, cacheWrite1hTokens: 1000 }), 30 + 75 + 6000);
    assert.equal(costMicro(sonnet, { inputTokens: 10, outputTokens: 5, cacheReadTokens: 0, cacheWriteTokens: 1000, cacheWrite1hTokens: 400 }), 30 + 75 + 2250 + 2400);
    const configured = validateConfig({ providers: { mock: { protocol: 'mock' } }, models: { m: { provider: 'mock', price: { inputPerMillion: 3, outputPerMillion: 15, cacheWritePerMillion: 3.75 } } } }, opts);
    assert.ok(configured.ok);
    assert.equal(configured.config.models.get('m')!.price.cacheWrite1h, 3_750_000, 'omitted: the five-minute price, never free');
    // Web searches: $10 a thousand unless set; a model free of tokens stays free.
    assert.equal(costMicro(sonnet, { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: 3 }), 30_000);
    // Rounded up once per call, searches and tokens together (found in review: rounded apart, 0.5 + 0.5 micro-dollars made 2).
    const halves = { ...price, input: 500_000, webSearchPerThousand: 500 };
    assert.equal(costMicro(halves, { inputTokens: 1, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: 1 }), 1);
    assert.equal(costMicro(halves, { inputTokens: 3, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: 2 }), 3, '1.5 + 1 rounds up to 3');
    assert.equal(configured.config.models.get('m')!.price.webSearchPerThousand, 10_000_000);
    const zero = validateConfig({ providers: { mock: { protocol: 'mock' } }, models: { z: { provider: 'mock', price: { inputPerMillion: 0, outputPerMillion: 0 } } } }, opts);
    assert.ok(zero.ok);
    assert.equal(zero.config.models.get('z')!.price.webSearchPerThousand, 0);
    // Searches billed every call (OpenAI's Chat search models): none unless set, a whole number up to 100.
    assert.equal(configured.config.models.get('m')!.price.webSearchesPerCall, 0);
    const perCall = (n: unknown) => validateConfig({ providers: { mock: { protocol: 'mock' } }, models: { s: { provider: 'mock', price: { inputPerMillion: 1, webSearchesPerCall: n } } } }, opts);
    const one = perCall(1);
    assert.ok(one.ok);
    assert.equal(one.config.models.get('s')!.price.webSearchesPerCall, 1);
    for (const bad of [101, -1, 1.5, '1']) assert.ok(!perCall(bad).ok, String(bad));
    // Audio: its own prices when set (found in review: at the text ones); none by omission, but for a free model.
    assert.deepEqual([configured.config.models.get('m')!.price.audioInput, configured.config.models.get('m')!.price.audioOutput], [null, null]);
    assert.deepEqual([zero.config.models.get('z')!.price.audioInput, zero.config.models.get('z')!.price.audioOutput], [0, 0]);
    const audio = { ...price, audioInput: 40_000_000, audioOutput: 80_000_000 };
    const usage = { inputTokens: 1000, outputTokens: 100, cacheReadTokens: 0, cacheWriteTokens: 0, audioInputTokens: 600, audioOutputTokens: 50 };
    assert.equal(costMicro(audio, usage), 60 + 24_000 + 30 + 4000);
    assert.equal(costMicro(price, usage), 150 + 60, 'a model without audio prices: at the text ones');
  });
});
