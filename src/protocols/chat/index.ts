import type { Usage } from '../../money.js';
import {
  ABSENT, bad, checkBasics, checkMessages, checkServiceTier, count, echo, INVALID, isObj, largestLimit, lastUserText, messagesChars, modelSwapped, outputLimits, pieces, pump,
  sendJson, textChars, tokensOf, withModel,
} from '../common.js';
import { prependTopLevel } from '../splice.js';
import { eventData } from '../../providers/sse.js';
import type { Exchange } from '../../providers/types.js';
import type { AudioAsked, WireProtocol } from '../types.js';

/** OpenAI Chat Completions: POST /v1/chat/completions, plain or SSE (`data:` lines, then `data: [DONE]`). */

/** The most answers one call may ask for (OpenAI's own bound on `n`). */
export const MAX_CHOICES = 128;

/**
 * Usage of a Chat Completions (or Embeddings) answer: `prompt_tokens` includes the cached ones.
 * A completion without `completion_tokens` is not believed (its output would be charged as 0):
 * null, so the call is charged the estimate. Embeddings have none (`output: false`).
 */
export function chatUsage(u: unknown, output = true): Usage | null {
  if (!isObj(u)) return null;
  const prompt = count(u.prompt_tokens);
  const completion = count(u.completion_tokens);
  const promptDetails = isObj(u.prompt_tokens_details) ? u.prompt_tokens_details : null;
  const cached = promptDetails !== null ? count(promptDetails.cached_tokens) : ABSENT;
  if (prompt < 0 || completion === INVALID || (output && completion < 0) || cached === INVALID) return null;
  const cacheRead = Math.min(Math.max(cached, 0), prompt);
  const usage: Usage = { inputTokens: prompt - cacheRead, outputTokens: Math.max(completion, 0), cacheReadTokens: cacheRead, cacheWriteTokens: 0 };
  // Audio tokens, inside the counts above, billed at the audio prices (found in review: at the text ones).
  const audioIn = promptDetails !== null ? count(promptDetails.audio_tokens) : ABSENT;
  const audioOut = isObj(u.completion_tokens_details) ? count(u.completion_tokens_details.audio_tokens) : ABSENT;
  if (audioIn === INVALID || audioOut === INVALID) return null;
  if (audioIn > 0) usage.audioInputTokens = Math.min(audioIn, usage.inputTokens);
  if (audioOut > 0) usage.audioOutputTokens = Math.min(audioOut, usage.outputTokens);
  return usage;
}

/**
 * Where a chat request asks for audio: an `input_audio` part or an earlier answer's `audio`
 * in its messages, and `audio` or `modalities` with "audio" for its answer. Null: none.
 */
function audioAsked(b: Record<string, unknown>): AudioAsked | null {
  let input: string | null = null;
  let inputParts = 0;
  const messages = b.messages as unknown[]; // checked: an array of objects
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i] as Record<string, unknown>;
    if (m.audio !== undefined && m.audio !== null) {
      input ??= `messages[${i}].audio`;
      inputParts++;
    }
    if (!Array.isArray(m.content)) continue;
    for (let j = 0; j < m.content.length; j++) {
      const part = m.content[j] as unknown;
      if (isObj(part) && part.type === 'input_audio') {
        input ??= `messages[${i}].content[${j}]`;
        inputParts++;
      }
    }
  }
  const output = Array.isArray(b.modalities) && b.modalities.includes('audio') ? 'modalities'
    : b.audio !== undefined && b.audio !== null ? 'audio' : null;
  return input === null && output === null ? null : { input, output, inputParts };
}

const OUTPUT = new Set(['content', 'refusal', 'arguments', 'reasoning_content']);
/**
 * Speech is about 50 audio tokens a second at OpenAI (its $0.24 a minute at $80 a million) and
 * about 15 characters of transcript: some 3 tokens a character, 12 of the 4-character units
 * output is counted in.
 */
const AUDIO_CHARS_PER_TRANSCRIPT_CHAR = 12;

