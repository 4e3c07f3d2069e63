import { isObj } from '../protocols/common.js';
import { eventData, type ParsedEvents } from '../providers/sse.js';
import { answerArguments, checkKnown, eventObject, lookup, refuse, shown, stopSequences, StreamEnded, textOf, toolId, toolName } from './common.js';
import type { CallFacts, TranslatedRequest, Translation, Translator } from './types.js';

/**
 * An Anthropic Messages client (Claude Code, the Anthropic SDK) on an OpenAI-protocol provider:
 * the request becomes a Chat Completions request, the answer a message, and the stream
 * Anthropic's events (`message_start` … `message_stop`), built chunk by chunk.
 */

const KNOWN = new Set([
  'model', 'messages', 'system', 'max_tokens', 'stream', 'stop_sequences', 'temperature', 'top_p', 'top_k', 'tools', 'tool_choice',
  'metadata', 'thinking', 'context_management', 'output_config', 'service_tier', 'container', 'mcp_servers',
]);
/**
 * Optional fields Claude Code always sends that OpenAI-protocol models have no equivalent for;
 * they tune the call (thinking, effort, context editing, tier), they do not change what is asked.
 * (`output_config.format` does: it is translated, and the rest of `output_config` dropped.)
 */
const DROPPABLE = ['thinking', 'context_management', 'service_tier'];

type Message = Record<string, unknown>;

const STOP: Record<string, string> = { stop: 'end_turn', length: 'max_tokens', tool_calls: 'tool_use', function_call: 'tool_use', content_filter: 'refusal' };

/**
 * Anthropic's stop reason for a chat finish reason. Some compatible servers (Ollama, older vLLM)
 * finish a turn that calls tools with "stop": it is still a tool_use turn for an Anthropic client.
 * A model that refused (OpenAI's `refusal`, which structured output answers instead of the JSON
 * asked for, with finish_reason "stop") stopped for `refusal` (found in review: an end_turn, so a
 * client parsed the refusal as its JSON).
 */
function stopReason(finish: unknown, calledTools: boolean, refused = false): string {
  if (refused) return 'refusal';
  const reason = lookup(STOP, finish) ?? 'end_turn';
  return reason === 'end_turn' && calledTools ? 'tool_use' : reason;
}

function request(body: Record<string, unknown>, facts: CallFacts): TranslatedRequest {
  checkKnown(body, KNOWN, 'OpenAI Chat Completions');
  const dropped: string[] = [];
  const names = new Map<string, string>();
  if (body.top_k !== undefined && body.top_k !== null) refuse('top_k', '"top_k" has no equivalent on this model\'s provider.');
  // Malformed, not merely unused (found in review: ignored, a client's mistake went unseen).
  if (body.tools !== undefined && body.tools !== null && !Array.isArray(body.tools)) refuse('tools', '"tools" must be an array.');
  if (body.metadata !== undefined && body.metadata !== null && !isObj(body.metadata)) refuse('metadata', '"metadata" must be an object.');
  for (const field of ['container', 'mcp_servers']) {
    if (body[field] !== undefined && body[field] !== null) refuse(field, `"${field}" has no equivalent on this model's provider.`);
  }
  for (const field of DROPPABLE) {
    const value = body[field];
    if (value !== undefined && value !== null && !(field === 'thinking' && isObj(value) && value.type === 'disabled')) dropped.push(field);
  }
  const drop = (what: string) => {
    if (!dropped.includes(what)) dropped.push(what);
  };

  const messages: Message[] = [];
  if (body.system !== undefined && body.system !== null) {
    const text = systemText(body.system, drop);
    if (text !== '') messages.push({ role: 'system', content: text });
  }
  (body.messages as unknown[]).forEach((m, i) => {
    const msg = m as Record<string, unknown>;
    const at = `messages[${i}]`;
    if (msg.role === 'system') { // Claude Code sends one inside messages for models it does not know
      const text = systemText(msg.content, drop);
      if (text !== '') messages.push({ role: 'system', content: text });
    } else if (msg.role === 'user') userMessages(msg.content, `${at}.content`, messages, drop);
    else if (msg.role === 'assistant') messages.push(assistantMessage(msg.content, `${at}.content`, names, drop));
    else refuse(`${at}.role`, `"${at}.role" ${JSON.stringify(msg.role)} has no equivalent on this model's provider.`);
  });

  // OpenAI's own reasoning models take only max_completion_tokens; most compatible servers take
  // it too, and the provider's outputLimitField names max_tokens for those that read only that.
  const out: Record<string, unknown> = { model: body.model, messages };
  out[facts.outputLimitField ?? 'max_completion_tokens'] = facts.maxOutputTokens;
  const stop = stopSequences(body.stop_sequences, 'stop_sequences', false);
  if (stop !== undefined) out.stop = stop;
  if (body.temperature !== undefined && body.temperature !== null) out.temperature = body.temperature;
  if (body.top_p !== undefined && body.top_p !== null) out.top_p = body.top_p;
  if (body.stream === true) {
    out.stream = true;
    out.stream_options = { include_usage: true }; // how the call is metered, and message_delta's usage
  }
  if (isObj(body.metadata) && typeof body.metadata.user_id === 'string') out.user = body.metadata.user_id;
  tools(body, out, names, drop);
  outputConfig(body.output_config, out, drop);
  return { body: out, dropped, names };
}

