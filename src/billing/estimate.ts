import { costMicro, MAX_TOKENS, type Price } from '../money.js';
import type { CallRequest } from '../protocols/types.js';

/**
 * The gateway's estimate of what a request bills as input, before the provider says: it
 * sizes the reservation at admission, and the charge of a call that ends without the
 * provider's final usage. It counts everything the providers bill as input, not only the
 * last message: every key and value under the request's input fields (system prompt,
 * messages with their tool calls and tool results, tool definitions, response formats,
 * Responses `input`, `instructions` and a stored prompt's `variables`), 4 characters to a
 * token, and a fixed number of tokens per image and per document, file or audio part for its
 * bytes (base64 says little about what they cost); the rest of such a part counts as text.
 */

/** An image: about what Anthropic bills for a 1.15-megapixel image, above OpenAI's high-detail tiles. */
export const IMAGE_TOKENS = 1_600;
/** A document, file or audio part (one PDF page is 1,500 to 3,000 tokens at Anthropic). */
export const DOCUMENT_TOKENS = 3_000;
/**
 * Deeper JSON than this is refused: nothing real nests so deep, and deep enough JSON overflows
 * the stack of whatever recurses over it (JSON.stringify of the upstream body, for one).
 */
export const MAX_DEPTH = 128;

// output_config: an Anthropic client's structured-output schema, which OpenAI bills as input once translated (found in review).
const INPUT_FIELDS = new Set(['system', 'messages', 'tools', 'functions', 'tool_choice', 'response_format', 'output_config', 'input', 'instructions', 'text', 'prompt']);
// A computer-use screenshot and a generated image passed back in a Responses input are images too.
const IMAGE_TYPES = new Set(['image', 'image_url', 'input_image', 'computer_screenshot', 'image_generation_call']);
const DOCUMENT_TYPES = new Set(['document', 'file', 'input_file', 'input_audio', 'audio']);
/**
 * The keys of an image or document part that hold its bytes (or a reference to them): the only
 * ones its fixed figure stands for. Its other keys (a document's `title` and `context`, say) are
 * text the provider bills, and count.
 */
const PAYLOAD_KEYS = new Set(['source', 'image_url', 'input_audio', 'file', 'file_data', 'file_url', 'file_id', 'data', 'url', 'result']);
/**
 * Free-form JSON the provider bills as text, whatever it holds: a tool call's input, and the
 * JSON schemas of tools and response formats. A `type` inside it says nothing of media. (A
 * switch, not a Set: asked of every key, and a parsed body's keys are internalized strings,
 * which a switch compares by reference.)
 */
function freeForm(key: string): boolean {
  switch (key) {
    case 'input_schema':
    case 'parameters':
    case 'schema':
      return true;
    default:
      return false;
  }
}
const TOOL_CALL_TYPES = new Set(['tool_use', 'server_tool_use', 'mcp_tool_use']);

/** How a value is walked: not counted (depth only), counted as content (with media parts), or all as text. */
const SKIP = 0;
const CONTENT = 1;
const TEXT = 2;
type Mode = typeof SKIP | typeof CONTENT | typeof TEXT;

/** Input tokens a request body is estimated to bill (at most MAX_TOKENS), or null when it nests deeper than MAX_DEPTH. */
export function estimateInputTokens(body: Record<string, unknown>): number | null {
  chars = 0;
  media = 0;
  for (const key in body) {
    if (!walk(body[key], 1, INPUT_FIELDS.has(key) ? CONTENT : SKIP)) return null;
  }
  return Math.min(MAX_TOKENS, Math.ceil(chars / 4) + media);
}

/** Whether a value nests deeper than MAX_DEPTH (found without recursing past it). */
export function nestsTooDeep(value: unknown): boolean {
  return !walk(value, 1, SKIP);
}

// The walk's tallies (it runs synchronously, one body at a time).
let chars = 0;
let media = 0;

/**
 * Adds a value's characters (unless SKIP) and checks its depth; false when it nests deeper
 * than MAX_DEPTH. Recursive, but never deeper than MAX_DEPTH frames: the depth is checked
 * before descending, so no body can overflow the stack (a parsed body can nest a million deep).
 * `for...in` over a parsed body sees only its own keys (JSON.parse makes plain objects).
 */
function walk(value: unknown, depth: number, mode: Mode): boolean {
  if (typeof value === 'string') {
    if (mode !== SKIP) chars += value.length;
    return true;
  }
  if (value === null || typeof value !== 'object') {
    if (mode !== SKIP && value !== undefined) chars += 4; // a number or a boolean: one token (embeddings take token ids)
    return true;
  }
  if (depth >= MAX_DEPTH) return false;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) if (!walk(value[i], depth + 1, mode)) return false;
    return true;
  }
  const o = value as Record<string, unknown>;
  let part = false; // an image or document part: its bytes count its fixed figure, not their characters
  let toolCall = false;
  if (mode === CONTENT && typeof o.type === 'string') {
    if (IMAGE_TYPES.has(o.type)) {
      media += IMAGE_TOKENS;
      part = true;
    } else if (DOCUMENT_TYPES.has(o.type) && !textSource(o.source)) {
      media += DOCUMENT_TOKENS;
      part = true;
    } else {
      toolCall = TOOL_CALL_TYPES.has(o.type);
    }
  }
  for (const key in o) {
    let m = mode;
    if (mode === CONTENT) {
      if (part && PAYLOAD_KEYS.has(key)) m = SKIP; // still walked for depth
      else if (freeForm(key) || (toolCall && key === 'input')) m = TEXT;
    }
    if (mode !== SKIP) chars += key.length;
    if (!walk(o[key], depth + 1, m)) return false;
  }
  return true;
}

