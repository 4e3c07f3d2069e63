import { isObj } from '../protocols/common.js';

/**
 * A Chat Completions request's input as the Responses API writes it (`input` and `tools`), for
 * OpenAI's input count (POST /responses/input_tokens), which takes only that shape: how a chat
 * call holding a file, and a Messages count on an OpenAI-protocol model, are counted. Only for
 * counting: what has no Responses form (audio, a legacy function message) is left out, so the
 * count is a floor the gateway's own estimate still stands beside, never a made-up figure.
 */
export function responsesInputOf(chat: Record<string, unknown>): Record<string, unknown> {
  const input: unknown[] = [];
  const custom = new Set<string>(); // the ids of custom tool calls, whose results are custom_tool_call_output
  if (Array.isArray(chat.messages)) for (const m of chat.messages) if (isObj(m)) addMessage(m, input, custom);
  const out: Record<string, unknown> = { input };
  const tools = Array.isArray(chat.tools) ? chat.tools.map(toolOf).filter((t) => t !== null) : [];
  if (tools.length > 0) out.tools = tools;
  return out;
}

/**
 * Only the files of a chat request, as Responses input parts: what its estimate misses (a PDF's
 * pages), counted alone when the count refuses the whole converted input.
 */
export function responsesFilesOf(chat: Record<string, unknown>): unknown[] {
  const files: unknown[] = [];
  if (Array.isArray(chat.messages)) {
    for (const m of chat.messages) {
      if (!isObj(m) || !Array.isArray(m.content)) continue;
      for (const part of m.content) if (isObj(part) && part.type === 'file') files.push(partOf(part));
    }
  }
  return files.filter((f) => f !== null);
}

function addMessage(m: Record<string, unknown>, input: unknown[], custom: Set<string>): void {
  const role = m.role;
  if (role === 'tool') {
    const callId = str(m.tool_call_id);
    input.push({ type: custom.has(callId) ? 'custom_tool_call_output' : 'function_call_output', call_id: callId, output: textOf(m.content) });
    return;
  }
  if (role === 'assistant') {
    const text = textOf(m.content) + str(m.refusal);
    if (text !== '') input.push({ role: 'assistant', content: text });
    if (Array.isArray(m.tool_calls)) for (const call of m.tool_calls) if (isObj(call)) addCall(call, input, custom);
    return;
  }
  if (role !== 'user' && role !== 'system' && role !== 'developer') return; // a legacy `function` message: no Responses form
  if (typeof m.content === 'string') {
    input.push({ role, content: m.content });
    return;
  }
  if (!Array.isArray(m.content)) return;
  const content: unknown[] = [];
  for (const part of m.content) {
    const p = partOf(part);
    if (p !== null) content.push(p);
  }
  if (content.length > 0) input.push({ role, content });
}

function addCall(call: Record<string, unknown>, input: unknown[], custom: Set<string>): void {
  const callId = str(call.id);
  if (isObj(call.function)) {
    input.push({ type: 'function_call', call_id: callId, name: str(call.function.name), arguments: str(call.function.arguments) });
  } else if (isObj(call.custom)) {
    custom.add(callId);
    input.push({ type: 'custom_tool_call', call_id: callId, name: str(call.custom.name), input: str(call.custom.input) });
  }
}

/** A string the client sent, or '' (never String() of a client's object: its toString may be anything, or throw). */
function str(value: unknown): string {
  return typeof value === 'string' ? value : '';
}

/** A user, system or developer content part, or null for one with no Responses form (audio). */
function partOf(part: unknown): Record<string, unknown> | null {
  if (!isObj(part)) return null;
  if (part.type === 'text' && typeof part.text === 'string') return { type: 'input_text', text: part.text };
  if (part.type === 'image_url') {
    const image = isObj(part.image_url) ? part.image_url : { url: part.image_url };
    if (typeof image.url !== 'string') return null;
    return { type: 'input_image', image_url: image.url, detail: typeof image.detail === 'string' ? image.detail : 'auto' };
  }
  if (part.type === 'file' && isObj(part.file)) {
    const file: Record<string, unknown> = { type: 'input_file' };
    for (const field of ['file_id', 'file_data', 'filename']) if (typeof part.file[field] === 'string') file[field] = part.file[field];
    return file;
  }
  return null;
}

/** Text of a string or of an array's text parts (what a chat assistant or tool message holds). */
function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  let text = '';
  for (const part of content) if (isObj(part) && typeof part.text === 'string') text += part.text;
  return text;
}

/** A chat tool as the Responses API writes it; `strict` said, for the Responses API makes it true when omitted. */
function toolOf(tool: unknown): Record<string, unknown> | null {
  if (!isObj(tool)) return null;
  if (tool.type === 'function' && isObj(tool.function)) {
    const fn = tool.function;
    const out: Record<string, unknown> = { type: 'function', name: fn.name, parameters: fn.parameters ?? { type: 'object', properties: {} }, strict: fn.strict === true };
    if (typeof fn.description === 'string') out.description = fn.description;
    return out;
  }
  if (tool.type === 'custom' && isObj(tool.custom)) {
    // Chat nests a grammar (`format.grammar`); the Responses API has it flat.
    const { format, ...rest } = tool.custom;
    const out: Record<string, unknown> = { ...rest, type: 'custom' };
    if (isObj(format)) out.format = isObj(format.grammar) ? { type: format.type, ...format.grammar } : format;
    return out;
  }
  return null;
}
