import type { Protocol } from '../config/types.js';
import type { Usage } from '../money.js';
import { eventData } from './sse.js';
import type { Endpoint, Exchange } from './types.js';

/** Watches a relayed stream: which events pass, which one is final, what usage it reported. */
export interface StreamWatcher {
  /** Looks at one whole event; `forward: false` drops it, `final: true` holds it until the charge is settled. */
  see(event: string): { forward: boolean; final: boolean };
  /** The usage the stream reported, or null if it never did. */
  usage(): Usage | null;
}

/** What differs between upstream protocols: paths, credentials, body changes, usage. */
export interface ProtocolAdapter {
  /** The upstream path (appended to baseUrl) for an endpoint, or null when this protocol has none. */
  path(endpoint: Endpoint): string | null;
  /** The credential header for the provider's key, as name/value pairs (built once per provider). */
  credentials(apiKey: string | null): string[];
  /** Protocol headers of one call, as name/value pairs. */
  headers(ex: Exchange): readonly string[];
  /** The client's body rewritten for upstream (model swapped, usage requested, thinking on). */
  body(ex: Exchange): Record<string, unknown>;
  /** Usage from a complete JSON answer, or null. */
  usage(json: unknown): Usage | null;
  /** A watcher for one stream; also counts the generated characters for estimates. */
  watch(ex: Exchange): StreamWatcher;
}

const NO_HEADERS: readonly string[] = Object.freeze([]);

const int = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? Math.floor(v) : 0);
const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function openaiUsage(u: unknown): Usage | null {
  if (!isObj(u)) return null;
  const cached = isObj(u.prompt_tokens_details) ? int(u.prompt_tokens_details.cached_tokens) : 0;
  const prompt = int(u.prompt_tokens);
  return { inputTokens: Math.max(0, prompt - cached), outputTokens: int(u.completion_tokens), cacheReadTokens: cached, cacheWriteTokens: 0 };
}

/**
 * A copy of the client's body with the upstream model. Copied whole, then `model` assigned:
 * `{ ...body, model }` would define `model` again through V8's slow path on every call.
 */
function upstreamBody(ex: Exchange): Record<string, unknown> {
  const body = { ...ex.body };
  body.model = ex.model.upstreamModel;
  return body;
}

const openai: ProtocolAdapter = {
  path: (endpoint) => (endpoint === 'chat' ? '/chat/completions' : endpoint === 'embeddings' ? '/embeddings' : null),

  credentials: (apiKey) => (apiKey === null ? [] : ['authorization', `Bearer ${apiKey}`]),

  headers: () => NO_HEADERS,

  body(ex) {
    const body = upstreamBody(ex);
    if (ex.stream) {
      // Usage is how the call is metered: always ask for it (the extra chunk is removed again
      // below when the client did not ask for it).
      const options = isObj(body.stream_options) ? body.stream_options : {};
      body.stream_options = { ...options, include_usage: true };
    }
    return body;
  },

  usage: (json) => (isObj(json) ? openaiUsage(json.usage) : null),

  watch(ex) {
    const clientAsked = isObj(ex.body.stream_options) && ex.body.stream_options.include_usage === true;
    let usage: Usage | null = null;
    return {
      see(event) {
        const data = eventData(event);
        if (data === null) return { forward: true, final: false };
        if (data === '[DONE]') return { forward: true, final: true };
        let chunk: unknown;
        try {
          chunk = JSON.parse(data);
        } catch {
          return { forward: true, final: false };
        }
        if (!isObj(chunk)) return { forward: true, final: false };
        const choices = Array.isArray(chunk.choices) ? chunk.choices : [];
        for (const choice of choices) {
          const delta = isObj(choice) && isObj(choice.delta) ? choice.delta : null;
          if (delta === null) continue;
          if (typeof delta.content === 'string') ex.noteOutput(delta.content.length);
          if (Array.isArray(delta.tool_calls)) ex.noteOutput(JSON.stringify(delta.tool_calls).length);
        }
        const seen = openaiUsage(chunk.usage);
        if (seen !== null) {
          usage = seen;
          if (!clientAsked && choices.length === 0) return { forward: false, final: false };
        }
        return { forward: true, final: false };
      },
      usage: () => usage,
    };
  },
};

