import { isObj } from '../protocols/common.js';
import { TextDelta } from '../protocols/messages/text-delta.js';
import type { ParsedEvents } from '../providers/sse.js';
import {
  anthropicEvent, argumentsObject, checkKnown, dataEvent, dataUrl, lookup, mergeUsage, refuse, shown, stopSequences, StreamEnded, textOf, toolId, toolName,
} from './common.js';
import { outputFormat, sampling, thinking, toolChoice, turnList, type Block } from './to-anthropic.js';
import type { CallFacts, TranslatedRequest, Translation, Translator } from './types.js';

/**
 * A Chat Completions client on an Anthropic (Messages) provider: the request becomes a Messages
 * request, the answer a chat completion, the stream chat chunks, event by event.
 */

const KNOWN = new Set([
  'model', 'messages', 'max_tokens', 'max_completion_tokens', 'stream', 'stream_options', 'stop', 'temperature', 'top_p', 'n', 'tools',
  'tool_choice', 'parallel_tool_calls', 'user', 'safety_identifier', 'metadata', 'store', 'seed', 'service_tier', 'prompt_cache_key',
  'logprobs', 'top_logprobs', 'presence_penalty', 'frequency_penalty', 'logit_bias', 'response_format', 'reasoning_effort', 'modalities',
]);
/** Optional fields without an Anthropic equivalent that leave the meaning of the call alone. */
const DROPPABLE = ['store', 'seed', 'service_tier', 'prompt_cache_key', 'metadata'];

const FINISH: Record<string, string> = {
  end_turn: 'stop', stop_sequence: 'stop', pause_turn: 'stop', max_tokens: 'length', model_context_window_exceeded: 'length',
  tool_use: 'tool_calls', refusal: 'content_filter',
};

function request(body: Record<string, unknown>, facts: CallFacts): TranslatedRequest {
  checkKnown(body, KNOWN, 'Anthropic Messages');
  const dropped: string[] = [];
  const names = new Map<string, string>();
  if (body.n !== undefined && body.n !== null && body.n !== 1) refuse('n', '"n" above 1 has no equivalent on this model\'s provider (Anthropic answers once per call).');
  if (body.logprobs === true) refuse('logprobs', '"logprobs" has no equivalent on this model\'s provider.');
  if (typeof body.top_logprobs === 'number' && body.top_logprobs > 0) refuse('top_logprobs', '"top_logprobs" has no equivalent on this model\'s provider.');
  for (const penalty of ['presence_penalty', 'frequency_penalty']) {
    if (body[penalty] !== undefined && body[penalty] !== null && body[penalty] !== 0) refuse(penalty, `"${penalty}" has no equivalent on this model's provider.`);
  }
  if (isObj(body.logit_bias) && Object.keys(body.logit_bias).length > 0) refuse('logit_bias', '"logit_bias" has no equivalent on this model\'s provider.');
  if (body.modalities !== undefined && body.modalities !== null && !(Array.isArray(body.modalities) && body.modalities.every((m) => m === 'text'))) {
    refuse('modalities', 'Only text output can be translated for this model\'s provider.');
  }
  for (const field of DROPPABLE) if (body[field] !== undefined && body[field] !== null) dropped.push(field);

  const out: Record<string, unknown> = { model: body.model };
  const system: Block[] = [];
  const { turns, push } = turnList();
  (body.messages as unknown[]).forEach((m, i) => {
    const msg = m as Record<string, unknown>;
    const at = `messages[${i}]`;
    // A participant's name has no place in Anthropic's turns (found in review: dropped unnamed).
    if (msg.name !== undefined && msg.name !== null && !dropped.includes('messages.name')) dropped.push('messages.name');
    switch (msg.role) {
      case 'system':
      case 'developer': {
        const text = textOf(msg.content, `${at}.content`);
        if (text !== '') system.push({ type: 'text', text });
        break;
      }
      case 'user':
        push('user', userBlocks(msg.content, `${at}.content`, dropped));
        break;
      case 'assistant':
        push('assistant', assistantBlocks(msg, at, names));
        break;
      case 'tool':
        push('user', [{ type: 'tool_result', tool_use_id: toolId(msg.tool_call_id, `call_${i}`), content: textOf(msg.content, `${at}.content`) }]);
        break;
      default:
        refuse(`${at}.role`, `"${at}.role" ${JSON.stringify(msg.role)} has no equivalent on this model's provider.`);
    }
  });
  if (system.length > 0) out.system = system;
  out.messages = turns;
  out.max_tokens = facts.maxOutputTokens;
  const stop = stopSequences(body.stop, 'stop', true);
  if (stop !== undefined) out.stop_sequences = stop;
  sampling(body, out);
  tools(body, out, names, dropped);
  thinking(body.reasoning_effort, 'reasoning_effort', out, dropped);
  outputFormat(body.response_format, 'response_format', out, dropped);
  return { body: out, dropped, names };
}