/** A whole answer's spoken output, as its transcript stands for it (see above). */
function transcriptChars(choices: unknown): number {
  if (!Array.isArray(choices)) return 0;
  let n = 0;
  for (const choice of choices) {
    const audio = isObj(choice) && isObj(choice.message) && isObj(choice.message.audio) ? choice.message.audio : null;
    if (audio !== null && typeof audio.transcript === 'string') n += audio.transcript.length * AUDIO_CHARS_PER_TRANSCRIPT_CHAR;
  }
  return n;
}

/**
 * The output limit to send as `max_tokens` too, or null: a call that set only
 * `max_completion_tokens`, to a provider whose server reads only `max_tokens` (its
 * `outputLimitField`). Sent as it is, such a server would generate past the limit the call reserved.
 */
function limitToName(ex: Exchange): number | null {
  if (ex.model.provider.outputLimitField !== 'max_tokens') return null;
  const limit = ex.body.max_completion_tokens;
  return typeof limit === 'number' && (ex.body.max_tokens === undefined || ex.body.max_tokens === null) ? limit : null;
}

/** The client asked for the usage chunk of a stream itself (else the gateway asks, and drops it). */
const clientAskedUsage = (body: Record<string, unknown>) => isObj(body.stream_options) && body.stream_options.include_usage === true;

