import { isObj } from '../protocols/common.js';
import { lookup, refuse, shown, toolName } from './common.js';

/** What the OpenAI-style requests (Chat, Responses) share on their way to Anthropic's Messages. */

export type Block = Record<string, unknown>;
export type Turn = { role: 'user' | 'assistant'; content: Block[] };

/** Messages turns, consecutive blocks of one role merged into one turn (a tool_result joins the user turn after its tool_use). */
export function turnList(): { turns: Turn[]; push(role: Turn['role'], blocks: Block[]): void } {
  const turns: Turn[] = [];
  return {
    turns,
    push(role, blocks) {
      if (blocks.length === 0) return;
      const last = turns.at(-1);
      // One at a time: a spread of a client-sized array can pass the engine's argument limit.
      if (last !== undefined && last.role === role) for (const block of blocks) last.content.push(block);
      else turns.push({ role, content: blocks });
    },
  };
}

/** `temperature` (Anthropic's range is 0 to 1), `top_p`, `stream`, and the end user as `metadata.user_id`. */
export function sampling(body: Record<string, unknown>, out: Record<string, unknown>): void {
  if (body.temperature !== undefined && body.temperature !== null) {
    if (typeof body.temperature === 'number' && body.temperature > 1) refuse('temperature', '"temperature" must be from 0 to 1 for this model\'s provider.');
    out.temperature = body.temperature;
  }
  if (body.top_p !== undefined && body.top_p !== null) out.top_p = body.top_p;
  if (body.stream === true) out.stream = true;
  const user = typeof body.user === 'string' ? body.user : typeof body.safety_identifier === 'string' ? body.safety_identifier : null;
  if (user !== null) out.metadata = { user_id: user };
}

/**
 * `tool_choice` and `parallel_tool_calls: false` as Anthropic's `tool_choice`, set only with tools
 * (Anthropic takes none without). A named function is `{function: {name}}` in Chat, `{name}` in Responses.
 */
export function toolChoice(body: Record<string, unknown>, out: Record<string, unknown>, names: Map<string, string>): void {
  const choice = body.tool_choice;
  let mapped: Record<string, unknown> | null = null;
  const named = isObj(choice) && choice.type === 'function' ? (isObj(choice.function) ? choice.function.name : choice.name) : undefined;
  if (choice === 'auto') mapped = { type: 'auto' };
  else if (choice === 'none') mapped = { type: 'none' };
  else if (choice === 'required') mapped = { type: 'any' };
  else if (typeof named === 'string') mapped = { type: 'tool', name: toolName(named, names) };
  else if (choice !== undefined && choice !== null) refuse('tool_choice', '"tool_choice" must be auto, none, required or a named function.');
  if (out.tools === undefined) return;
  if (body.parallel_tool_calls === false) {
    mapped ??= { type: 'auto' };
    if (mapped.type !== 'none') mapped.disable_parallel_tool_use = true;
  }
  if (mapped !== null) out.tool_choice = mapped;
}

/** Extended-thinking budgets for OpenAI's reasoning efforts (below `max_tokens`, at least Anthropic's 1,024). */
const EFFORT_BUDGET: Record<string, number> = { low: 1024, medium: 4096, high: 16384, xhigh: 32768 };

/** A reasoning effort as extended thinking; 'none' and 'minimal' (and no effort) leave it off. */
export function thinking(effort: unknown, param: string, out: Record<string, unknown>, dropped: string[]): void {
  if (effort === undefined || effort === null || effort === 'none' || effort === 'minimal') return;
  const budget = lookup(EFFORT_BUDGET, effort);
  if (budget === undefined) refuse(param, `"${param}" ${JSON.stringify(effort)} is not one of none, minimal, low, medium, high, xhigh.`);
  const maxTokens = out.max_tokens as number;
  if (maxTokens <= 1024) refuse(param, `"${param}" needs an output limit above 1024 tokens on this model's provider.`);
  if (out.temperature !== undefined && out.temperature !== 1) refuse('temperature', `"temperature" must be 1 (or absent) with "${param}" on this model's provider.`);
  // With thinking on, Anthropic takes a tool loop's last assistant turn only with the thinking
  // that began it, which a client of another protocol never had to give back: thinking stays
  // off for that step, visibly (found in review: every second step of a tool loop was a 400).
  if (toolTurnWithoutThinking(out.messages)) return void dropped.push(param);
  out.thinking = { type: 'enabled', budget_tokens: Math.min(budget, maxTokens - 1) };
}

/** Whether the last assistant turn calls a tool and does not start with a thinking block. */
function toolTurnWithoutThinking(messages: unknown): boolean {
  if (!Array.isArray(messages)) return false;
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as { role?: unknown; content?: unknown };
    if (m.role !== 'assistant') continue;
    const blocks = Array.isArray(m.content) ? m.content as Array<{ type?: unknown }> : [];
    const first = blocks[0]?.type;
    return first !== 'thinking' && first !== 'redacted_thinking' && blocks.some((b) => b.type === 'tool_use');
  }
  return false;
}

/**
 * OpenAI's structured output (`json_schema`: chat's `response_format.json_schema`, the Responses
 * API's `text.format`) as Anthropic's, `output_config.format` (found in review: LangChain's and
 * the AI SDK's default way to ask for an object was refused). JSON mode without a schema
 * (`json_object`) has no equivalent there.
 */
export function outputFormat(format: unknown, param: string, out: Record<string, unknown>, dropped: string[]): void {
  if (format === undefined || format === null) return;
  if (!isObj(format)) refuse(param, `"${param}" must be an object.`);
  if (format.type === 'text') return;
  const chat = param === 'response_format';
  const spec = chat ? (isObj(format.json_schema) ? format.json_schema : {}) : format;
  if (format.type !== 'json_schema' || !isObj(spec.schema)) {
    refuse(param, `"${param}" ${format.type === 'json_object' ? '(JSON without a schema)' : shown(format.type)} has no equivalent on this model's provider: give a json_schema with its "schema".`);
  }
  // Anthropic's format has no description (found in review: it went unnamed).
  if (typeof spec.description === 'string' && spec.description !== '') dropped.push(chat ? 'response_format.json_schema.description' : 'text.format.description');
  out.output_config = { format: { type: 'json_schema', schema: spec.schema } };
}
