import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Seen {
  path: string;
  headers: IncomingMessage['headers'];
  body: Record<string, unknown>;
  /** The body as it arrived. */
  text: string;
}

export type Behaviour = (req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>) => void;

/**
 * A provider on loopback for tests: records every request (hit counter included) and answers
 * with queued behaviours, then with the default one.
 */
export class FakeUpstream {
  readonly seen: Seen[] = [];
  readonly queue: Behaviour[] = [];
  fallback: Behaviour = (_req, res) => json(res, 500, { error: { message: 'no behaviour queued' } });
  private server: Server | null = null;
  /** Requests whose client went away before the answer was complete. */
  closedEarly = 0;

  get hits(): number {
    return this.seen.length;
  }

  async start(): Promise<string> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        const body = text === '' ? {} : (JSON.parse(text) as Record<string, unknown>);
        this.seen.push({ path: req.url ?? '', headers: req.headers, body, text });
        res.on('close', () => { if (!res.writableFinished) this.closedEarly++; });
        (this.queue.shift() ?? this.fallback)(req, res, body);
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}`;
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      this.server!.closeAllConnections();
      this.server!.close(() => resolve());
    });
  }
}

export function json(res: ServerResponse, status: number, value: unknown, headers: Record<string, string> = {}): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers });
  res.end(body);
}

export function openaiCompletion(text: string, usage = { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 }) {
  return {
    id: 'chatcmpl-up', object: 'chat.completion', created: 1, model: 'up-model',
    choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }], usage,
  };
}

/** An OpenAI stream; `usage` is sent (as its own chunk) only when the request asked for it. */
export function openaiStream(pieces: string[], usage: Record<string, unknown>, opts: { delayMs?: number; cutAfter?: number } = {}): Behaviour {
  return (_req, res, body) => {
    const wantUsage = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;
    res.writeHead(200, { 'content-type': 'text/event-stream', 'x-request-id': 'up-req-1' });
    const events = pieces.map((p) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: p }, finish_reason: null }], usage: null })}\n\n`);
    events.push(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: null })}\n\n`);
    if (wantUsage) events.push(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [], usage })}\n\n`);
    events.push('data: [DONE]\n\n');
    sendEvents(res, events, opts);
  };
}

export function anthropicMessage(text: string, usage: Record<string, number> = { input_tokens: 10, output_tokens: 20 }) {
  return { id: 'msg_up', type: 'message', role: 'assistant', model: 'up-model', content: [{ type: 'text', text }],
    stop_reason: 'end_turn', stop_sequence: null, usage };
}

