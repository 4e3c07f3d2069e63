import { UNBOUNDED_SEARCHES } from '../billing/estimate.js';
import { isObj } from '../protocols/common.js';
import { TextDelta } from '../protocols/messages/text-delta.js';
import type { ParsedEvents } from '../providers/sse.js';
import { anthropicEvent, argumentsObject, checkKnown, dataUrl, mergeUsage, refuse, shown, StreamEnded, textOf, toolId, toolName } from './common.js';
import { outputFormat, sampling, thinking, toolChoice, turnList, type Block } from './to-anthropic.js';
import type { CallFacts, TranslatedRequest, Translation, Translator } from './types.js';

/**
 * A Responses API client (Codex, the AI SDK's default OpenAI provider) on an Anthropic
 * provider: input items become Messages turns, the answer a response with output items, and the
 * stream the Responses event sequence, each event with `type` and `sequence_number`.
 */

const KNOWN = new Set([
  'model', 'input', 'instructions', 'max_output_tokens', 'stream', 'temperature', 'top_p', 'tools', 'tool_choice', 'parallel_tool_calls',
  'reasoning', 'store', 'include', 'prompt_cache_key', 'client_metadata', 'metadata', 'service_tier', 'text', 'truncation', 'user',
  'safety_identifier', 'previous_response_id', 'background', 'top_logprobs', 'stream_options',
]);
/** Optional fields without an Anthropic equivalent that leave the meaning of the call alone. */
const DROPPABLE = ['store', 'include', 'prompt_cache_key', 'client_metadata', 'metadata', 'service_tier', 'truncation', 'stream_options'];
/** Separates a namespace from its function in `names` (no tool name holds it). */
const NAMESPACED = '\u0000';
/** A hosted tool's type as the `x-gateway-dropped` header may name it. */
const TOOL_TYPE = /^[A-Za-z0-9_.-]{1,64}$/;
/**
 * Hosted tool types named one by one, at most; the rest are `tools.other`. A request can list
 * a hundred thousand distinct types: each named would make the header (and the access-log line)
 * megabytes long, and the check for names already dropped quadratic (found in review).
 */
const MAX_NAMED_TOOLS = 8;
/**
 * Marks the gateway's own `encrypted_content`: an Anthropic thinking block (or a redacted one,
 * whose reasoning is encrypted by Anthropic), carried through the client and back.
 */
const THINKING = 'mg-thinking-v1:';