function userBlocks(content: unknown, at: string, dropped: string[]): Block[] {
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  if (!Array.isArray(content)) return refuse(at, `"${at}" must be a string or an array of content parts.`);
  const blocks: Block[] = [];
  content.forEach((part, j) => {
    const p = isObj(part) ? part : {};
    const where = `${at}[${j}]`;
    if (p.type === 'text' && typeof p.text === 'string') {
      if (p.text !== '') blocks.push({ type: 'text', text: p.text });
    } else if (p.type === 'image_url' && isObj(p.image_url) && typeof p.image_url.url === 'string') {
      const url = p.image_url.url;
      const data = dataUrl(url);
      if (data !== null) blocks.push({ type: 'image', source: { type: 'base64', media_type: data.mediaType, data: data.data } });
      else if (/^https?:\/\//.test(url)) blocks.push({ type: 'image', source: { type: 'url', url } });
      else refuse(`${where}.image_url.url`, `"${where}.image_url.url" must be an http(s) or a base64 data URL.`);
      if (p.image_url.detail !== undefined && p.image_url.detail !== 'auto' && !dropped.includes('image_url.detail')) dropped.push('image_url.detail');
    } else if (p.type === 'file' && isObj(p.file) && typeof p.file.file_data === 'string' && dataUrl(p.file.file_data)?.mediaType === 'application/pdf') {
      blocks.push({ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: dataUrl(p.file.file_data)!.data } });
    } else {
      refuse(where, `"${where}" (${shown(p.type)}) has no equivalent on this model's provider: text, images and PDF files (as data) can be translated.`);
    }
  });
  return blocks;
}

function assistantBlocks(msg: Record<string, unknown>, at: string, names: Map<string, string>): Block[] {
  const blocks: Block[] = [];
  const content = msg.content;
  if (typeof content === 'string') {
    if (content !== '') blocks.push({ type: 'text', text: content });
  } else if (Array.isArray(content)) {
    content.forEach((part, j) => {
      const p = isObj(part) ? part : {};
      const text = p.type === 'text' ? p.text : p.type === 'refusal' ? p.refusal : undefined;
      if (typeof text !== 'string') refuse(`${at}.content[${j}]`, `"${at}.content[${j}]" must be a text or refusal part.`);
      if (text !== '') blocks.push({ type: 'text', text });
    });
  } else if (content !== null && content !== undefined) {
    refuse(`${at}.content`, `"${at}.content" must be a string, an array of parts or null.`);
  }
  if (typeof msg.refusal === 'string' && msg.refusal !== '' && blocks.length === 0) blocks.push({ type: 'text', text: msg.refusal });
  if (msg.tool_calls !== undefined && msg.tool_calls !== null) {
    if (!Array.isArray(msg.tool_calls)) refuse(`${at}.tool_calls`, `"${at}.tool_calls" must be an array.`);
    msg.tool_calls.forEach((call, k) => {
      const c = isObj(call) ? call : {};
      const where = `${at}.tool_calls[${k}]`;
      const fn = isObj(c.function) ? c.function : null;
      if (fn === null || typeof fn.name !== 'string') refuse(where, `"${where}" must be a function call with a name.`);
      blocks.push({
        type: 'tool_use', id: toolId(c.id, `call_${k}`), name: toolName(fn.name, names),
        input: argumentsObject(fn.arguments, `${where}.function.arguments`),
      });
    });
  }
  return blocks;
}