export function anthropicStream(pieces: string[], usage: { input: number; output: number; cacheRead?: number; cacheWrite?: number },
  opts: { delayMs?: number; cutAfter?: number } = {}): Behaviour {
  return (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'up-req-2' });
    const ev = (type: string, data: unknown) => `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
    const events = [
      ev('message_start', { type: 'message_start', message: { id: 'msg_up', type: 'message', role: 'assistant', content: [], model: 'up',
        usage: { input_tokens: usage.input, output_tokens: 1, cache_read_input_tokens: usage.cacheRead ?? 0,
          cache_creation_input_tokens: usage.cacheWrite ?? 0 } } }),
      ev('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }),
      ...pieces.map((p) => ev('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: p } })),
      ev('content_block_stop', { type: 'content_block_stop', index: 0 }),
      ev('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: usage.output } }),
      ev('message_stop', { type: 'message_stop' }),
    ];
    sendEvents(res, events, opts);
  };
}

/** An Anthropic stream of text and tool_use blocks (inputs streamed as input_json_delta halves). */
export function anthropicBlocks(blocks: Array<{ text: string } | { tool: { id: string; name: string; input: Record<string, unknown> } }>,
  usage: { input: number; output: number; cacheRead?: number; cacheWrite?: number }): Behaviour {
  return (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const events = [ev('message_start', { message: { id: 'msg_up', type: 'message', role: 'assistant', content: [], model: 'up', stop_reason: null,
      usage: { input_tokens: usage.input, output_tokens: 1, cache_read_input_tokens: usage.cacheRead ?? 0, cache_creation_input_tokens: usage.cacheWrite ?? 0 } } })];
    blocks.forEach((block, index) => {
      if ('text' in block) {
        events.push(ev('content_block_start', { index, content_block: { type: 'text', text: '' } }),
          ...halves(block.text).map((text) => ev('content_block_delta', { index, delta: { type: 'text_delta', text } })));
      } else {
        events.push(ev('content_block_start', { index, content_block: { type: 'tool_use', id: block.tool.id, name: block.tool.name, input: {} } }),
          ...halves(JSON.stringify(block.tool.input)).map((partial_json) => ev('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json } })));
      }
      events.push(ev('content_block_stop', { index }));
    });
    const stop = blocks.some((b) => 'tool' in b) ? 'tool_use' : 'end_turn';
    events.push(ev('message_delta', { delta: { stop_reason: stop, stop_sequence: null }, usage: { output_tokens: usage.output } }), ev('message_stop', {}));
    sendEvents(res, events, {});
  };
}

function sendEvents(res: ServerResponse, events: string[], opts: { delayMs?: number; cutAfter?: number }): void {
  let i = 0;
  const next = () => {
    if (res.destroyed) return;
    if (opts.cutAfter !== undefined && i >= opts.cutAfter) {
      res.socket?.destroy();
      return;
    }
    if (i >= events.length) {
      res.end();
      return;
    }
    res.write(events[i++]);
    if (opts.delayMs) setTimeout(next, opts.delayMs);
    else next();
  };
  next();
}

/** An output item of a Responses answer: assistant text, or a function call. */
export type ResponsesItem = { text: string } | { call: { call_id: string; name: string; arguments: string } };

/** A complete Responses object (the non-streamed answer, and the one in response.completed). */
export function responseObject(items: ResponsesItem[], usage: unknown) {
  return {
    id: 'resp_up', object: 'response', created_at: 1, status: 'completed', error: null, incomplete_details: null, instructions: null,
    max_output_tokens: null, model: 'gpt-upstream', output: items.map(outputItem), parallel_tool_calls: true, previous_response_id: null,
    reasoning: { effort: null, summary: null }, store: false, temperature: 1, text: { format: { type: 'text' } }, tool_choice: 'auto',
    tools: [], top_p: 1, truncation: 'disabled', usage, user: null, metadata: {},
  };
}

function outputItem(item: ResponsesItem, i: number) {
  if ('call' in item) return { id: `fc_${i}`, type: 'function_call', status: 'completed', ...item.call };
  return { id: `msg_${i}`, type: 'message', status: 'completed', role: 'assistant',
    content: [{ type: 'output_text', text: item.text, annotations: [] }] };
}

/** A Responses stream in the provider's event sequence, each event with `type` and `sequence_number`. */
export function responsesStream(items: ResponsesItem[], usage: unknown): Behaviour {
  return (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    let n = 0;
    const ev = (type: string, fields: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: n++, ...fields })}\n\n`;
    const events = [ev('response.created', { response: { ...responseObject([], null), status: 'in_progress' } })];
    items.forEach((item, output_index) => {
      const done = outputItem(item, output_index);
      const item_id = done.id;
      if ('call' in item) {
        events.push(
          ev('response.output_item.added', { output_index, item: { ...done, status: 'in_progress', arguments: '' } }),
          ...halves(item.call.arguments).map((delta) => ev('response.function_call_arguments.delta', { item_id, output_index, delta })),
          ev('response.function_call_arguments.done', { item_id, output_index, arguments: item.call.arguments }),
        );
      } else {
        const part = { type: 'output_text', text: '', annotations: [] };
        events.push(
          ev('response.output_item.added', { output_index, item: { ...done, status: 'in_progress', content: [] } }),
          ev('response.content_part.added', { item_id, output_index, content_index: 0, part }),
          ...halves(item.text).map((delta) => ev('response.output_text.delta', { item_id, output_index, content_index: 0, delta })),
          ev('response.output_text.done', { item_id, output_index, content_index: 0, text: item.text }),
          ev('response.content_part.done', { item_id, output_index, content_index: 0, part: { ...part, text: item.text } }),
        );
      }
      events.push(ev('response.output_item.done', { output_index, item: done }));
    });
    events.push(ev('response.completed', { response: responseObject(items, usage) }));
    sendEvents(res, events, {});
  };
}

const halves = (s: string) => [s.slice(0, s.length >> 1), s.slice(s.length >> 1)];

/** A recorded stream (test/fixtures/streams) sent as it is, in `parts` arbitrary byte chunks. */
export function recordedStream(bytes: Buffer, parts = 7): Behaviour {
  return (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const size = Math.ceil(bytes.length / parts);
    const chunks: Buffer[] = [];
    for (let at = 0; at < bytes.length; at += size) chunks.push(bytes.subarray(at, at + size));
    let i = 0;
    const next = () => {
      if (res.destroyed) return;
      if (i >= chunks.length) return void res.end();
      res.write(chunks[i++]);
      setImmediate(next);
    };
    next();
  };
}