function request(body: Record<string, unknown>, facts: CallFacts): TranslatedRequest {
  checkKnown(body, KNOWN, 'Anthropic Messages');
  const dropped: string[] = [];
  const drop = (what: string) => {
    if (!dropped.includes(what)) dropped.push(what);
  };
  const names = new Map<string, string>();
  if (body.previous_response_id !== undefined && body.previous_response_id !== null) {
    refuse('previous_response_id', 'This gateway keeps no responses, and this model\'s provider cannot continue one: send the whole conversation in "input".');
  }
  if (body.background === true) refuse('background', '"background" has no equivalent on this model\'s provider.');
  if (typeof body.top_logprobs === 'number' && body.top_logprobs > 0) refuse('top_logprobs', '"top_logprobs" has no equivalent on this model\'s provider.');
  if (body.instructions !== undefined && body.instructions !== null && typeof body.instructions !== 'string') refuse('instructions', '"instructions" must be a string.');
  for (const field of DROPPABLE) if (body[field] !== undefined && body[field] !== null) drop(field);
  // Malformed, not merely unused (found in review: ignored, `reasoning: "high"` asked for nothing).
  if (body.tools !== undefined && body.tools !== null && !Array.isArray(body.tools)) refuse('tools', '"tools" must be an array.');
  if (body.reasoning !== undefined && body.reasoning !== null && !isObj(body.reasoning)) refuse('reasoning', '"reasoning" must be an object, e.g. {"effort": "high"}.');
  if (body.text !== undefined && body.text !== null && !isObj(body.text)) refuse('text', '"text" must be an object.');
  if (isObj(body.text) && body.text.verbosity !== undefined) drop('text.verbosity');

  const system: Block[] = [];
  if (typeof body.instructions === 'string' && body.instructions !== '') system.push({ type: 'text', text: body.instructions });
  const { turns, push } = turnList();
  const items = typeof body.input === 'string' ? [{ type: 'message', role: 'user', content: body.input }] : Array.isArray(body.input) ? body.input : [];
  items.forEach((raw, i) => {
    const item = isObj(raw) ? raw : {};
    const at = `input[${i}]`;
    const type = item.type ?? 'message';
    if (type === 'message') {
      if (item.role === 'system' || item.role === 'developer') {
        const text = textOf(item.content, `${at}.content`);
        if (text !== '') system.push({ type: 'text', text });
      } else if (item.role === 'user') push('user', userBlocks(item.content, `${at}.content`, drop));
      else if (item.role === 'assistant') {
        const text = textOf(item.content, `${at}.content`);
        if (text !== '') push('assistant', [{ type: 'text', text }]);
      } else refuse(`${at}.role`, `"${at}.role" ${JSON.stringify(item.role)} has no equivalent on this model's provider.`);
    } else if (type === 'function_call') {
      if (typeof item.name !== 'string') refuse(`${at}.name`, `"${at}.name" must be a string.`);
      const name = typeof item.namespace === 'string' ? `${item.namespace}__${item.name}` : item.name;
      push('assistant', [{ type: 'tool_use', id: toolId(item.call_id, `call_${i}`), name: toolName(name, names), input: argumentsObject(item.arguments, `${at}.arguments`) }]);
    } else if (type === 'function_call_output') {
      push('user', [{ type: 'tool_result', tool_use_id: toolId(item.call_id, `call_${i}`), content: textOf(item.output, `${at}.output`) }]);
    } else if (type === 'reasoning') {
      // The gateway's own: a signed thinking block, which Anthropic wants back before the tool_use it led to.
      const thinking = typeof item.encrypted_content === 'string' && item.encrypted_content.startsWith(THINKING) ? decodeThinking(item.encrypted_content) : null;
      if (thinking !== null) push('assistant', [thinking]);
      else drop('reasoning');
    } else {
      refuse(at, `"${at}" (${shown(type)}) has no equivalent on this model's provider.`);
    }
  });

  const out: Record<string, unknown> = { model: body.model };
  if (system.length > 0) out.system = system;
  out.messages = turns;
  out.max_tokens = facts.maxOutputTokens;
  sampling(body, out);
  tools(body, out, names, drop);
  const reasoning = isObj(body.reasoning) ? body.reasoning : {};
  if (reasoning.summary !== undefined && reasoning.summary !== null && (reasoning.effort === undefined || reasoning.effort === null)) drop('reasoning.summary');
  thinking(reasoning.effort, 'reasoning.effort', out, dropped);
  if (isObj(body.text)) outputFormat(body.text.format, 'text.format', out, dropped);
  return { body: out, dropped, names };
}

function userBlocks(content: unknown, at: string, drop: (what: string) => void): Block[] {
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  if (!Array.isArray(content)) return refuse(at, `"${at}" must be a string or an array of content parts.`);
  const blocks: Block[] = [];
  content.forEach((part, j) => {
    const p = isObj(part) ? part : {};
    const where = `${at}[${j}]`;
    if (p.type === 'input_text' && typeof p.text === 'string') {
      if (p.text !== '') blocks.push({ type: 'text', text: p.text });
    } else if (p.type === 'input_image' && typeof p.image_url === 'string') {
      if (p.detail !== undefined && p.detail !== null && p.detail !== 'auto') drop('input_image.detail'); // as chat's image_url.detail
      const data = dataUrl(p.image_url);
      if (data !== null) blocks.push({ type: 'image', source: { type: 'base64', media_type: data.mediaType, data: data.data } });
      else if (/^https?:\/\//.test(p.image_url)) blocks.push({ type: 'image', source: { type: 'url', url: p.image_url } });
      else refuse(`${where}.image_url`, `"${where}.image_url" must be an http(s) or a base64 data URL.`);
    } else if (p.type === 'input_file' && typeof p.file_data === 'string' && dataUrl(p.file_data)?.mediaType === 'application/pdf') {
      blocks.push({ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: dataUrl(p.file_data)!.data } });
    } else {
      refuse(where, `"${where}" (${shown(p.type)}) has no equivalent on this model's provider: text, images and PDF files (as data) can be translated.`);
    }
  });
  return blocks;
}

