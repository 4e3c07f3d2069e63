import { MAX_TOKENS, type Usage } from '../../money.js';
import { eventData } from '../../providers/sse.js';
import {
  ABSENT, bad, checkBasics, checkMessages, count, echo, INVALID, isObj, lastUserText, messagesChars, modelSwapped, outputLimits, pieces, pump,
  sendJson, sseEvent, textChars, tokensOf, unpricedTool, withModel,
} from '../common.js';
import type { Checked, WireProtocol } from '../types.js';
import { readEvent, TextDelta } from './text-delta.js';

/** Anthropic Messages: POST /v1/messages, plain or SSE (`message_start` … `message_stop`). */

/**
 * Usage of a Messages answer merged into what was reported before (message_delta carries
 * cumulative counts; each field is taken when present). `input_tokens` excludes cache tokens.
 * Null when a count is not believable, or when input or output was never reported.
 */
export function messagesUsage(u: unknown, before: Usage | null): Usage | null {
  if (!isObj(u)) return null;
  const input = count(u.input_tokens);
  const output = count(u.output_tokens);
  const cacheRead = count(u.cache_read_input_tokens);
  const cacheWrite = count(u.cache_creation_input_tokens);
  // The writes kept for an hour, priced apart (found in review: all were priced as five-minute writes).
  const hour = isObj(u.cache_creation) ? count(u.cache_creation.ephemeral_1h_input_tokens) : ABSENT;
  // Searches of the web search server tool, billed by the search (found in review: not metered).
  const searches = isObj(u.server_tool_use) ? count(u.server_tool_use.web_search_requests) : ABSENT;
  if (input === INVALID || output === INVALID || cacheRead === INVALID || cacheWrite === INVALID || hour === INVALID || searches === INVALID) return null;
  const next: Usage = {
    inputTokens: input >= 0 ? input : before?.inputTokens ?? -1,
    outputTokens: output >= 0 ? output : before?.outputTokens ?? -1,
    cacheReadTokens: cacheRead >= 0 ? cacheRead : before?.cacheReadTokens ?? 0,
    cacheWriteTokens: cacheWrite >= 0 ? cacheWrite : before?.cacheWriteTokens ?? 0,
    cacheWrite1hTokens: 0,
    webSearches: searches >= 0 ? searches : before?.webSearches ?? 0,
  };
  next.cacheWrite1hTokens = Math.min(next.cacheWriteTokens, hour >= 0 ? hour : before?.cacheWrite1hTokens ?? 0);
  return next.inputTokens < 0 || next.outputTokens < 0 ? null : next;
}

/** A server tool's result that is an error (`{"type": "web_search_tool_result_error", ...}`). */
function isError(content: unknown): boolean {
  return isObj(content) && typeof content.type === 'string' && content.type.endsWith('_error');
}

/** What a stream has reported before its first usage: nothing. */
const NOTHING_YET: Usage = Object.freeze({ inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 });

/** What message_start's usage is merged into: its input is required, its output count may be absent. */
const NO_OUTPUT_YET: Usage = Object.freeze({ inputTokens: -1, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 });

const THINKING_BUDGET = 1024; // Anthropic's minimum budget_tokens

/** Extended thinking for a `-thinking` id: the budget, and max_tokens raised when it leaves no room. */
export function thinkingLimits(maxTokens: number): { budget: number; maxTokens: number } {
  const budget = Math.max(THINKING_BUDGET, Math.floor(maxTokens / 2));
  return { budget, maxTokens: maxTokens <= budget ? budget + THINKING_BUDGET : maxTokens };
}

const OUTPUT = new Set(['text', 'thinking', 'input']);

/**
 * What one content block says of web searches: +1 for a search the model started, -1 for a
 * search that failed (its result an error: Anthropic bills no search that errs, e.g. one past
 * `max_uses`), 0 for anything else.
 */
