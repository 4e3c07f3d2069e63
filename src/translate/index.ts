import type { Protocol } from '../config/types.js';
import type { Endpoint } from '../protocols/types.js';
import { chatToMessages } from './chat-to-messages.js';
import { messagesToChat } from './messages-to-chat.js';
import { responsesToMessages } from './responses-to-messages.js';
import type { Translator } from './types.js';

/**
 * Translation between wire protocols (CONTRACT section 9): a model is called on an endpoint its
 * provider does not speak. One module per direction; passthrough never comes here.
 */
const TRANSLATORS: Partial<Record<Endpoint, Partial<Record<Exclude<Protocol, 'mock'>, Translator>>>> = {
  chat: { anthropic: chatToMessages },
  messages: { openai: messagesToChat },
  responses: { anthropic: responsesToMessages },
};

/** The translator from a client's endpoint to a provider's protocol, or null when there is none (yet). */
export function translatorFor(endpoint: Endpoint, protocol: Exclude<Protocol, 'mock'>): Translator | null {
  return TRANSLATORS[endpoint]?.[protocol] ?? null;
}

export { Untranslatable } from './common.js';
export { TranslatedCall } from './exchange.js';
export type { Translator } from './types.js';
