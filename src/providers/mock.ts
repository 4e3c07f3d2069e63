import { hash } from 'node:crypto';
import type { ProviderConfig } from '../config/types.js';
import type { Usage } from '../money.js';
import { inputChars, lastUserText, tokensOf } from './text.js';
import type { Exchange, Provider } from './types.js';

/**
 * The built-in provider with no network: answers in the protocol of the endpoint called,
 * echoes the last user message, counts 1 token per 4 characters, streams one chunk per
 * token paced at `tokensPerSecond`, after `latencyMs`.
 */
export class MockProvider implements Provider {
  constructor(private readonly config: ProviderConfig) {}

  handle(ex: Exchange): void {
    ex.noteDelivered(true); // the mock has the request at once
    if (this.config.latencyMs === 0) return this.answer(ex);
    const timer = setTimeout(() => this.answer(ex), this.config.latencyMs);
    ex.onAbort(() => clearTimeout(timer));
  }

  private answer(ex: Exchange): void {
    if (ex.aborted) return;
    if (ex.endpoint === 'embeddings') return embeddings(ex);
    let text = lastUserText(ex.body);
    const limit = ex.maxOutputTokens * 4;
    const truncated = text.length > limit;
    if (truncated) text = text.slice(0, limit);
    const usage: Usage = {
      inputTokens: tokensOf(inputChars(ex.body)), outputTokens: tokensOf(text.length), cacheReadTokens: 0, cacheWriteTokens: 0,
    };
    if (ex.endpoint === 'chat') {
      if (ex.stream) chatStream(ex, text, truncated, usage, this.config.tokensPerSecond);
      else chat(ex, text, truncated, usage);
    } else if (ex.stream) messagesStream(ex, text, truncated, usage, this.config.tokensPerSecond);
    else messages(ex, text, truncated, usage);
  }
}

function sendJson(ex: Exchange, value: unknown): void {
  const body = JSON.stringify(value);
  ex.head(200, 'application/json', ['content-length', String(Buffer.byteLength(body))]);
  ex.end(body);
}

function chat(ex: Exchange, text: string, truncated: boolean, usage: Usage): void {
  ex.noteOutput(text.length);
  ex.settle(usage, () => sendJson(ex, {
    id: `chatcmpl-${ex.requestId}`, object: 'chat.completion', created: Math.floor(Date.now() / 1000),
    model: ex.model.upstreamModel,
    choices: [{ index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null,
      finish_reason: truncated ? 'length' : 'stop' }],
    usage: { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens,
      total_tokens: usage.inputTokens + usage.outputTokens },
  }));
}

function chatStream(ex: Exchange, text: string, truncated: boolean, usage: Usage, tokensPerSecond: number): void {
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
      if (includeUsage) {
        tail += `${prefix}[],"usage":${JSON.stringify({ prompt_tokens: usage.inputTokens,
          completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens })}}\n\n`;
      }
      ex.end(`${tail}data: [DONE]\n\n`);
    });
  });
}

function messages(ex: Exchange, text: string, truncated: boolean, usage: Usage): void {
  ex.noteOutput(text.length);
  ex.settle(usage, () => sendJson(ex, {
    id: `msg_${ex.requestId}`, type: 'message', role: 'assistant', model: ex.model.upstreamModel,
    content: [{ type: 'text', text }], stop_reason: truncated ? 'max_tokens' : 'end_turn', stop_sequence: null,
    usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
  }));
}

function event(type: string, data: unknown): string {
  return `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
}

function messagesStream(ex: Exchange, text: string, truncated: boolean, usage: Usage, tokensPerSecond: number): void {
  ex.head(200, 'text/event-stream', ['cache-control', 'no-cache']);
  const startUsage: Usage = { inputTokens: usage.inputTokens, outputTokens: 1, cacheReadTokens: 0, cacheWriteTokens: 0 };
  ex.noteUsage(startUsage); // as a real provider's message_start: input known, output not yet
  ex.write(
    event('message_start', { type: 'message_start', message: {
      id: `msg_${ex.requestId}`, type: 'message', role: 'assistant', model: ex.model.upstreamModel, content: [],
      stop_reason: null, stop_sequence: null, usage: { input_tokens: usage.inputTokens, output_tokens: 1 } } }) +
    event('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }) +
    event('ping', { type: 'ping' }),
  );
  const delta = (piece: string) =>
    event('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: piece } });
  pump(ex, pieces(text), tokensPerSecond, delta, () => {
    ex.write(event('content_block_stop', { type: 'content_block_stop', index: 0 }));
    ex.settle(usage, () => ex.end(
      event('message_delta', { type: 'message_delta', delta: { stop_reason: truncated ? 'max_tokens' : 'end_turn',
        stop_sequence: null }, usage: { output_tokens: usage.outputTokens } }) +
      event('message_stop', { type: 'message_stop' }),
    ));
  });
}

function embeddings(ex: Exchange): void {
  const input = ex.body.input;
  const texts = Array.isArray(input) ? input.map((s) => (typeof s === 'string' ? s : JSON.stringify(s))) : [String(input)];
  const dimensions = typeof ex.body.dimensions === 'number' ? ex.body.dimensions : 8;
  const usage: Usage = { inputTokens: tokensOf(inputChars(ex.body)), outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };
  ex.settle(usage, () => sendJson(ex, {
    object: 'list', model: ex.model.upstreamModel,
    data: texts.map((text, index) => ({ object: 'embedding', index, embedding: vectorOf(text, dimensions) })),
    usage: { prompt_tokens: usage.inputTokens, total_tokens: usage.inputTokens },
  }));
}

/** A deterministic unit vector from the text's hash: same text, same embedding. */
function vectorOf(text: string, dimensions: number): number[] {
  const digest = Buffer.from(hash('sha256', text, 'hex'), 'hex');
  const v: number[] = [];
  let norm = 0;
  for (let i = 0; i < dimensions; i++) {
    const x = digest[i % digest.length]! / 127.5 - 1;
    v.push(x);
    norm += x * x;
  }
  norm = Math.sqrt(norm) || 1;
  return v.map((x) => Math.round((x / norm) * 1e6) / 1e6);
}

/** One piece per token (4 characters). */
function pieces(text: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < text.length; i += 4) out.push(text.slice(i, i + 4));
  return out;
}

/**
 * Writes pieces at `tokensPerSecond` (0: as fast as the client reads), waiting for 'drain'
 * whenever the socket buffer is full, so a slow client never makes the gateway buffer.
 */
function pump(ex: Exchange, parts: string[], tokensPerSecond: number, render: (piece: string) => string, done: () => void): void {
  const interval = tokensPerSecond > 0 ? 1000 / tokensPerSecond : 0;
  let i = 0;
  let timer: NodeJS.Timeout | null = null;
  const step = (): void => {
    timer = null;
    if (ex.aborted) return;
    while (i < parts.length) {
      const piece = parts[i++]!;
      ex.noteOutput(piece.length);
      const flowing = ex.write(render(piece));
      if (interval > 0 && i < parts.length) {
        if (flowing) timer = setTimeout(step, interval);
        else ex.whenDrained(() => { timer = setTimeout(step, interval); });
        return;
      }
      if (!flowing) {
        ex.whenDrained(step);
        return;
      }
    }
    done();
  };
  ex.onAbort(() => {
    if (timer !== null) clearTimeout(timer);
  });
  step();
}