function searchOf(block: Record<string, unknown>): number {
  if (block.type === 'server_tool_use') return block.name === 'web_search' ? 1 : 0;
  if (block.type === 'web_search_tool_result') return isObj(block.content) && block.content.type === 'web_search_tool_result_error' ? -1 : 0;
  return 0;
}

/** The web searches an answer's content shows that ran (found in review: a count lower than these was believed). */
function searchesIn(content: unknown): number {
  if (!Array.isArray(content)) return 0;
  let n = 0;
  for (const block of content) if (isObj(block)) n = Math.max(0, n + searchOf(block));
  return n;
}

/** Output a content block starts with: none in a real stream (text '', input {}), where deltas carry it all. */
function startingChars(block: Record<string, unknown>): number {
  let n = 0;
  if (typeof block.text === 'string') n += block.text.length;
  if (typeof block.thinking === 'string') n += block.thinking.length;
  if (isObj(block.input)) {
    for (const _ in block.input) {
      n += JSON.stringify(block.input).length;
      break;
    }
  }
  return n;
}

/**
 * An answer that may have searched the web (its content blocks are read with its usage then):
 * a `server_tool_use` of web_search names it so; other server tools (web fetch, with a whole
 * document in its answer) are not parsed whole for nothing (found in review).
 */
const WEB_SEARCH = Buffer.from('"name":"web_search"');

/**
 * Anthropic's code execution tool is billed by the container-hour, at a price a model's config
 * has no place for: refused when the call goes to Anthropic as it is, so no call runs up a
 * bill the gateway cannot charge. (Web search is priced, `webSearchPerThousand`; web fetch
 * bills only its tokens, which the usage counts.)
 */
const unpricedServerTool = (type: string): boolean => type.startsWith('code_execution');

/**
 * Anthropic bills a call past 200k input tokens at its long-context prices (about twice the
 * input price) under the `context-1m` beta, which no model's price covers: refused (found in
 * review). The other betas change no price a model's config cannot set.
 */
function unpricedBeta(beta: string | string[] | undefined): { message: string; param: string } | null {
  if (beta === undefined || !String(beta).toLowerCase().includes('context-1m')) return null;
  return { param: 'anthropic-beta', message: 'The "context-1m" beta is billed by the provider at long-context prices this gateway does not charge.' };
}

/**
 * Anthropic's request fields that raise its prices, which no model's price covers, so a key
 * holder could make the provider's bill outrun the charge (found in review): `speed: "fast"`
 * (fast mode, 2 to 6 times the standard prices) and `inference_geo` other than "global" (US-only
 * inference, 1.1 times). As OpenAI's priority `service_tier` is (checkServiceTier).
 */
function unpricedSpeedOrGeo(b: Record<string, unknown>): Checked | null {
  if (b.speed !== undefined && b.speed !== null && b.speed !== 'standard') {
    return bad('speed', 'This gateway prices calls at the standard speed: "speed" may be "standard" (fast mode is billed by the provider at premium prices).');
  }
  if (b.inference_geo !== undefined && b.inference_geo !== null && b.inference_geo !== 'global') {
    return bad('inference_geo', 'This gateway prices calls at global inference: "inference_geo" may be "global" (a regional one is billed by the provider at a premium).');
  }
  return null;
}

/** What the mock counts for count_tokens: the same characters it meters a call's input by. */
export const countChars = messagesChars;