/** Function tools (namespaced ones flattened to unique names), and the hosted web search. */
function tools(body: Record<string, unknown>, out: Record<string, unknown>, names: Map<string, string>, drop: (what: string) => void): void {
  const list: Block[] = [];
  const hosted = new Set<string>(); // the hosted tool types named so far
  const add = (fn: Record<string, unknown>, at: string, namespace: string | null) => {
    if (typeof fn.name !== 'string') refuse(`${at}.name`, `"${at}.name" must be a string.`);
    const full = namespace === null ? fn.name : `${namespace}__${fn.name}`;
    const name = toolName(full, names);
    if (namespace !== null) names.set(name, `${namespace}${NAMESPACED}${fn.name}`);
    const def: Block = { name, input_schema: isObj(fn.parameters) ? fn.parameters : { type: 'object', properties: {} } };
    if (typeof fn.description === 'string') def.description = fn.description;
    if (fn.strict === true) drop('tools.strict'); // schema adherence is not guaranteed there
    list.push(def);
  };
  let searching = false;
  (Array.isArray(body.tools) ? body.tools : []).forEach((tool, i) => {
    const t = isObj(tool) ? tool : {};
    const at = `tools[${i}]`;
    if (t.type === 'function') add(t, at, null);
    else if (t.type === 'namespace' && typeof t.name === 'string' && Array.isArray(t.tools)) {
      t.tools.forEach((inner, j) => {
        const fn = isObj(inner) ? inner : {};
        if (fn.type !== undefined && fn.type !== 'function') refuse(`${at}.tools[${j}]`, `"${at}.tools[${j}]" must be a function.`);
        add(fn, `${at}.tools[${j}]`, t.name as string);
      });
    } else if (t.type === 'web_search' || t.type === 'web_search_preview') {
      // Bounded by what the call reserved for it (found in review: sent without `max_uses`, the
      // model could search past the reservation unseen); a second one would be the same tool.
      if (!searching) list.push({ type: 'web_search_20250305', name: 'web_search', max_uses: UNBOUNDED_SEARCHES });
      searching = true;
    } else {
      // A hosted tool Anthropic has no equivalent of: the model simply does not get it. Its
      // name goes into a response header: only a plain name is shown, never the client's bytes.
      const type = typeof t.type === 'string' && TOOL_TYPE.test(t.type) ? t.type : 'other';
      if (hosted.has(type) || hosted.size < MAX_NAMED_TOOLS) {
        hosted.add(type);
        drop(`tools.${type}`);
      } else drop('tools.other');
    }
  });
  if (list.length > 0) out.tools = list;
  toolChoice(body, out, names);
}

function encodeThinking(block: { thinking: string; signature: string } | { redacted: string }): string {
  return THINKING + Buffer.from(JSON.stringify(block)).toString('base64');
}

function decodeThinking(encrypted: string): Block | null {
  try {
    const { thinking, signature, redacted } = JSON.parse(Buffer.from(encrypted.slice(THINKING.length), 'base64').toString('utf8')) as Record<string, unknown>;
    if (typeof redacted === 'string') return { type: 'redacted_thinking', data: redacted };
    return typeof thinking === 'string' && typeof signature === 'string' ? { type: 'thinking', thinking, signature } : null;
  } catch {
    return null;
  }
}

