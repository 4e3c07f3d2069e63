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
  if (Array.isArray(chat.messages)) for (const m of chat.messages) if (isObj(m)) addMessage(m, input);
  const out: Record<string, unknown> = { input };
  const tools = Array.isArray(chat.tools) ? chat.tools.map(toolOf).filter((t) => t !== null) : [];
  if (tools.length > 0) out.tools = tools;
  return out;
}

function addMessage(m: Record<string, unknown>, input: unknown[]): void {
  const role = m.role;
  if (role === 'tool') {
    input.push({ type: 'function_call_output', call_id: String(m.tool_call_id ?? ''), output: textOf(m.content) });
    return;
  }
  if (role === 'assistant') {
    const text = textOf(m.content) + (typeof m.refusal === 'string' ? m.refusal : '');
    if (text !== '') input.push({ role: 'assistant', content: text });
    if (Array.isArray(m.tool_calls)) for (const call of m.tool_calls) if (isObj(call)) addCall(call, input);
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

function addCall(call: Record<string, unknown>, input: unknown[]): void {
  const callId = String(call.id ?? '');
  if (isObj(call.function)) {
    input.push({ type: 'function_call', call_id: callId, name: String(call.function.name ?? ''), arguments: String(call.function.arguments ?? '') });
  } else if (isObj(call.custom)) {
    input.push({ type: 'custom_tool_call', call_id: callId, name: String(call.custom.name ?? ''), input: String(call.custom.input ?? '') });
  }
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
  if (tool.type === 'custom' && isObj(tool.custom)) return { type: 'custom', ...tool.custom };
  return null;
}