/**
 * Anthropic's structured output, `output_config.format` (a JSON schema), as chat's
 * `response_format` (found in review: dropped with the rest of `output_config`, so the answer
 * was not held to the schema); the rest (`effort`) tunes the call, and is dropped.
 */
function outputConfig(config: unknown, out: Record<string, unknown>, drop: (what: string) => void): void {
  if (config === undefined || config === null) return;
  if (!isObj(config)) refuse('output_config', '"output_config" must be an object.');
  for (const field of Object.keys(config)) if (field !== 'format' && config[field] !== undefined && config[field] !== null) drop(`output_config.${field}`);
  const format = config.format;
  if (format === undefined || format === null) return;
  if (!isObj(format) || format.type !== 'json_schema' || !isObj(format.schema)) {
    refuse('output_config.format', '"output_config.format" must be a json_schema with its "schema".');
  }
  out.response_format = { type: 'json_schema', json_schema: { name: 'output', schema: format.schema, strict: strictable(format.schema, 0) } };
}

/**
 * Whether OpenAI's strict mode takes a schema: every object in it lists all its properties as
 * required and allows no others. Anthropic's takes optional properties; such a schema goes not
 * strict (found in review: strict, OpenAI refused it), as a request the model is asked to follow.
 */
function strictable(schema: unknown, depth: number): boolean {
  if (depth > 64) return false;
  if (Array.isArray(schema)) return schema.every((s) => strictable(s, depth + 1));
  if (!isObj(schema)) return true;
  if (schema.type === 'object' || isObj(schema.properties)) {
    if (schema.additionalProperties !== false) return false;
    // A Set: a crafted schema of 49,000 properties and 449,000 required names took 20 s (found in review).
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    if (isObj(schema.properties) && !Object.keys(schema.properties).every((p) => required.has(p))) return false;
  }
  for (const value of Object.values(schema)) if (typeof value === 'object' && value !== null && !strictable(value, depth + 1)) return false;
  return true;
}

function systemText(system: unknown, drop: (what: string) => void): string {
  if (Array.isArray(system)) {
    for (const block of system) if (isObj(block) && block.cache_control !== undefined) drop('cache_control');
    return system.map((block, i) => textOf([block], `system[${i}]`)).join('\n');
  }
  return textOf(system, 'system');
}