/** A redacted thinking block as a reasoning item without a summary; given back, it is the block again. */
function redactedItem(id: string, data: string): Record<string, unknown> {
  return { type: 'reasoning', id, summary: [], encrypted_content: encodeThinking({ redacted: data }) };
}

/** Responses usage from Anthropic's: `input_tokens` there includes the cache reads and writes. */
function responsesUsage(u: unknown): Record<string, unknown> {
  const usage = isObj(u) ? u : {};
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  const cacheRead = num(usage.cache_read_input_tokens);
  const input = num(usage.input_tokens) + cacheRead + num(usage.cache_creation_input_tokens);
  const output = num(usage.output_tokens);
  return { input_tokens: input, input_tokens_details: { cached_tokens: cacheRead }, output_tokens: output, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: input + output };
}

/** The response object around `output`, as the Responses API shows it. */
function responseObject(call: Translation, id: string, status: string, output: unknown[], usage: unknown): Record<string, unknown> {
  const b = call.clientBody;
  return {
    id, object: 'response', created_at: call.created, status, error: null,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: b.instructions ?? null, max_output_tokens: b.max_output_tokens ?? null, model: call.model, output,
    parallel_tool_calls: b.parallel_tool_calls ?? true, previous_response_id: null, reasoning: { effort: null, summary: null },
    store: false, temperature: b.temperature ?? 1, text: { format: isObj(b.text) && isObj(b.text.format) ? b.text.format : { type: 'text' } }, tool_choice: b.tool_choice ?? 'auto',
    tools: Array.isArray(b.tools) ? b.tools : [], top_p: b.top_p ?? 1, truncation: 'disabled', usage, user: null, metadata: {},
  };
}

/** The client's name of a tool the provider called (namespaced ones split back). */
function clientCall(name: string, names: Map<string, string>): { name: string; namespace?: string } {
  const full = names.get(name) ?? name;
  const cut = full.indexOf(NAMESPACED);
  return cut < 0 ? { name: full } : { namespace: full.slice(0, cut), name: full.slice(cut + 1) };
}

function functionCall(id: string, callId: string, name: string, args: string, names: Map<string, string>, status: string): Record<string, unknown> {
  return { type: 'function_call', id, call_id: callId, ...clientCall(name, names), arguments: args, status };
}

function answer(json: Record<string, unknown>, call: Translation): Record<string, unknown> {
  const output: unknown[] = [];
  let parts: unknown[] = [];
  const flush = () => {
    if (parts.length === 0) return;
    output.push({ type: 'message', id: `msg_${call.itemPrefix}_${output.length}`, status: 'completed', role: 'assistant', content: parts });
    parts = [];
  };
  for (const block of Array.isArray(json.content) ? json.content : []) {
    if (!isObj(block)) continue;
    if (block.type === 'text' && typeof block.text === 'string') parts.push({ type: 'output_text', text: block.text, annotations: [] });
    else if (block.type === 'tool_use') {
      flush();
      output.push(functionCall(`fc_${call.itemPrefix}_${output.length}`, String(block.id), String(block.name), JSON.stringify(block.input ?? {}), call.names, 'completed'));
    } else if (block.type === 'thinking' && typeof block.thinking === 'string') {
      flush();
      output.push({
        type: 'reasoning', id: `rs_${call.itemPrefix}_${output.length}`, summary: [{ type: 'summary_text', text: block.thinking }],
        encrypted_content: encodeThinking({ thinking: block.thinking, signature: String(block.signature ?? '') }),
      });
    } else if (block.type === 'redacted_thinking' && typeof block.data === 'string') {
      // Found in review: dropped, so a tool loop's turn that had one could not be given back.
      flush();
      output.push(redactedItem(`rs_${call.itemPrefix}_${output.length}`, block.data));
    }
  }
  flush();
  const status = cutShort(json.stop_reason) ? 'incomplete' : 'completed';
  call.remember?.(output);
  return responseObject(call, `resp_${String(json.id)}`, status, output, responsesUsage(json.usage));
}

