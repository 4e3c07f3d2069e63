import type { GatewayConfig } from '../config/types.js';
import { MockProvider } from './mock.js';
import type { Exchange, Provider } from './types.js';

/** Upstream protocols this build cannot speak yet answer 502 with a clear message. */
class UnsupportedProvider implements Provider {
  constructor(private readonly protocol: string) {}
  handle(ex: Exchange): void {
    ex.fail('upstream_error', { message: `The "${this.protocol}" provider protocol is not available in this build.` });
  }
}

/** One provider instance per configured provider id. */
export function createProviders(config: GatewayConfig): Map<string, Provider> {
  const out = new Map<string, Provider>();
  for (const [id, p] of config.providers) {
    out.set(id, p.protocol === 'mock' ? new MockProvider(p) : new UnsupportedProvider(p.protocol));
  }
  return out;
}