/** An Anthropic document whose source is plain text (or content blocks): counted as its text. */
function textSource(source: unknown): boolean {
  if (source === null || typeof source !== 'object') return false;
  const type = (source as { type?: unknown }).type;
  return type === 'text' || type === 'content';
}

/**
 * Searches reserved for a web search tool nothing bounds (no `max_uses`, no `max_tool_calls`):
 * the provider then sets no bound the gateway can see, and a model searches a few times an
 * answer. A figure, not a bound: each such call in flight can search past it unseen.
 */
export const UNBOUNDED_SEARCHES = 5;

interface SearchTools { bounded: number; unbounded: boolean; any: boolean }
/** A request without tools (most calls: reserved without an allocation). */
const NO_SEARCH_TOOLS: SearchTools = Object.freeze({ bounded: 0, unbounded: false, any: false });

/** A request's web search tools: the sum of their `max_uses`, whether one has none, whether there is one. */
function webSearchTools(body: Record<string, unknown>): SearchTools {
  if (!Array.isArray(body.tools)) return NO_SEARCH_TOOLS;
  let bounded = 0;
  let unbounded = false;
  let any = false;
  for (const tool of body.tools as unknown[]) {
    if (tool === null || typeof tool !== 'object') continue;
    const t = tool as { type?: unknown; max_uses?: unknown };
    if (typeof t.type !== 'string' || !t.type.startsWith('web_search')) continue;
    any = true;
    if (Number.isSafeInteger(t.max_uses) && (t.max_uses as number) > 0) bounded = Math.min(MAX_TOKENS, bounded + (t.max_uses as number));
    else unbounded = true;
  }
  return { bounded, unbounded, any };
}

/**
 * Web searches a request allows at most: the `max_uses` of its web search server tools
 * (Anthropic's), summed; for a web search tool without one, the request's `max_tool_calls`
 * (the Responses API's bound on all its hosted tool calls), or UNBOUNDED_SEARCHES without it,
 * once. Reserved with the call, so calls in flight cannot search past a cap unseen.
 */
export function searchesAllowed(body: Record<string, unknown>): number {
  return allowedBy(webSearchTools(body), body.max_tool_calls);
}

function allowedBy(tools: SearchTools, maxToolCalls: unknown): number {
  if (!tools.unbounded) return tools.bounded;
  const calls = Number.isSafeInteger(maxToolCalls) && (maxToolCalls as number) > 0 ? (maxToolCalls as number) : UNBOUNDED_SEARCHES;
  return Math.min(MAX_TOKENS, tools.bounded + calls);
}

/**
 * The most searches a provider's usage is believed for a call of a request without a bound on a
 * web search tool: Anthropic's server tools run some ten turns of a call, a few searches each,
 * and a deep research model some hundreds (review).
 */
export const MAX_UNBOUNDED_SEARCHES = 1000;

/**
 * The most web searches a provider's usage is believed for a call of `body`: what its tools
 * allow (searchesAllowed) where it has web search tools and each has a `max_uses`, which the
 * provider keeps to; MAX_UNBOUNDED_SEARCHES more otherwise (a tool without one, a stored
 * `prompt` that may hold tools, or none the gateway sees).
 */
export function searchesCeiling(body: Record<string, unknown>): number {
  const tools = webSearchTools(body);
  const allowed = allowedBy(tools, body.max_tool_calls);
  const stored = body.prompt !== null && typeof body.prompt === 'object';
  return tools.any && !tools.unbounded && !stored ? allowed : Math.min(MAX_TOKENS, allowed + MAX_UNBOUNDED_SEARCHES);
}

/**
 * Of an input estimate, the audio tokens: each audio part's fixed figure (found in review: the
 * whole input was priced as audio, a long text conversation with one audio part at many times
 * its price).
 */
export function audioInputEstimate(audio: { readonly inputParts: number }, inputTokens: number): number {
  return Math.min(inputTokens, audio.inputParts * DOCUMENT_TOKENS);
}

/**
 * What a billable call reserves: its input estimate and output budget, its web searches (those
 * its tools allow, and those billed a call: its price's, or its request's), and,
 * when it asks for audio, its audio parts' figures at the audio input price and all of its
 * output at the audio output price.
 */
export function reservation(call: CallRequest, price: Price, inputTokens: number, outputTokens: number): number {
  const audio = call.audio;
  const cost = costMicro(price, {
    inputTokens, outputTokens, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: searchesAllowed(call.body) + Math.max(price.webSearchesPerCall, call.searchesPerCall ?? 0),
    audioInputTokens: audio?.input != null ? audioInputEstimate(audio, inputTokens) : 0, audioOutputTokens: audio?.output != null ? outputTokens : 0,
  });
  // At least a micro-dollar: a Redis settlement sent again knows it was applied by its
  // reservation being gone, and a billable call that reserved nothing (a model priced for cache
  // reads or searches only) was charged twice when its first answer was lost (found in review).
  return cost > 0 ? cost : 1;
}
