import type { ProviderConfig } from '../config/types.js';
import { tokensOf } from '../protocols/common.js';
import { WIRES } from '../protocols/index.js';
import { countChars } from '../protocols/messages/index.js';
import { inputChars } from '../protocols/responses/index.js';
import { countAnswer } from '../translate/count.js';
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

  readonly countsAs = null;

  /** The mock counts as it meters: 1 token per 4 characters of the input's text, the system prompt or instructions included. */
  countTokens(request: CountRequest): void {
    const chars = request.endpoint === 'messages' ? countChars(request.body) : inputChars(request.body);
    request.answer(countAnswer(request.endpoint, tokensOf(chars)));
  }
}
