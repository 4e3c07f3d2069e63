import { responsesInputOf } from './chat-to-responses-input.js';
import { messagesToChat } from './messages-to-chat.js';
import { responsesToMessages } from './responses-to-messages.js';
import type { CallFacts } from './types.js';

/** The two token counts clients call: Anthropic's `count_tokens` (Messages) and OpenAI's `input_tokens` (Responses). */
export type CountEndpoint = 'messages' | 'responses';

/** What Anthropic's count_tokens takes of a Messages body (it refuses max_tokens, stream, sampling). */
const MESSAGES_COUNT_FIELDS = ['messages', 'system', 'tools', 'tool_choice', 'thinking'];

/**
 * A count request of one protocol as the other's count takes it, through the translation the
 * call itself would take, so the count is of what the provider would be sent: a Messages count
 * for OpenAI's input count (Messages to chat, then the Responses form), a Responses count for
 * Anthropic's count_tokens. Without `model` (the provider sets its own). Throws Untranslatable,
 * as the call would.
 */
export function countBodyFor(from: CountEndpoint, body: Record<string, unknown>, facts: CallFacts): Record<string, unknown> {
  if (from === 'messages') return responsesInputOf(messagesToChat.request(body, facts).body);
  const messages = responsesToMessages.request(body, facts).body;
  const out: Record<string, unknown> = {};
  for (const field of MESSAGES_COUNT_FIELDS) if (messages[field] !== undefined) out[field] = messages[field];
  return out;
}

/** A count's answer as the client's endpoint writes it. */
export function countAnswer(endpoint: CountEndpoint, inputTokens: number): string {
  return endpoint === 'messages' ? `{"input_tokens":${inputTokens}}` : `{"object":"response.input_tokens","input_tokens":${inputTokens}}`;
}