function anthropicUsage(u: unknown, into: Usage | null): Usage | null {
  if (!isObj(u)) return into;
  const next: Usage = into ?? { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };
  // message_delta carries cumulative counts; take each field when present.
  if (u.input_tokens !== undefined && u.input_tokens !== null) next.inputTokens = int(u.input_tokens);
  if (u.output_tokens !== undefined && u.output_tokens !== null) next.outputTokens = int(u.output_tokens);
  if (u.cache_read_input_tokens !== undefined && u.cache_read_input_tokens !== null) next.cacheReadTokens = int(u.cache_read_input_tokens);
  if (u.cache_creation_input_tokens !== undefined && u.cache_creation_input_tokens !== null) {
    next.cacheWriteTokens = int(u.cache_creation_input_tokens);
  }
  return next;
}

const THINKING_BUDGET = 1024; // Anthropic's minimum budget_tokens

/** Extended thinking for a `-thinking` id: the budget, and max_tokens raised when it leaves no room. */
export function thinkingLimits(maxTokens: number): { budget: number; maxTokens: number } {
  const budget = Math.max(THINKING_BUDGET, Math.floor(maxTokens / 2));
  return { budget, maxTokens: maxTokens <= budget ? budget + THINKING_BUDGET : maxTokens };
}

const anthropic: ProtocolAdapter = {
  path: (endpoint) => (endpoint === 'messages' ? '/v1/messages' : null),

  credentials: (apiKey) => (apiKey === null ? [] : ['x-api-key', apiKey]),

  headers(ex) {
    const headers = ['anthropic-version', ex.header('anthropic-version') ?? '2023-06-01'];
    const beta = ex.header('anthropic-beta');
    if (beta !== undefined) headers.push('anthropic-beta', beta);
    return headers;
  },

  body(ex) {
    const body = upstreamBody(ex);
    if (body.max_tokens === undefined) body.max_tokens = ex.maxOutputTokens; // required upstream
    if (ex.model.thinking && body.thinking === undefined) {
      // A `-thinking` id: extended thinking on, within the client's output budget where it allows.
      const limits = thinkingLimits(body.max_tokens as number);
      body.max_tokens = limits.maxTokens;
      body.thinking = { type: 'enabled', budget_tokens: limits.budget };
    }
    return body;
  },

  usage: (json) => (isObj(json) ? anthropicUsage(json.usage, null) : null),

  watch(ex) {
    let usage: Usage | null = null;
    return {
      see(event) {
        const data = eventData(event);
        if (data === null) return { forward: true, final: false };
        let msg: unknown;
        try {
          msg = JSON.parse(data);
        } catch {
          return { forward: true, final: false };
        }
        if (!isObj(msg)) return { forward: true, final: false };
        switch (msg.type) {
          case 'message_start':
            if (isObj(msg.message)) usage = anthropicUsage(msg.message.usage, usage);
            break;
          case 'message_delta':
            usage = anthropicUsage(msg.usage, usage);
            break;
          case 'content_block_delta': {
            const d = isObj(msg.delta) ? msg.delta : {};
            for (const field of ['text', 'thinking', 'partial_json']) {
              if (typeof d[field] === 'string') ex.noteOutput((d[field] as string).length);
            }
            break;
          }
          case 'message_stop':
            return { forward: true, final: true };
        }
        return { forward: true, final: false };
      },
      usage: () => usage,
    };
  },
};

export const ADAPTERS: Record<Exclude<Protocol, 'mock'>, ProtocolAdapter> = { openai, anthropic };

/** Whether a model of this protocol can answer this endpoint (the mock answers every one). */
export function supports(protocol: Protocol, endpoint: Endpoint): boolean {
  return protocol === 'mock' || ADAPTERS[protocol].path(endpoint) !== null;
}