/** A user turn: its tool results first, as `tool` messages (they must follow the assistant's calls), then the rest. */
function userMessages(content: unknown, at: string, out: Message[], drop: (what: string) => void): void {
  if (typeof content === 'string') {
    out.push({ role: 'user', content });
    return;
  }
  if (!Array.isArray(content)) refuse(at, `"${at}" must be a string or an array of content blocks.`);
  const parts: Array<Record<string, unknown>> = [];
  content.forEach((block, j) => {
    const b = isObj(block) ? block : {};
    const where = `${at}[${j}]`;
    if (b.cache_control !== undefined) drop('cache_control');
    if (b.type === 'tool_result') {
      if (b.is_error === true) drop('is_error');
      out.push({ role: 'tool', tool_call_id: toolId(b.tool_use_id, `toolu_${j}`), content: toolResultText(b.content, `${where}.content`, drop) });
    } else if (b.type === 'text' && typeof b.text === 'string') parts.push({ type: 'text', text: b.text });
    else if (b.type === 'image' && isObj(b.source)) parts.push({ type: 'image_url', image_url: { url: sourceUrl(b.source, `${where}.source`) } });
    else if (b.type === 'document' && isObj(b.source) && b.source.type === 'base64' && b.source.media_type === 'application/pdf') {
      parts.push({ type: 'file', file: { filename: typeof b.title === 'string' ? b.title : 'document.pdf', file_data: sourceUrl(b.source, `${where}.source`) } });
    } else if (b.type === 'document' && isObj(b.source) && b.source.type === 'text' && typeof b.source.data === 'string') {
      parts.push({ type: 'text', text: b.source.data });
    } else {
      refuse(where, `"${where}" (${shown(b.type)}) has no equivalent on this model's provider: text, images, PDF documents and tool results can be translated.`);
    }
  });
  if (parts.length === 0) return;
  // All text: a plain string, which every OpenAI-compatible server takes.
  out.push({ role: 'user', content: parts.every((p) => p.type === 'text') ? parts.map((p) => p.text).join('\n') : parts });
}

function toolResultText(content: unknown, at: string, drop: (what: string) => void): string {
  if (Array.isArray(content)) for (const block of content) if (isObj(block) && block.cache_control !== undefined) drop('cache_control');
  return textOf(content, at);
}

function sourceUrl(source: Record<string, unknown>, at: string): string {
  if (source.type === 'base64' && typeof source.media_type === 'string' && typeof source.data === 'string') return `data:${source.media_type};base64,${source.data}`;
  if (source.type === 'url' && typeof source.url === 'string') return source.url;
  return refuse(at, `"${at}" must be a base64 or url source.`);
}

function assistantMessage(content: unknown, at: string, names: Map<string, string>, drop: (what: string) => void): Message {
  if (typeof content === 'string') return { role: 'assistant', content };
  if (!Array.isArray(content)) return refuse(at, `"${at}" must be a string or an array of content blocks.`);
  let text = '';
  const calls: unknown[] = [];
  content.forEach((block, j) => {
    const b = isObj(block) ? block : {};
    const where = `${at}[${j}]`;
    if (b.cache_control !== undefined) drop('cache_control');
    if (b.type === 'text' && typeof b.text === 'string') text += b.text;
    else if (b.type === 'tool_use' && typeof b.name === 'string') {
      calls.push({ id: toolId(b.id, `toolu_${j}`), type: 'function', function: { name: toolName(b.name, names), arguments: JSON.stringify(b.input ?? {}) } });
    } else if (b.type === 'thinking' || b.type === 'redacted_thinking') drop('thinking'); // the model's own reasoning: no place for it in chat
    else refuse(where, `"${where}" (${shown(b.type)}) has no equivalent on this model's provider.`);
  });
  const msg: Message = { role: 'assistant', content: text === '' && calls.length > 0 ? null : text };
  if (calls.length > 0) msg.tool_calls = calls;
  return msg;
}

