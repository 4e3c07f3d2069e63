import { after, before } from 'node:test';
import { FakeUpstream } from './fake-upstream.js';
import { startGateway, testConfig, type Running } from './gateway.js';

/**
 * The setup most regression tests share: a fake provider, then a gateway whose config (built
 * from the provider's base URL) reaches it, both started before the suite's tests and closed
 * after them. Call it inside a `describe`; `gw()` is the running gateway once `before` ran.
 */
export function behindFakeProvider(patch: (base: string) => Record<string, unknown>): { up: FakeUpstream; gw: () => Running } {
  const up = new FakeUpstream();
  let running: Running | null = null;
  before(async () => {
    running = await startGateway(testConfig(patch(await up.start())));
  });
  after(async () => {
    await running?.close();
    await up.close();
  });
  return { up, gw: () => running! };
}
