import { hash } from 'node:crypto';
import { MAX_DEPTH, nestsTooDeep } from '../billing/estimate.js';
import { isObj } from '../protocols/common.js';
import { readEvent, TextDelta } from '../protocols/messages/text-delta.js';
import { eventData, type ParsedEvents } from '../providers/sse.js';

/** What the directions share: refusals, ids and names both protocols accept, images, SSE text. */

/** A request the target protocol cannot express: 400 naming the field. */
export class Untranslatable extends Error {
  constructor(readonly param: string, message: string) {
    super(message);
    this.name = 'Untranslatable';
  }
}

export function refuse(param: string, message: string): never {
  throw new Untranslatable(param, message);
}

const ID_OK = /^[A-Za-z0-9_-]+$/;

/**
 * A tool-call id Anthropic accepts (`^[a-zA-Z0-9_-]+$`): valid ids unchanged, others with the
 * odd characters replaced and a hash of the original appended, so the same id always maps to the
 * same result (a tool_use and its tool_result still match) and two ids never collide.
 */
export function toolId(id: unknown, fallback: string): string {
  if (typeof id !== 'string' || id === '') return fallback;
  if (ID_OK.test(id)) return id;
  return `${id.replace(/[^A-Za-z0-9_-]/g, '_').slice(0, 40)}_${hash('sha256', id).slice(0, 8)}`;
}

/** The longest tool name both protocols accept. */
export const MAX_TOOL_NAME = 64;

/**
 * A tool name of at most 64 characters: longer ones are cut and given a hash of the whole name,
 * deterministically (the tools list and the history agree); `names` maps it back for answers.
 */
export function toolName(name: string, names: Map<string, string>): string {
  if (name.length <= MAX_TOOL_NAME) return name;
  const short = `${name.slice(0, MAX_TOOL_NAME - 9)}_${hash('sha256', name).slice(0, 8)}`;
  names.set(short, name);
  return short;
}

/** A data URL's media type and base64 data, or null. */
export function dataUrl(url: string): { mediaType: string; data: string } | null {
  const m = /^data:([^;,]+);base64,/.exec(url);
  return m === null ? null : { mediaType: m[1]!, data: url.slice(m[0].length) };
}

/**
 * Stop sequences as a list of strings (chat's `stop` may also be one string), or undefined for
 * none; any other value is refused here rather than sent on for the provider's own 400 (found in
 * review: chat's `stop: 5` reached Anthropic as `stop_sequences: 5`).
 */
export function stopSequences(value: unknown, param: string, orString: boolean): string[] | undefined {
  if (value === undefined || value === null) return undefined;
  if (orString && typeof value === 'string') return [value];
  if (!Array.isArray(value) || !value.every((s) => typeof s === 'string')) {
    refuse(param, `"${param}" must be ${orString ? 'a string or ' : ''}an array of strings.`);
  }
  return value.length > 0 ? value as string[] : undefined;
}

/** Text of a string or an array of text parts (other parts refused, naming `param`). */
export function textOf(content: unknown, param: string): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return content === null || content === undefined ? '' : refuse(param, `"${param}" must be a string or an array of text parts.`);
  let text = '';
  content.forEach((part, i) => {
    if (!isObj(part) || typeof part.text !== 'string' || (part.type !== 'text' && part.type !== 'input_text' && part.type !== 'output_text')) {
      refuse(`${param}[${i}]`, `"${param}[${i}]" has no equivalent here: only text parts can be translated in this place.`);
    }
    text += part.text;
  });
  return text;
}

/** Parses tool arguments (a JSON string) into the object Anthropic wants; '' is no arguments. */
export function argumentsObject(args: unknown, param: string): Record<string, unknown> {
  if (args === undefined || args === null || args === '') return {};
  if (typeof args !== 'string') return refuse(param, `"${param}" must be a JSON string.`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(args);
  } catch {
    return refuse(param, `"${param}" is not valid JSON, and the model's provider needs the arguments as an object.`);
  }
  if (!isObj(parsed)) return refuse(param, `"${param}" must be a JSON object.`);
  // The body's depth was checked with the arguments as a string; as an object they nest in it.
  if (nestsTooDeep(parsed)) return refuse(param, `"${param}" nests deeper than ${MAX_DEPTH} levels.`);
  return parsed;
}

