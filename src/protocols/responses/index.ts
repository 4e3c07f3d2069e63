import type { Usage } from '../../money.js';
import { dataTypeIs, eventData, eventName } from '../../providers/sse.js';
import {
  ABSENT, bad, checkBasics, checkServiceTier, count, echo, INVALID, isObj, modelSwapped, outputLimits, partsText, pieces, pump, sendJson, sseEvent,
  textChars, tokensOf, unpricedTool,
} from '../common.js';
import type { WireProtocol } from '../types.js';

/**
 * The OpenAI Responses API: POST /v1/responses, plain or SSE. A stream is named events
 * (`response.created`, `response.in_progress`, `response.output_item.added`, …deltas…,
 * `…done`, then `response.completed`, `response.incomplete` or `response.failed`, which carry
 * the whole response with its usage), each with `type` and `sequence_number`; no `[DONE]`.
 * The gateway keeps no responses: `store` and `previous_response_id` are the provider's business.
 */

/**
 * Usage of a response: `input_tokens` includes the cached ones; `output_tokens` includes
 * reasoning. Each `web_search_call` of its output is a search, billed by the call (found in
 * review: none was charged).
 */
export function responsesUsage(response: Record<string, unknown>): Usage | null {
  const u = response.usage;
  if (!isObj(u)) return null;
  const input = count(u.input_tokens);
  const output = count(u.output_tokens);
  const cached = isObj(u.input_tokens_details) ? count(u.input_tokens_details.cached_tokens) : ABSENT;
  if (input < 0 || output < 0 || cached === INVALID) return null;
  const cacheRead = Math.min(Math.max(cached, 0), input);
  return { inputTokens: input - cacheRead, outputTokens: output, cacheReadTokens: cacheRead, cacheWriteTokens: 0, webSearches: searchesIn(response.output) };
}

const WEB_SEARCH_CALL = Buffer.from('"web_search_call"');

/** The web searches among a response's output items. */
function searchesIn(output: unknown): number {
  if (!Array.isArray(output)) return 0;
  let n = 0;
  for (const item of output) if (isObj(item) && item.type === 'web_search_call') n++;
  return n;
}

/**
 * Hosted tools billed by the call or the session at prices a model's config has no place for:
 * refused when the call goes to OpenAI as it is, so no call runs up a bill the gateway cannot
 * charge (found in review); translated for another provider, they are dropped. Web search is
 * priced (`webSearchPerThousand`).
 */
const UNPRICED_TOOLS = new Set(['file_search', 'code_interpreter', 'image_generation']);

/** The events that end a stream: each carries the final response (and its usage). */
const FINAL = new Set(['response.completed', 'response.incomplete', 'response.failed']);
/** The events whose `delta` is generated output. */
const DELTAS = new Set([
  'response.output_text.delta', 'response.refusal.delta', 'response.function_call_arguments.delta', 'response.reasoning_text.delta',
  'response.reasoning_summary_text.delta', 'response.custom_tool_call_input.delta',
]);
const OUTPUT = new Set(['text', 'arguments', 'refusal', 'input']);
const PASS = { forward: true, final: false } as const;
/**
 * Events that carry nothing to meter. OpenAI echoes the instructions and tools in `created` and
 * `in_progress`, and the `done` events repeat the whole output: tens of kilobytes for an agent.
 */
const PASSING = new Set([
  'response.created', 'response.in_progress', 'response.queued', 'response.output_item.added', 'response.output_item.done',
  'response.content_part.added', 'response.content_part.done', 'response.output_text.done', 'response.refusal.done',
  'response.function_call_arguments.done', 'response.reasoning_summary_part.added', 'response.reasoning_summary_part.done',
  'response.reasoning_summary_text.done', 'response.reasoning_text.done', 'response.output_text.annotation.added',
]);

/** A passing event that may carry an item the watcher meters: a web search that started, an MCP server's answer. */
function mayMeter(name: string, event: string): boolean {
  return (name === 'response.output_item.added' && event.includes('web_search_call')) || (name === 'response.output_item.done' && event.includes('"mcp_'));
}

/** An input item's text (a message's content, a tool's output). */
function itemText(item: unknown): string {
  if (typeof item === 'string') return item;
  if (!isObj(item)) return '';
  if (item.type === 'function_call_output' || item.type === 'custom_tool_call_output') return typeof item.output === 'string' ? item.output : '';
  return partsText(item.content);
}

