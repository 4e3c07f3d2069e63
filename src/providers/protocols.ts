import type { Protocol } from '../config/types.js';
import { MAX_TOKENS, type Usage } from '../money.js';
import { eventData } from './sse.js';
import type { Endpoint, Exchange } from './types.js';

/**
 * Watches a relayed stream: which events pass, which one is final, what usage it reported.
 * Usage reported before the final count (Anthropic's `message_start`) goes to
 * `Exchange.noteUsage`; `usage()` is only ever the final count.
 */
export interface StreamWatcher {
  /** Looks at one whole event; `forward: false` drops it, `final: true` holds it until the charge is settled. */
  see(event: string): { forward: boolean; final: boolean };
  /** The final usage the stream reported, or null if it has not (yet). */
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
  /** Usage from a complete JSON answer, or null (none, or not believable). */
  usage(json: unknown): Usage | null;
  /** Characters of generated output in a complete JSON answer (its estimate when usage is missing). */
  outputChars(json: unknown): number;
  /** A watcher for one stream; also counts the generated characters for estimates. */
  watch(ex: Exchange): StreamWatcher;
}

const NO_HEADERS: readonly string[] = Object.freeze([]);

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

const ABSENT = -1;
const INVALID = -2;
/**
 * A token count as a provider reported it: an integer from 0 to MAX_TOKENS (a fraction is
 * rounded down), ABSENT when missing, INVALID when it is anything else. Usage with an invalid
 * count is not believed: the call is then charged an estimate instead.
 */
function count(v: unknown): number {
  if (v === undefined || v === null) return ABSENT;
  if (typeof v !== 'number' || !(v >= 0) || v > MAX_TOKENS) return INVALID;
  return Math.floor(v);
}

function openaiUsage(u: unknown): Usage | null {
  if (!isObj(u)) return null;
  const prompt = count(u.prompt_tokens);
  const completion = count(u.completion_tokens); // absent in embeddings
  const cached = isObj(u.prompt_tokens_details) ? count(u.prompt_tokens_details.cached_tokens) : ABSENT;
  if (prompt < 0 || completion === INVALID || cached === INVALID) return null;
  const cacheRead = Math.min(Math.max(cached, 0), prompt); // prompt_tokens includes the cached ones
  return { inputTokens: prompt - cacheRead, outputTokens: Math.max(completion, 0), cacheReadTokens: cacheRead, cacheWriteTokens: 0 };
}

/** Text characters of a JSON value's strings under `fields` of each object (iterative; bounded input). */
function textChars(value: unknown, fields: ReadonlySet<string>): number {
  let n = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (Array.isArray(v)) {
      for (const item of v) stack.push(item);
    } else if (isObj(v)) {
      for (const key of Object.keys(v)) {
        const field = v[key];
        if (typeof field === 'string') {
          if (fields.has(key)) n += field.length;
        } else if (typeof field === 'object' && field !== null) {
          // Tool inputs are objects in Anthropic's answers: their JSON is generated output.
          if (key === 'input' && fields.has('input')) n += JSON.stringify(field).length;
          else stack.push(field);
        }
      }
    }
  }
  return n;
}

const OPENAI_OUTPUT = new Set(['content', 'refusal', 'arguments', 'reasoning_content']);
const ANTHROPIC_OUTPUT = new Set(['text', 'thinking', 'input']);

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

  outputChars: (json) => (isObj(json) ? textChars(json.choices, OPENAI_OUTPUT) : 0),

  watch(ex) {
    const clientAsked = isObj(ex.body.stream_options) && ex.body.stream_options.include_usage === true;
    let usage: Usage | null = null;
    // Final only from the usage chunk (no choices, sent last) or at [DONE]: some compatible
    // servers report running usage in every chunk, which is not final if the stream breaks off.
    let final = false;
    return {
      see(event) {
        const data = eventData(event);
        if (data === null) return { forward: true, final: false };
        if (data === '[DONE]') {
          final = true;
          return { forward: true, final: true };
        }
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
          if (typeof delta.refusal === 'string') ex.noteOutput(delta.refusal.length);
          if (typeof delta.reasoning_content === 'string') ex.noteOutput(delta.reasoning_content.length);
          if (Array.isArray(delta.tool_calls)) ex.noteOutput(JSON.stringify(delta.tool_calls).length);
        }
        const seen = openaiUsage(chunk.usage);
        if (seen !== null) {
          usage = seen;
          ex.noteUsage(seen);
          if (choices.length === 0) {
            final = true;
            if (!clientAsked) return { forward: false, final: false };
          }
        }
        return { forward: true, final: false };
      },
      usage: () => (final ? usage : null),
    };
  },
};

/**
 * Anthropic usage merged into what was reported before (message_delta carries cumulative
 * counts; each field is taken when present). Null when a count is not believable, or when
 * input or output was never reported.
 */
function anthropicUsage(u: unknown, before: Usage | null): Usage | null {
  if (!isObj(u)) return null;
  const input = count(u.input_tokens);
  const output = count(u.output_tokens);
  const cacheRead = count(u.cache_read_input_tokens);
  const cacheWrite = count(u.cache_creation_input_tokens);
  if (input === INVALID || output === INVALID || cacheRead === INVALID || cacheWrite === INVALID) return null;
  const next: Usage = {
    inputTokens: input >= 0 ? input : before?.inputTokens ?? ABSENT,
    outputTokens: output >= 0 ? output : before?.outputTokens ?? ABSENT,
    cacheReadTokens: cacheRead >= 0 ? cacheRead : before?.cacheReadTokens ?? 0,
    cacheWriteTokens: cacheWrite >= 0 ? cacheWrite : before?.cacheWriteTokens ?? 0,
  };
  return next.inputTokens < 0 || next.outputTokens < 0 ? null : next;
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

  outputChars: (json) => (isObj(json) ? textChars(json.content, ANTHROPIC_OUTPUT) : 0),

  watch(ex) {
    let usage: Usage | null = null;
    let final = false;
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
          case 'message_start': {
            // Input and a first output count: real, but not final.
            const seen = isObj(msg.message) ? anthropicUsage(msg.message.usage, null) : null;
            if (seen !== null) {
              usage = seen;
              ex.noteUsage(seen);
            }
            break;
          }
          case 'message_delta': {
            const seen = anthropicUsage(msg.usage, usage);
            if (seen !== null) {
              usage = seen;
              final = true;
              ex.noteUsage(seen);
            }
            break;
          }
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
      usage: () => (final ? usage : null),
    };
  },
};

export const ADAPTERS: Record<Exclude<Protocol, 'mock'>, ProtocolAdapter> = { openai, anthropic };

/** Whether a model of this protocol can answer this endpoint (the mock answers every one). */
export function supports(protocol: Protocol, endpoint: Endpoint): boolean {
  return protocol === 'mock' || ADAPTERS[protocol].path(endpoint) !== null;
}