/**
 * A client's value named in an error message: a string as it is, anything else by its kind
 * (String() of an object can throw: `{"toString": 1}`).
 */
export function shown(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === null || typeof v !== 'object') return String(v);
  return Array.isArray(v) ? 'an array' : 'an object';
}

/**
 * The arguments a model streamed or returned, as an object for an Anthropic client. Invalid
 * JSON (models do produce it) is kept whole under `_raw_arguments`, never replaced by `{}`.
 */
export function answerArguments(args: unknown): Record<string, unknown> {
  if (typeof args !== 'string' || args.trim() === '') return {};
  try {
    const parsed = JSON.parse(args) as unknown;
    if (isObj(parsed)) return parsed;
  } catch {
    // kept below
  }
  return { _raw_arguments: args };
}

/**
 * An event's data as a JSON object, or null (no data, not JSON, not an object); taken from
 * `parsed` when the stream's watcher parsed it already (kept under the whole `event`).
 */
export function eventObject(data: string | null, parsed?: ParsedEvents, event = data): Record<string, unknown> | null {
  if (data === null) return null;
  try {
    let value = parsed === undefined ? JSON.parse(data) as unknown : parsed.take(data, JSON.parse, event ?? data);
    // A watcher that read Anthropic's text deltas its own way: this reader wants the object.
    if (value instanceof TextDelta) value = JSON.parse(data) as unknown;
    return isObj(value) ? value : null;
  } catch {
    return null;
  }
}

/**
 * An Anthropic event's data: a TextDelta (read without JSON.parse), else its object, or null;
 * the watcher's reading when it made one (kept under the event, whose data is then not looked up again).
 */
export function anthropicEvent(event: string, parsed?: ParsedEvents): TextDelta | Record<string, unknown> | null {
  try {
    let value = parsed === undefined ? undefined : parsed.taken(event);
    if (value === undefined) {
      const data = eventData(event);
      if (data === null) return null;
      value = readEvent(data);
    }
    return value instanceof TextDelta || isObj(value) ? value : null;
  } catch {
    return null;
  }
}

/** One `data:` event of OpenAI's style. */
export function dataEvent(value: unknown): string {
  return `data: ${JSON.stringify(value)}\n\n`;
}

/** The fields of a request a translation knows; any other is refused, never silently dropped. */
export function checkKnown(body: Record<string, unknown>, known: ReadonlySet<string>, target: string): void {
  for (const field of Object.keys(body)) {
    if (!known.has(field)) refuse(field, `"${field}" has no equivalent in the ${target} protocol of this model's provider.`);
  }
}

/**
 * `table[key]` for a key from a request or a provider: only the table's own entries (a key
 * such as "__proto__" or "constructor" finds nothing), undefined for anything else.
 */
export function lookup<T>(table: Readonly<Record<string, T>>, key: unknown): T | undefined {
  return typeof key === 'string' && Object.hasOwn(table, key) ? table[key] : undefined;
}

/**
 * The provider's stream ended without its final event: the client must not be shown a finished
 * answer made up at the end (the translated call cuts it instead, as a passthrough one breaks off).
 */
export class StreamEnded extends Error {
  constructor() {
    super('the provider\'s stream ended before its final event');
    this.name = 'StreamEnded';
  }
}

/** The counts of Anthropic's usage a translation reports to its client. */
const USAGE_COUNTS = ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'] as const;

/**
 * Anthropic's running usage, with the counts of a later event's usage over it: only those
 * counts (found in review: every key a provider sent was kept and copied again at each
 * message_delta, so a stream of deltas with new keys took the process quadratic time, seconds
 * of a blocked event loop for half a megabyte).
 */
export function mergeUsage(into: Record<string, unknown>, from: Record<string, unknown>): Record<string, unknown> {
  // Counts only: a later null (which Anthropic's types allow) does not wipe an earlier count (found in review).
  for (const name of USAGE_COUNTS) if (typeof from[name] === 'number') into[name] = from[name];
  return into;
}