function tools(body: Record<string, unknown>, out: Record<string, unknown>, names: Map<string, string>, dropped: string[]): void {
  if (Array.isArray(body.tools) && body.tools.length > 0) {
    out.tools = body.tools.map((tool, i) => {
      const t = isObj(tool) ? tool : {};
      const fn = isObj(t.function) ? t.function : null;
      if (t.type !== 'function' || fn === null || typeof fn.name !== 'string') {
        return refuse(`tools[${i}]`, `"tools[${i}]" must be a function tool with a name; other tools have no equivalent on this model's provider.`);
      }
      const def: Record<string, unknown> = { name: toolName(fn.name, names), input_schema: isObj(fn.parameters) ? fn.parameters : { type: 'object', properties: {} } };
      if (typeof fn.description === 'string') def.description = fn.description;
      if (fn.strict === true && !dropped.includes('tools.strict')) dropped.push('tools.strict'); // schema adherence is not guaranteed there
      return def;
    });
  }
  toolChoice(body, out, names);
}

/** Chat usage from Anthropic's: `prompt_tokens` includes the cache reads and writes Anthropic counts apart. */
function chatUsage(u: Record<string, unknown>): Record<string, unknown> {
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  const cacheRead = num(u.cache_read_input_tokens);
  const prompt = num(u.input_tokens) + cacheRead + num(u.cache_creation_input_tokens);
  const completion = num(u.output_tokens);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion, prompt_tokens_details: { cached_tokens: cacheRead } };
}

function answer(json: Record<string, unknown>, call: Translation): Record<string, unknown> {
  let text = '';
  const toolCalls: unknown[] = [];
  for (const block of Array.isArray(json.content) ? json.content : []) {
    if (!isObj(block)) continue;
    if (block.type === 'text' && typeof block.text === 'string') text += block.text;
    else if (block.type === 'tool_use') {
      const name = String(block.name);
      toolCalls.push({ id: block.id, type: 'function', function: { name: call.names.get(name) ?? name, arguments: JSON.stringify(block.input ?? {}) } });
    }
  }
  const message: Record<string, unknown> = { role: 'assistant', content: text === '' && toolCalls.length > 0 ? null : text, refusal: null };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  return {
    id: `chatcmpl-${String(json.id)}`, object: 'chat.completion', created: call.created, model: call.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: lookup(FINISH, json.stop_reason) ?? 'stop' }],
    usage: chatUsage(isObj(json.usage) ? json.usage : {}),
  };
}

