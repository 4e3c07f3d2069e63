import type { GatewayConfig } from '../config/types.js';
import { HttpProvider } from './http.js';
import { MockProvider } from './mock.js';
import { KINDS } from './kinds.js';
import type { Provider } from './types.js';

/** One provider instance per configured provider id. */
export function createProviders(config: GatewayConfig): Map<string, Provider> {
  const out = new Map<string, Provider>();
  for (const [id, p] of config.providers) {
    out.set(id, p.protocol === 'mock' ? new MockProvider(p) : new HttpProvider(p, KINDS[p.protocol]));
  }
  return out;
}