/** Characters of the input's text, instructions included (the mock's input count). */
export function inputChars(body: Record<string, unknown>): number {
  let n = typeof body.instructions === 'string' ? body.instructions.length : 0;
  if (typeof body.input === 'string') return n + body.input.length;
  if (Array.isArray(body.input)) for (const item of body.input) n += itemText(item).length;
  return n;
}

/** The text of the last user message of the input (what the mock says back). */
function lastUserText(body: Record<string, unknown>): string {
  if (typeof body.input === 'string') return body.input;
  if (!Array.isArray(body.input)) return '';
  for (let i = body.input.length - 1; i >= 0; i--) {
    const item = body.input[i] as unknown;
    if (isObj(item) && item.role === 'user' && (item.type === undefined || item.type === 'message')) return partsText(item.content);
  }
  return '';
}

export const responses: WireProtocol = {
  endpoint: 'responses',
  path: '/v1/responses',
  anthropic: false,

  check(body) {
    const basic = checkBasics(body);
    if (basic !== null) return basic;
    const b = body as Record<string, unknown>;
    const input = b.input;
    if (input === undefined || input === null) {
      // A reusable prompt or a stored conversation may stand for the input.
      if (b.previous_response_id === undefined && b.prompt === undefined && b.conversation === undefined) {
        return bad('input', '"input" is required: a string or an array of input items.');
      }
    } else if (typeof input !== 'string' && !Array.isArray(input)) {
      return bad('input', '"input" must be a string or an array of input items.');
    }
    const limits = outputLimits(b, ['max_output_tokens']);
    if (!Array.isArray(limits)) return limits;
    // A background response is answered before it is generated ("queued", no usage): the call
    // would be charged its input estimate alone while the provider bills the whole generation
    // (found in review). The gateway meters a call from its answer.
    if (b.background === true) return bad('background', '"background" responses are not supported by this gateway: it meters each call from its answer.');
    const tier = checkServiceTier(b);
    if (tier !== null) return tier;
    return { ok: true, call: { body: b, model: b.model as string, stream: b.stream === true, maxTokens: limits[0]?.[1] ?? null, limits, choices: 1 } };
  },

  outputBudget: (call, model) => call.maxTokens ?? model.maxOutputTokens,

  passThroughRefusal: (call) => unpricedTool(call.body, (type) => UNPRICED_TOOLS.has(type)),

  upstreamBody: modelSwapped,

  usage: (json) => (isObj(json) ? responsesUsage(json) : null),

  billsOutsideUsage: (answer) => answer.includes(WEB_SEARCH_CALL),

  searchesOf: (json) => (isObj(json) ? searchesIn(json.output) : 0),

  outputChars: (json) => (isObj(json) ? textChars(json.output, OUTPUT) : 0),

  watch(ex) {
    let usage: Usage | null = null;
    let searches = 0;
    // What a remote MCP server answered (a call's output, a server's tool list) joins the input,
    // billed there, and shows no count before the final usage: its characters count as input
    // not yet reported for an abnormal end (found in review: a client that left after a call
    // brought in 100,000 characters was charged the words it sent).
    let mcpChars = 0;
    const mcpDone = (item: unknown, chars: number) => {
      if (!isObj(item) || (item.type !== 'mcp_call' && item.type !== 'mcp_list_tools')) return;
      mcpChars += chars; // the event's, a little more than its output or tool list
      ex.noteUnreportedInput(tokensOf(mcpChars));
    };
    const searched = (n: number) => {
      searches = n;
      // No tokens reported yet: an abnormal end is charged the input estimate, the output relayed, and these.
      ex.noteUsage({ inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: n });
    };
    return {
      see(event) {
        // Known events that only pass through, some of them large, are skipped by name unparsed
        // when their data says the same type first; anything else (an unknown or odd name, or
        // none, or data of another type) is read from its data's `type`.
        // Items that may be a web search that started (billed even if the stream ends before
        // its usage) or an MCP server's answer are read, below; they are looked for in the
        // event's text first: most items are messages.
        const name = eventName(event);
        if (name !== null && PASSING.has(name) && dataTypeIs(event, name) && !mayMeter(name, event)) return PASS;
        const data = eventData(event);
        if (data === null) return PASS;
        let msg: unknown;
        try {
          msg = JSON.parse(data);
        } catch {
          return PASS;
        }
        if (!isObj(msg) || typeof msg.type !== 'string') return PASS;
        if (msg.type === 'response.output_item.added') {
          if (isObj(msg.item) && msg.item.type === 'web_search_call') searched(searches + 1);
          return PASS;
        }
        if (msg.type === 'response.output_item.done') {
          mcpDone(msg.item, data.length);
          return PASS;
        }
        if (DELTAS.has(msg.type)) {
          if (typeof msg.delta === 'string') ex.noteOutput(msg.delta.length);
        } else if (FINAL.has(msg.type)) {
          // The last event: its response carries the usage; it leaves once the charge is settled.
          usage = isObj(msg.response) ? responsesUsage(msg.response) : null;
          // The searches seen started count even when the final response leaves them out.
          if (usage !== null && searches > (usage.webSearches ?? 0)) usage.webSearches = searches;
          if (usage !== null) ex.noteUsage(usage);
          else if (isObj(msg.response)) {
            // Usage not believable: an estimate, with the searches the response lists (found in review).
            const listed = searchesIn(msg.response.output);
            if (listed > searches) searched(listed);
          }
          return { forward: true, final: true };
        }
        return PASS;
      },
      usage: () => usage,
    };
  },

  mock(ex, tokensPerSecond) {
    const body = ex.body;
    const { text, truncated } = echo(lastUserText(body), ex.maxOutputTokens);
    const usage: Usage = { inputTokens: tokensOf(inputChars(body)), outputTokens: tokensOf(text.length), cacheReadTokens: 0, cacheWriteTokens: 0 };
    const id = `resp_${ex.requestId}`;
    const itemId = `msg_${ex.requestId}`;
    const base = {
      id, object: 'response', created_at: Math.floor(Date.now() / 1000), status: 'in_progress', error: null, incomplete_details: null,
      instructions: body.instructions ?? null, max_output_tokens: body.max_output_tokens ?? null, model: ex.model.upstreamModel, output: [] as unknown[],
      parallel_tool_calls: body.parallel_tool_calls ?? true, previous_response_id: body.previous_response_id ?? null,
      reasoning: { effort: null, summary: null }, store: body.store ?? true, temperature: body.temperature ?? 1, text: { format: { type: 'text' } },
      tool_choice: body.tool_choice ?? 'auto', tools: Array.isArray(body.tools) ? body.tools : [], top_p: body.top_p ?? 1,
      truncation: 'disabled', usage: null as unknown, user: null, metadata: isObj(body.metadata) ? body.metadata : {},
    };
    const part = { type: 'output_text', text, annotations: [] };
    const item = { id: itemId, type: 'message', status: truncated ? 'incomplete' : 'completed', role: 'assistant', content: [part] };
    const finished = {
      ...base, status: truncated ? 'incomplete' : 'completed', incomplete_details: truncated ? { reason: 'max_output_tokens' } : null,
      output: [item], usage: {
        input_tokens: usage.inputTokens, input_tokens_details: { cached_tokens: 0 }, output_tokens: usage.outputTokens,
        output_tokens_details: { reasoning_tokens: 0 }, total_tokens: usage.inputTokens + usage.outputTokens,
      },
    };
    if (!ex.stream) {
      ex.noteOutput(text.length);
      return ex.settle(usage, () => sendJson(ex, finished));
    }
    let sequence = 0;
    const event = (type: string, fields: Record<string, unknown>) => sseEvent(type, { type, sequence_number: sequence++, ...fields });
    const where = { item_id: itemId, output_index: 0, content_index: 0 };
    ex.head(200, 'text/event-stream', ['cache-control', 'no-cache']);
    ex.write(
      event('response.created', { response: base }) +
      event('response.in_progress', { response: base }) +
      event('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } }) +
      event('response.content_part.added', { ...where, part: { ...part, text: '' } }),
    );
    pump(ex, pieces(text), tokensPerSecond, (piece) => event('response.output_text.delta', { ...where, delta: piece, logprobs: [] }), () => {
      ex.write(
        event('response.output_text.done', { ...where, text, logprobs: [] }) +
        event('response.content_part.done', { ...where, part }) +
        event('response.output_item.done', { output_index: 0, item }),
      );
      ex.settle(usage, () => ex.end(event(truncated ? 'response.incomplete' : 'response.completed', { response: finished })));
    });
  },
};