function tools(body: Record<string, unknown>, out: Record<string, unknown>, names: Map<string, string>, drop: (what: string) => void): void {
  if (Array.isArray(body.tools) && body.tools.length > 0) {
    out.tools = body.tools.map((tool, i) => {
      const t = isObj(tool) ? tool : {};
      if ((t.type !== undefined && t.type !== 'custom') || typeof t.name !== 'string') {
        return refuse(`tools[${i}]`, `"tools[${i}]" (${shown(t.type ?? t.name)}) is a server tool with no equivalent on this model's provider.`);
      }
      if (t.cache_control !== undefined) drop('cache_control');
      if (t.defer_loading !== undefined) drop('defer_loading');
      const fn: Record<string, unknown> = { name: toolName(t.name, names), parameters: isObj(t.input_schema) ? t.input_schema : { type: 'object', properties: {} } };
      if (typeof t.description === 'string') fn.description = t.description;
      if (t.strict === true) fn.strict = true; // found in review: dropped unnamed
      return { type: 'function', function: fn };
    });
  }
  const choice = body.tool_choice;
  if (choice === undefined || choice === null || out.tools === undefined) return; // no tool_choice without tools
  if (!isObj(choice)) refuse('tool_choice', '"tool_choice" must be an object.');
  if (choice.type === 'auto') out.tool_choice = 'auto';
  else if (choice.type === 'any') out.tool_choice = 'required';
  else if (choice.type === 'none') out.tool_choice = 'none';
  else if (choice.type === 'tool' && typeof choice.name === 'string') out.tool_choice = { type: 'function', function: { name: toolName(choice.name, names) } };
  else refuse('tool_choice', '"tool_choice" must be auto, any, tool or none.');
  if (choice.disable_parallel_tool_use === true && out.tools !== undefined) out.parallel_tool_calls = false;
}

/** Anthropic usage from chat's: `input_tokens` excludes the cached tokens OpenAI counts in `prompt_tokens`. */
function messagesUsage(u: unknown): Record<string, number> {
  const usage = isObj(u) ? u : {};
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  const cached = isObj(usage.prompt_tokens_details) ? num(usage.prompt_tokens_details.cached_tokens) : 0;
  return { input_tokens: Math.max(0, num(usage.prompt_tokens) - cached), output_tokens: num(usage.completion_tokens), cache_read_input_tokens: cached, cache_creation_input_tokens: 0 };
}

/** A model's tool call as a tool_use block for an Anthropic client. */
function toolUse(call: Record<string, unknown>, fallbackId: string, names: Map<string, string>, input: Record<string, unknown>): Record<string, unknown> {
  const fn = isObj(call.function) ? call.function : {};
  const name = String(fn.name ?? '');
  return { type: 'tool_use', id: toolId(call.id, fallbackId), name: names.get(name) ?? name, input };
}

function answer(json: Record<string, unknown>, call: Translation): Record<string, unknown> {
  const choice = Array.isArray(json.choices) && isObj(json.choices[0]) ? json.choices[0] : {};
  const message = isObj(choice.message) ? choice.message : {};
  const content: unknown[] = [];
  if (typeof message.content === 'string' && message.content !== '') content.push({ type: 'text', text: message.content });
  const refused = typeof message.refusal === 'string' && message.refusal !== '';
  if (refused) content.push({ type: 'text', text: message.refusal });
  if (Array.isArray(message.tool_calls)) {
    message.tool_calls.forEach((tc, k) => {
      if (!isObj(tc)) return;
      const fn = isObj(tc.function) ? tc.function : {};
      content.push(toolUse(tc, `toolu_${call.requestId}_${k}`, call.names, answerArguments(fn.arguments)));
    });
  }
  return {
    id: `msg_${toolId(json.id, call.requestId)}`, type: 'message', role: 'assistant', model: call.model, content,
    stop_reason: stopReason(choice.finish_reason, content.some((b) => (b as { type: string }).type === 'tool_use'), refused), stop_sequence: null,
    usage: messagesUsage(json.usage),
  };
}

const event = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

/**
 * Chat chunks to Anthropic events. Blocks open when their kind changes (text, or a new tool call
 * by its `index`, or by its `id` where a server sends none: Gemini's) and close at the end;
 * `message_start` carries the gateway's input estimate (the provider counts only at the end:
 * `message_delta` then carries its real usage). A tool call's arguments are held until its block
 * closes and then sent as one `input_json_delta`, as the whole answer has them: arguments that
 * are not a JSON object become `{"_raw_arguments": …}` (sent as they came, the client's SDK
 * fails to parse the answer, and the whole answer is lost).
 */
