import type { AuthHeader, Protocol } from '../config/types.js';
import type { Endpoint } from '../protocols/types.js';
import type { CountEndpoint } from '../translate/count.js';

/**
 * What differs between the kinds of upstream (the wire protocols themselves live in
 * src/protocols/): which endpoints a kind serves and where, and how it is authenticated.
 */
export interface ProviderKind {
  /** The upstream path (appended to baseUrl) of each endpoint the kind serves. */
  readonly paths: Readonly<Partial<Record<Endpoint, string>>>;
  /**
   * The kind's token count (free) and the protocol of the bodies it takes: Anthropic's
   * count_tokens (Messages), OpenAI's /responses/input_tokens (Responses), which can also see a
   * stored context a call continues, and so counts calls before they are sent.
   */
  readonly count: { readonly path: string; readonly endpoint: CountEndpoint };
  /** How the key is sent unless the provider says otherwise (`authHeader`). */
  readonly authHeader: AuthHeader;
  /** Headers of one call taken from the client's request, as name/value pairs. */
  headers(header: (name: string) => string | undefined): readonly string[];
}

const NO_HEADERS: readonly string[] = Object.freeze([]);

export const KINDS: Readonly<Record<Exclude<Protocol, 'mock'>, ProviderKind>> = {
  openai: {
    paths: { chat: '/chat/completions', responses: '/responses', embeddings: '/embeddings' },
    count: { path: '/responses/input_tokens', endpoint: 'responses' },
    authHeader: 'bearer',
    headers: () => NO_HEADERS,
  },
  anthropic: {
    paths: { messages: '/v1/messages' },
    count: { path: '/v1/messages/count_tokens', endpoint: 'messages' },
    authHeader: 'x-api-key',
    headers(header) {
      const headers = ['anthropic-version', header('anthropic-version') ?? '2023-06-01'];
      const beta = header('anthropic-beta');
      if (beta !== undefined) headers.push('anthropic-beta', beta);
      return headers;
    },
  },
};

/** Whether a model of this protocol can answer this endpoint (the mock answers every one). */
export function supports(protocol: Protocol, endpoint: Endpoint): boolean {
  return protocol === 'mock' || KINDS[protocol].paths[endpoint] !== undefined;
}

/** The credential header pair for `apiKey`, sent as `authHeader` says. */
export function credential(authHeader: AuthHeader, apiKey: string): [string, string] {
  return authHeader === 'bearer' ? ['authorization', `Bearer ${apiKey}`] : [authHeader, apiKey];
}