export const messages: WireProtocol = {
  endpoint: 'messages',
  path: '/v1/messages',
  anthropic: true,

  check(body) {
    const basic = checkBasics(body);
    if (basic !== null) return basic;
    const b = body as Record<string, unknown>;
    const msgs = checkMessages(b) ?? unpricedSpeedOrGeo(b);
    if (msgs !== null) return msgs;
    const limits = outputLimits(b, ['max_tokens']);
    if (!Array.isArray(limits)) return limits;
    return { ok: true, call: { body: b, model: b.model as string, stream: b.stream === true, maxTokens: limits[0]?.[1] ?? null, limits, choices: 1 } };
  },

  passThroughRefusal: (call, headers) => unpricedTool(call.body, unpricedServerTool) ?? unpricedBeta(headers['anthropic-beta']),

  outputBudget(call, model) {
    const budget = call.maxTokens ?? model.maxOutputTokens;
    // A `-thinking` id on Anthropic raises max_tokens (upstreamBody): reserve for what it may produce.
    return model.thinking && model.provider.protocol === 'anthropic' ? thinkingLimits(budget).maxTokens : budget;
  },

  upstreamBody(ex) {
    // A client's `max_tokens: null` (which the check lets through as "no limit") is set too.
    if (ex.body.max_tokens != null && (!ex.model.thinking || ex.body.thinking !== undefined)) return modelSwapped(ex);
    const body = withModel(ex);
    if (body.max_tokens == null) body.max_tokens = ex.maxOutputTokens; // required upstream
    if (ex.model.thinking && body.thinking === undefined) {
      // A `-thinking` id: extended thinking on, within the client's output budget where it allows.
      const limits = thinkingLimits(body.max_tokens as number);
      body.max_tokens = limits.maxTokens;
      body.thinking = { type: 'enabled', budget_tokens: limits.budget };
    }
    return JSON.stringify(body);
  },

  usage(json) {
    if (!isObj(json)) return null;
    const usage = messagesUsage(json.usage, null);
    const searches = searchesIn(json.content);
    if (usage !== null && searches > (usage.webSearches ?? 0)) usage.webSearches = searches;
    return usage;
  },

  billsOutsideUsage: (answer) => answer.includes(WEB_SEARCH),

  searchesOf: (json) => (isObj(json) ? searchesIn(json.content) : 0),

  outputChars: (json) => (isObj(json) ? textChars(json.content, OUTPUT) : 0),

  watch(ex) {
    let usage: Usage | null = null;
    // Final from message_delta's count, until output comes after it (found in review: an early
    // message_delta of 1 output token was charged as final for 40,000 characters after it).
    let final = false;
    // Web searches the model started: billed even if the stream ends before message_delta gives
    // the count, and a count lower than this is not believed (found in review: a count of 0
    // after two searches, or a search before any usage, was charged none).
    let searches = 0; // started, less those that failed
    const withSearches = (u: Usage): Usage => (searches > (u.webSearches ?? 0) ? { ...u, webSearches: searches } : u);
    // What server tools brought into the context (a fetched page, search results, a run's
    // output) is billed as input, and came after message_start's count: its characters count
    // until a count that includes them, a message_delta's input (found in review: a fetched
    // page of 100,000 tokens was charged nothing when the client left before message_delta).
    // An estimate, so not a reported count (a final count is never taken below those): noted
    // as input not yet reported, which an abnormal end adds to the reported input.
    let resultChars = 0;
    const withResults = (u: Usage): Usage => (resultChars === 0 ? u : { ...u, inputTokens: Math.min(MAX_TOKENS, u.inputTokens + tokensOf(resultChars)) });
    // Before any usage, an abnormal end is charged the input estimate, the output relayed, and the searches.
    const note = () => ex.noteUsage(withSearches(usage ?? NOTHING_YET));
    return {
      see(event) {
        const data = eventData(event);
        if (data === null) return { forward: true, final: false };
        let msg: unknown;
        try {
          msg = ex.parsedEvents === undefined ? readEvent(data) : ex.parsedEvents.parse(data, readEvent, event);
        } catch {
          return { forward: true, final: false };
        }
        if (msg instanceof TextDelta) {
          // Most events of a long answer, counted without JSON.parse.
          ex.noteOutput(msg.chars);
          if (msg.chars > 0) final = false;
          return { forward: true, final: false };
        }
        if (!isObj(msg)) return { forward: true, final: false };
        switch (msg.type) {
          case 'message_start': {
            // Input and a first output count: real, but not final. (Some compatible servers
            // send no output count here: 0 then, so the input they report is not lost.)
            const seen = isObj(msg.message) ? messagesUsage(msg.message.usage, NO_OUTPUT_YET) : null;
            if (seen !== null) {
              usage = seen;
              note();
            }
            break;
          }
          case 'message_delta': {
            // The final output count is this event's own: without one, message_start's (often
            // 1) would be taken as final for the whole answer. Not final then: an estimate.
            const seen = isObj(msg.usage) && count(msg.usage.output_tokens) >= 0 ? messagesUsage(msg.usage, usage) : null;
            if (seen !== null) {
              if (resultChars > 0 && count((msg.usage as Record<string, unknown>).input_tokens) >= 0) {
                resultChars = 0; // a cumulative input count includes them
                ex.noteUnreportedInput(0);
              }
              usage = seen;
              final = true;
              note();
            }
            break;
          }
          case 'content_block_start': {
            const block = isObj(msg.content_block) ? msg.content_block : {};
            const search = searchOf(block);
            if (search !== 0) {
              // Never below none: an error result before any search cancels nothing later (found in review).
              searches = Math.max(0, searches + search);
              note();
            }
            // (An error result, such as a search past max_uses, brings in nothing billed.)
            if (typeof block.type === 'string' && block.type.endsWith('_tool_result') && !isError(block.content)) {
              resultChars += data.length;
              ex.noteUnreportedInput(tokensOf(resultChars));
            }
            // A block may start with output in it (a client shows it): counted, and it makes an
            // earlier count not final (found in review).
            const chars = startingChars(block);
            if (chars > 0) {
              ex.noteOutput(chars);
              final = false;
            }
            break;
          }
          case 'content_block_delta': {
            const d = isObj(msg.delta) ? msg.delta : {};
            for (const field of ['text', 'thinking', 'partial_json']) {
              const piece = d[field];
              if (typeof piece === 'string' && piece.length > 0) {
                ex.noteOutput(piece.length);
                final = false;
              }
            }
            break;
          }
          case 'message_stop':
            return { forward: true, final: true };
        }
        return { forward: true, final: false };
      },
      usage: () => (final && usage !== null ? withSearches(withResults(usage)) : null),
    };
  },

  mock(ex, tokensPerSecond) {
    const { text, truncated } = echo(lastUserText(ex.body), ex.maxOutputTokens);
    const usage: Usage = { inputTokens: tokensOf(messagesChars(ex.body)), outputTokens: tokensOf(text.length), cacheReadTokens: 0, cacheWriteTokens: 0 };
    const stopReason = truncated ? 'max_tokens' : 'end_turn';
    if (!ex.stream) {
      ex.noteOutput(text.length);
      return ex.settle(usage, () => sendJson(ex, {
        id: `msg_${ex.requestId}`, type: 'message', role: 'assistant', model: ex.model.upstreamModel, content: [{ type: 'text', text }],
        stop_reason: stopReason, stop_sequence: null, usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
      }));
    }
    ex.head(200, 'text/event-stream', ['cache-control', 'no-cache']);
    ex.noteUsage({ inputTokens: usage.inputTokens, outputTokens: 1, cacheReadTokens: 0, cacheWriteTokens: 0 }); // as message_start says
    ex.write(
      sseEvent('message_start', { type: 'message_start', message: {
        id: `msg_${ex.requestId}`, type: 'message', role: 'assistant', model: ex.model.upstreamModel, content: [],
        stop_reason: null, stop_sequence: null, usage: { input_tokens: usage.inputTokens, output_tokens: 1 } } }) +
      sseEvent('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }) +
      sseEvent('ping', { type: 'ping' }),
    );
    const delta = (piece: string) => sseEvent('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: piece } });
    pump(ex, pieces(text), tokensPerSecond, delta, () => {
      ex.write(sseEvent('content_block_stop', { type: 'content_block_stop', index: 0 }));
      ex.settle(usage, () => ex.end(
        sseEvent('message_delta', { type: 'message_delta', delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: usage.outputTokens } }) +
        sseEvent('message_stop', { type: 'message_stop' }),
      ));
    });
  },
};