/** Anthropic events to chat chunks: one chunk per delta; tool calls numbered among tool blocks only. */
function stream(call: Translation, parsed?: ParsedEvents): (event: string | null) => string {
  const created = call.created;
  const wantsUsage = isObj(call.clientBody.stream_options) && call.clientBody.stream_options.include_usage === true;
  let id = `chatcmpl-${call.requestId}`;
  let usage: Record<string, unknown> = {};
  let tools = -1;
  const toolOf = new Map<unknown, number>();
  /** Tool blocks (by block index) whose input has had some text: one with none gets "{}", as a whole answer does. */
  const withArguments = new Set<unknown>();
  /** Tool blocks whose start carried their input whole (a compatible server's way, without deltas). */
  const startInput = new Map<unknown, string>();
  let done = false;
  /** Whether a chunk with finish_reason went out (message_delta's). */
  let finishSent = false;
  // A chunk's text is what JSON.stringify of the whole chunk gives, with the part before its
  // delta built once per id: a stream is mostly chunks of one short delta each.
  let head = '';
  /** A chunk of one delta, given as its JSON text. */
  const chunkOf = (deltaJson: string, finish: string | null) => {
    if (head === '') head = `data: {"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${JSON.stringify(created)},"model":${JSON.stringify(call.model)},"choices":[{"index":0,"delta":`;
    return `${head}${deltaJson},"logprobs":null,"finish_reason":${JSON.stringify(finish)}}]}\n\n`;
  };
  const chunk = (delta: Record<string, unknown>, finish: string | null = null) => chunkOf(JSON.stringify(delta), finish);
  const finish = () => {
    if (done) return '';
    done = true;
    // A stream without message_delta (found in review: the SDK threw "missing finish_reason").
    const last = finishSent ? '' : chunk({}, tools >= 0 ? 'tool_calls' : 'stop');
    const tail = wantsUsage ? dataEvent({ id, object: 'chat.completion.chunk', created, model: call.model, choices: [], usage: chatUsage(usage) }) : '';
    return `${last}${tail}data: [DONE]\n\n`;
  };
  return (event) => {
    if (event === null) {
      if (!done) throw new StreamEnded();
      return '';
    }
    const msg = done ? null : anthropicEvent(event, parsed);
    if (msg === null) return '';
    // A text delta (most events): its text is passed on as the JSON the provider sent, unparsed.
    if (msg instanceof TextDelta) return chunkOf(`{"content":${msg.json}}`, null);
    switch (msg.type) {
      case 'message_start': {
        const m = isObj(msg.message) ? msg.message : {};
        if (typeof m.id === 'string') {
          id = `chatcmpl-${m.id}`;
          head = '';
        }
        if (isObj(m.usage)) usage = mergeUsage({}, m.usage);
        return chunk({ role: 'assistant', content: '' });
      }
      case 'content_block_start': {
        const block = isObj(msg.content_block) ? msg.content_block : {};
        if (block.type === 'tool_use') {
          const index = ++tools;
          toolOf.set(msg.index, index);
          if (isObj(block.input) && Object.keys(block.input).length > 0) startInput.set(msg.index, JSON.stringify(block.input));
          const name = String(block.name);
          return chunk({ tool_calls: [{ index, id: block.id, type: 'function', function: { name: call.names.get(name) ?? name, arguments: '' } }] });
        }
        if (block.type === 'text' && typeof block.text === 'string' && block.text !== '') return chunk({ content: block.text });
        return '';
      }
      case 'content_block_delta': {
        const delta = isObj(msg.delta) ? msg.delta : {};
        if (delta.type === 'text_delta' && typeof delta.text === 'string') return chunk({ content: delta.text });
        if (delta.type === 'input_json_delta' && typeof delta.partial_json === 'string' && delta.partial_json !== '') {
          const index = toolOf.get(msg.index);
          if (index === undefined) return '';
          withArguments.add(msg.index);
          return chunk({ tool_calls: [{ index, function: { arguments: delta.partial_json } }] });
        }
        return ''; // thinking and signatures: chat has no place for them
      }
      case 'content_block_stop': {
        // A tool called with no input: its arguments are "{}" (JSON a client can parse), not "";
        // one whose input came whole in its start has that (found in review: "{}").
        const index = toolOf.get(msg.index);
        if (index === undefined || withArguments.has(msg.index)) return '';
        withArguments.add(msg.index);
        return chunk({ tool_calls: [{ index, function: { arguments: startInput.get(msg.index) ?? '{}' } }] });
      }
      case 'message_delta': {
        if (isObj(msg.usage)) mergeUsage(usage, msg.usage);
        const delta = isObj(msg.delta) ? msg.delta : {};
        finishSent = true;
        return chunk({}, lookup(FINISH, delta.stop_reason) ?? 'stop');
      }
      case 'message_stop':
        return finish();
      case 'error': {
        done = true;
        const error = isObj(msg.error) ? msg.error : {};
        return dataEvent({ error: { message: typeof error.message === 'string' ? error.message : 'The provider reported an error.', type: error.type ?? 'api_error', code: null } });
      }
      default:
        return ''; // ping
    }
  };
}

export const chatToMessages: Translator = { provider: 'messages', request, answer, stream };