/** An answer that stopped at a limit, not at its end: the Responses API's `incomplete` (found in review: the context window's was `completed`). */
const cutShort = (stop: unknown): boolean => stop === 'max_tokens' || stop === 'model_context_window_exceeded';

/** Anthropic events to the Responses event sequence, block by block. */
function stream(call: Translation, parsed?: ParsedEvents): (event: string | null) => string {
  let sequence = 0;
  let id = `resp_${call.requestId}`;
  let started = false;
  let done = false;
  let stop: unknown = null;
  let usage: Record<string, unknown> = {};
  const output: Record<string, unknown>[] = [];
  const open = new Map<unknown, { index: number; item: Record<string, unknown>; text: string; signature: string; redacted: boolean; input: string }>();
  const emit = (type: string, fields: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...fields })}\n\n`;
  const start = () => {
    if (started) return '';
    started = true;
    const response = responseObject(call, id, 'in_progress', [], null);
    return emit('response.created', { response }) + emit('response.in_progress', { response });
  };
  /** Ends block `at`: its item done, with its text (the `done` events of its kind). */
  const close = (at: unknown): string => {
    const block = open.get(at);
    if (block === undefined) return '';
    open.delete(at);
    const { item, index, text } = block;
    const where = { item_id: item.id, output_index: index };
    let out = '';
    if (item.type === 'message') {
      const part = { type: 'output_text', text, annotations: [] };
      Object.assign(item, { status: 'completed', content: [part] });
      out += emit('response.output_text.done', { ...where, content_index: 0, text, logprobs: [] });
      out += emit('response.content_part.done', { ...where, content_index: 0, part });
    } else if (item.type === 'function_call') {
      // An input that came whole in the block's start (a compatible server's way) is its arguments (found in review: "{}").
      if (text === '' && block.input !== '') out += emit('response.function_call_arguments.delta', { ...where, delta: block.input });
      const args = text !== '' ? text : block.input !== '' ? block.input : '{}';
      Object.assign(item, { status: 'completed', arguments: args });
      out += emit('response.function_call_arguments.done', { ...where, arguments: args });
    } else if (!block.redacted) {
      const part = { type: 'summary_text', text };
      Object.assign(item, { summary: [part], encrypted_content: encodeThinking({ thinking: text, signature: block.signature }) });
      out += emit('response.reasoning_summary_text.done', { ...where, summary_index: 0, text });
      out += emit('response.reasoning_summary_part.done', { ...where, summary_index: 0, part });
    }
    return out + emit('response.output_item.done', { output_index: index, item });
  };
  const finish = () => {
    if (done) return '';
    done = true;
    // Blocks a provider left open are closed first (found in review: the answer's text was lost).
    let out = start();
    for (const at of [...open.keys()]) out += close(at);
    const status = cutShort(stop) ? 'incomplete' : 'completed';
    call.remember?.(output);
    return out + emit(`response.${status}`, { response: responseObject(call, id, status, output, responsesUsage(usage)) });
  };
  return (ev) => {
    if (ev === null) {
      if (!done) throw new StreamEnded();
      return '';
    }
    const msg = done ? null : anthropicEvent(ev, parsed);
    if (msg === null) return '';
    if (msg instanceof TextDelta) {
      // A text delta (most events): its text is passed on as the JSON the provider sent, unparsed.
      const block = open.get(msg.index);
      if (block === undefined || block.item.type !== 'message') return ''; // text only where a message is open (found in review: into a call's arguments)
      block.text += msg.text;
      // emit()'s text for these fields, in its order.
      return `event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":${sequence++},` +
        `"item_id":${JSON.stringify(block.item.id)},"output_index":${block.index},"content_index":0,"delta":${msg.json},"logprobs":[]}\n\n`;
    }
    switch (msg.type) {
      case 'message_start': {
        const m = isObj(msg.message) ? msg.message : {};
        if (typeof m.id === 'string') id = `resp_${m.id}`;
        if (isObj(m.usage)) usage = mergeUsage({}, m.usage);
        return start();
      }
      case 'content_block_start': {
        const block = isObj(msg.content_block) ? msg.content_block : {};
        const index = output.length;
        let item: Record<string, unknown>;
        let out = start();
        if (block.type === 'text') {
          item = { type: 'message', id: `msg_${call.itemPrefix}_${index}`, status: 'in_progress', role: 'assistant', content: [] };
          out += emit('response.output_item.added', { output_index: index, item });
          out += emit('response.content_part.added', { item_id: item.id, output_index: index, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } });
        } else if (block.type === 'tool_use') {
          item = functionCall(`fc_${call.itemPrefix}_${index}`, String(block.id), String(block.name), '', call.names, 'in_progress');
          out += emit('response.output_item.added', { output_index: index, item });
        } else if (block.type === 'thinking') {
          item = { type: 'reasoning', id: `rs_${call.itemPrefix}_${index}`, summary: [] };
          out += emit('response.output_item.added', { output_index: index, item });
          out += emit('response.reasoning_summary_part.added', { item_id: item.id, output_index: index, summary_index: 0, part: { type: 'summary_text', text: '' } });
        } else if (block.type === 'redacted_thinking' && typeof block.data === 'string') {
          // Whole at its start (no deltas); done at its stop.
          item = redactedItem(`rs_${call.itemPrefix}_${index}`, block.data);
          out += emit('response.output_item.added', { output_index: index, item: { ...item, encrypted_content: undefined } });
        } else return out; // server tool blocks and their results: the model's own business
        output.push(item);
        const input = block.type === 'tool_use' && isObj(block.input) && Object.keys(block.input).length > 0 ? JSON.stringify(block.input) : '';
        open.set(msg.index, { index, item, text: '', signature: '', redacted: block.type === 'redacted_thinking', input });
        return out;
      }
      case 'content_block_delta': {
        const block = open.get(msg.index);
        const delta = isObj(msg.delta) ? msg.delta : {};
        if (block === undefined) return '';
        const where = { item_id: block.item.id, output_index: block.index };
        if (delta.type === 'text_delta' && typeof delta.text === 'string') {
          if (block.item.type !== 'message') return '';
          block.text += delta.text;
          return emit('response.output_text.delta', { ...where, content_index: 0, delta: delta.text, logprobs: [] });
        }
        if (delta.type === 'input_json_delta' && typeof delta.partial_json === 'string' && delta.partial_json !== '') {
          block.text += delta.partial_json;
          return emit('response.function_call_arguments.delta', { ...where, delta: delta.partial_json });
        }
        if (delta.type === 'thinking_delta' && typeof delta.thinking === 'string') {
          block.text += delta.thinking;
          return emit('response.reasoning_summary_text.delta', { ...where, summary_index: 0, delta: delta.thinking });
        }
        if (delta.type === 'signature_delta' && typeof delta.signature === 'string') block.signature += delta.signature;
        return '';
      }
      case 'content_block_stop':
        return close(msg.index);
      case 'message_delta': {
        if (isObj(msg.usage)) mergeUsage(usage, msg.usage);
        if (isObj(msg.delta)) stop = msg.delta.stop_reason;
        return '';
      }
      case 'message_stop':
        return finish();
      case 'error': {
        done = true;
        const error = isObj(msg.error) ? msg.error : {};
        const message = typeof error.message === 'string' ? error.message : 'The provider reported an error.';
        return start() + emit('error', { code: typeof error.type === 'string' ? error.type : 'api_error', message, param: null }) +
          emit('response.failed', { response: { ...responseObject(call, id, 'failed', output, responsesUsage(usage)), error: { code: 'server_error', message } } });
      }
      default:
        return '';
    }
  };
}

export const responsesToMessages: Translator = { provider: 'messages', request, answer, stream };