export const chat: WireProtocol = {
  endpoint: 'chat',
  path: '/v1/chat/completions',
  anthropic: false,

  check(body) {
    const basic = checkBasics(body);
    if (basic !== null) return basic;
    const b = body as Record<string, unknown>;
    const messages = checkMessages(b);
    if (messages !== null) return messages;
    const limits = outputLimits(b, ['max_completion_tokens', 'max_tokens']);
    if (!Array.isArray(limits)) return limits;
    let choices = 1;
    if (b.n !== undefined && b.n !== null) {
      if (typeof b.n !== 'number' || !Number.isInteger(b.n) || b.n < 1 || b.n > MAX_CHOICES) {
        return bad('n', `"n" must be an integer from 1 to ${MAX_CHOICES}.`);
      }
      choices = b.n;
    }
    if (b.stream_options !== undefined && b.stream_options !== null && !isObj(b.stream_options)) {
      return bad('stream_options', '"stream_options" must be an object.');
    }
    const tier = checkServiceTier(b);
    if (tier !== null) return tier;
    return {
      ok: true,
      call: {
        body: b, model: b.model as string, stream: b.stream === true, maxTokens: limits[0]?.[1] ?? null, limits, choices, audio: audioAsked(b),
        // Any value: the provider judges it, and a refusal is free.
        searchesPerCall: b.web_search_options != null ? 1 : 0,
      },
    };
  },

  // Passed on as it is, both limits go: a provider may honour either, so the larger is reserved.
  // (Translated, the first one, max_completion_tokens, is the call's limit.)
  outputBudget: (call, model) => largestLimit(call.limits) ?? model.maxOutputTokens,

  upstreamBody(ex) {
    const limit = limitToName(ex);
    // Usage is how the call is metered: always ask for it (the extra chunk is removed again
    // below when the client did not ask for it). Usually the client sent no stream_options
    // (nor max_tokens, when it is added): added to the text, the rest not re-serialised.
    if (limit === null || ex.body.max_tokens === undefined) {
      let text: string | null = null;
      if (!ex.stream || clientAskedUsage(ex.body)) text = modelSwapped(ex);
      else if (ex.body.stream_options === undefined) text = prependTopLevel(modelSwapped(ex), 'stream_options', '{"include_usage":true}');
      if (text !== null) return limit === null ? text : prependTopLevel(text, 'max_tokens', String(limit));
    }
    const body = withModel(ex);
    if (limit !== null) body.max_tokens = limit;
    if (ex.stream && !clientAskedUsage(ex.body)) body.stream_options = { ...(isObj(body.stream_options) ? body.stream_options : {}), include_usage: true };
    return JSON.stringify(body);
  },

  usage: (json) => (isObj(json) ? chatUsage(json.usage) : null),

  outputChars: (json) => (isObj(json) ? textChars(json.choices, OUTPUT) + transcriptChars(json.choices) : 0),

  watch(ex) {
    const clientAsked = clientAskedUsage(ex.body);
    let usage: Usage | null = null;
    // Final only from the usage chunk (no choices, sent last) or at [DONE]: some compatible
    // servers report running usage in every chunk, which is not final if the stream breaks off.
    let final = false;
    // Answers came after the last usage seen: it is partial, never final (found in review: a
    // server's early usage chunk, 0 output, was charged as final for all the output after it).
    let stale = false;
    return {
      see(event) {
        const data = eventData(event);
        if (data === null) return { forward: true, final: false };
        if (data === '[DONE]') {
          final = true;
          return { forward: true, final: true };
        }
        let chunk: unknown;
        try {
          chunk = ex.parsedEvents === undefined ? JSON.parse(data) : ex.parsedEvents.parse(data, JSON.parse, event);
        } catch {
          return { forward: true, final: false };
        }
        if (!isObj(chunk)) return { forward: true, final: false };
        const choices = Array.isArray(chunk.choices) ? chunk.choices : [];
        let output = 0;
        for (const choice of choices) {
          const delta = isObj(choice) && isObj(choice.delta) ? choice.delta : null;
          if (delta === null) continue;
          if (typeof delta.content === 'string') output += delta.content.length;
          if (typeof delta.refusal === 'string') output += delta.refusal.length;
          if (typeof delta.reasoning_content === 'string') output += delta.reasoning_content.length;
          if (Array.isArray(delta.tool_calls)) output += JSON.stringify(delta.tool_calls).length;
          // Spoken output: its transcript, at the audio tokens it stands for (an estimate).
          if (isObj(delta.audio) && typeof delta.audio.transcript === 'string') output += delta.audio.transcript.length * AUDIO_CHARS_PER_TRANSCRIPT_CHAR;
        }
        if (output > 0) {
          ex.noteOutput(output);
          stale = true; // (a chunk with no output, a finish or a filter's note, leaves the usage final)
        }
        const seen = chatUsage(chunk.usage);
        if (seen !== null) {
          usage = seen;
          stale = false;
          ex.noteUsage(seen);
          if (choices.length === 0) {
            final = true;
            if (!clientAsked) return { forward: false, final: false };
          }
        }
        return { forward: true, final: false };
      },
      usage: () => (final && !stale ? usage : null),
    };
  },

  mock(ex, tokensPerSecond) {
    const { text, truncated } = echo(lastUserText(ex.body), ex.maxOutputTokens);
    const usage: Usage = { inputTokens: tokensOf(messagesChars(ex.body)), outputTokens: tokensOf(text.length), cacheReadTokens: 0, cacheWriteTokens: 0 };
    const counts = { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens };
    if (!ex.stream) {
      ex.noteOutput(text.length);
      return ex.settle(usage, () => sendJson(ex, {
        id: `chatcmpl-${ex.requestId}`, object: 'chat.completion', created: Math.floor(Date.now() / 1000), model: ex.model.upstreamModel,
        choices: [{ index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null, finish_reason: truncated ? 'length' : 'stop' }],
        usage: counts,
      }));
    }
    const options = ex.body.stream_options as { include_usage?: unknown } | undefined;
    const includeUsage = options?.include_usage === true;
    const prefix = `data: {"id":"chatcmpl-${ex.requestId}","object":"chat.completion.chunk","created":${Math.floor(Date.now() / 1000)},"model":${JSON.stringify(ex.model.upstreamModel)},"choices":`;
    const suffix = includeUsage ? ',"usage":null}\n\n' : '}\n\n';
    const chunk = (delta: string, finish: string) => `${prefix}[{"index":0,"delta":${delta},"finish_reason":${finish}}]${suffix}`;
    ex.head(200, 'text/event-stream', ['cache-control', 'no-cache']);
    ex.write(chunk('{"role":"assistant","content":""}', 'null'));
    pump(ex, pieces(text), tokensPerSecond, (piece) => chunk(`{"content":${JSON.stringify(piece)}}`, 'null'), () => {
      ex.settle(usage, () => {
        let tail = chunk('{}', truncated ? '"length"' : '"stop"');
        if (includeUsage) tail += `${prefix}[],"usage":${JSON.stringify(counts)}}\n\n`;
        ex.end(`${tail}data: [DONE]\n\n`);
      });
    });
  },
};
