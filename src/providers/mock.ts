import type { ProviderConfig } from '../config/types.js';
import { tokensOf } from '../protocols/common.js';
import { WIRES } from '../protocols/index.js';
import { countChars } from '../protocols/messages/index.js';
import type { CountRequest, Exchange, Provider } from './types.js';

/**
 * The built-in provider with no network: answers in the protocol of the endpoint called (each
 * protocol's `mock`, src/protocols/), echoes the last user message, counts 1 token per 4
 * characters, streams one chunk per token paced at `tokensPerSecond`, after `latencyMs`.
 */
export class MockProvider implements Provider {
  constructor(private readonly config: ProviderConfig) {}

  handle(ex: Exchange): void {
    ex.noteDelivered(true); // the mock has the request at once
    if (this.config.latencyMs === 0) return this.answer(ex);
    const timer = setTimeout(() => this.answer(ex), this.config.latencyMs);
    ex.onAbort(() => clearTimeout(timer));
  }

  private answer(ex: Exchange): void {
    if (ex.aborted) return;
    WIRES[ex.endpoint].mock(ex, this.config.tokensPerSecond);
  }

  readonly canCount = true;

  /** The mock counts as it meters: 1 token per 4 characters of all message text, the system prompt included. */
  countTokens(request: CountRequest): void {
    request.answer(JSON.stringify({ input_tokens: tokensOf(countChars(request.body)) }));
  }
}