function stream(call: Translation, parsed?: ParsedEvents): (event: string | null) => string {
  let started = false;
  let finished = false;
  let blocks = 0;
  let text = -1; // the open text block, or -1
  /** Tool calls by their `index` (or `id`): the block and the arguments so far. */
  const toolBlock = new Map<number | string, { index: number; args: string }>();
  let lastTool: number | string = 0;
  let finishReason: unknown = null;
  let calledTools = false;
  let refused = false;
  let usage: Record<string, number> | null = null;
  const start = (id: unknown) => {
    if (started) return '';
    started = true;
    return event('message_start', {
      message: {
        id: `msg_${toolId(id, call.requestId)}`, type: 'message', role: 'assistant', model: call.model, content: [], stop_reason: null, stop_sequence: null,
        usage: { input_tokens: call.inputTokens, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 },
      },
    });
  };
  const closeText = () => {
    if (text < 0) return '';
    const out = event('content_block_stop', { index: text });
    text = -1;
    return out;
  };
  const closeTools = () => {
    let out = '';
    for (const { index, args } of toolBlock.values()) {
      if (args.trim() !== '') {
        const input = answerArguments(args);
        const json = '_raw_arguments' in input && Object.keys(input).length === 1 ? JSON.stringify(input) : args;
        out += event('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: json } });
      }
      out += event('content_block_stop', { index });
    }
    toolBlock.clear();
    return out;
  };
  const finish = () => {
    if (finished) return '';
    finished = true;
    const out = start(null) + closeText() + closeTools();
    const u = usage ?? { input_tokens: call.inputTokens, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 };
    return `${out}${event('message_delta', { delta: { stop_reason: stopReason(finishReason, calledTools, refused), stop_sequence: null }, usage: u })}${event('message_stop', {})}`;
  };
  return (ev) => {
    // A provider that said why it stopped but sent no usage chunk or [DONE] (some compatible servers) has finished.
    if (ev === null) {
      if (!finished && finishReason === null) throw new StreamEnded();
      return finish();
    }
    if (finished) return '';
    const data = eventData(ev);
    if (data === '[DONE]') return finish();
    const chunk = eventObject(data, parsed, ev);
    if (chunk === null) return '';
    if (isObj(chunk.error)) {
      finished = true;
      const message = typeof chunk.error.message === 'string' ? chunk.error.message : 'The provider reported an error.';
      return start(chunk.id) + event('error', { error: { type: 'api_error', message } });
    }
    let out = start(chunk.id);
    if (isObj(chunk.usage)) usage = messagesUsage(chunk.usage);
    const choice = Array.isArray(chunk.choices) && isObj(chunk.choices[0]) ? chunk.choices[0] : null;
    // The usage chunk comes last but one: the closing events wait for [DONE] (or the stream's
    // end), the provider's final event, which the call settles its charge before relaying.
    if (choice === null) return out;
    const delta = isObj(choice.delta) ? choice.delta : {};
    const refusal = typeof delta.refusal === 'string' && delta.refusal !== '' ? delta.refusal : null;
    if (refusal !== null) refused = true;
    const piece = typeof delta.content === 'string' && delta.content !== '' ? delta.content : refusal;
    if (piece !== null) {
      if (text < 0) {
        out += closeTools();
        text = blocks++;
        out += event('content_block_start', { index: text, content_block: { type: 'text', text: '' } });
      }
      out += event('content_block_delta', { index: text, delta: { type: 'text_delta', text: piece } });
    }
    if (Array.isArray(delta.tool_calls)) {
      for (const tc of delta.tool_calls) {
        if (!isObj(tc)) continue;
        // A call without `index` (Gemini's) is told apart by its `id`; a piece with neither continues the last call.
        const n = typeof tc.index === 'number' ? tc.index : typeof tc.id === 'string' && tc.id !== '' ? `id ${tc.id}` : lastTool;
        lastTool = n;
        let block = toolBlock.get(n);
        if (block === undefined) {
          out += closeText();
          block = { index: blocks++, args: '' };
          toolBlock.set(n, block);
          calledTools = true;
          out += event('content_block_start', { index: block.index, content_block: { ...toolUse(tc, `toolu_${call.requestId}_${block.index}`, call.names, {}) } });
        }
        const fn = isObj(tc.function) ? tc.function : {};
        if (typeof fn.arguments === 'string') block.args += fn.arguments;
      }
    }
    if (typeof choice.finish_reason === 'string') finishReason = choice.finish_reason;
    return out;
  };
}

export const messagesToChat: Translator = { provider: 'chat', request, answer, stream };
