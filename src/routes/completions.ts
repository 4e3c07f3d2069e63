import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ModelEntry } from '../directory.js';
import { ERRORS, type ErrorCode, type ErrorDetails, type ErrorSpec } from '../errors.js';
import type { Gateway } from '../gateway.js';
import { readBody, type BodyResult } from '../http/body.js';
import { newEntryId } from '../ledger/entry-id.js';
import type { RequestContext } from '../http/context.js';
import { baseHeaders, sendError, sendErrorSpec } from '../http/reply.js';
import type { Ticket } from '../limiter/types.js';
import { costMicro, type Usage } from '../money.js';
import { supports, thinkingLimits } from '../providers/protocols.js';
import { inputChars, tokensOf } from '../providers/text.js';
import type { Endpoint, Exchange } from '../providers/types.js';
import type { Router } from '../router.js';
import { checkCall, type CallRequest } from './validate.js';

export function registerCompletionRoutes(router: Router<Gateway>): void {
  router.add('/v1/chat/completions', { auth: true, methods: { POST: modelCall('chat') } });
  router.add('/v1/messages', { auth: true, anthropic: true, methods: { POST: modelCall('messages') } });
  router.add('/v1/embeddings', { auth: true, methods: { POST: modelCall('embeddings') } });
}

/** POST handler of a model call: body, model, admission (contract order), then the provider. */
function modelCall(endpoint: Endpoint) {
  return (gw: Gateway, ctx: RequestContext, req: IncomingMessage, res: ServerResponse): void => {
    readBody(req, gw.config.server.maxBodyBytes, (result) => {
      try {
        afterBody(gw, ctx, req, res, endpoint, result);
      } catch (err) {
        gw.fault(ctx, res, err);
      }
    });
  };
}

function afterBody(
  gw: Gateway, ctx: RequestContext, req: IncomingMessage, res: ServerResponse, endpoint: Endpoint, result: BodyResult,
): void {
  if (!result.ok) {
    if (result.reason === 'aborted') {
      ctx.status = 499; // client closed the request; nothing to answer
      return gw.done(ctx);
    }
    ctx.closeConnection = true; // the rest of the body is not read
    return sendError(ctx, res, 'payload_too_large', gw.done, {
      message: `The request body is larger than ${gw.config.server.maxBodyBytes} bytes.`,
    });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(result.body.toString('utf8'));
  } catch {
    return sendError(ctx, res, 'invalid_json', gw.done);
  }
  const checked = checkCall(endpoint, parsed);
  if (!checked.ok) return sendError(ctx, res, 'invalid_request', gw.done, { message: checked.message, fields: { param: checked.param || null } });
  const call = checked.call;
  const key = ctx.key!;
  const model = gw.directory.resolveModel(key, call.model);
  if (model === undefined) {
    return sendError(ctx, res, 'model_not_found', gw.done, {
      message: `The model "${call.model}" does not exist or this key may not use it.`,
    });
  }
  if (!supports(model.provider.protocol, endpoint)) {
    return sendError(ctx, res, 'invalid_request', gw.done, {
      message: `The model "${call.model}" is served over the ${model.provider.protocol} protocol, which has no ${ENDPOINT_PATHS[endpoint]}; use ${PROTOCOL_ENDPOINT[model.provider.protocol]}.`,
      fields: { param: 'model' },
    });
  }
  const chars = inputChars(call.body);
  let maxOutput = call.maxTokens ?? model.maxOutputTokens;
  // Reserve for what the provider may really produce: thinking can raise max_tokens.
  if (model.thinking && model.provider.protocol === 'anthropic') maxOutput = thinkingLimits(maxOutput).maxTokens;
  const estimate = model.billable
    ? costMicro(model.price, {
      inputTokens: tokensOf(chars), outputTokens: endpoint === 'embeddings' ? 0 : maxOutput, cacheReadTokens: 0, cacheWriteTokens: 0,
    })
    : null;
  gw.admit(ctx, res, gw.limiter.admit(key.account, key, ctx.idempotencyKey ?? null, estimate), (decision) => {
    const exchange = new LiveExchange(gw, ctx, req, res, endpoint, call, model, chars, maxOutput, decision);
    const provider = gw.providers.get(model.provider.id)!;
    try {
      provider.handle(exchange);
    } catch (err) {
      exchange.crash(err);
    }
  });
}

const ENDPOINT_PATHS: Record<Endpoint, string> = {
  chat: '/v1/chat/completions', messages: '/v1/messages', embeddings: '/v1/embeddings',
};
const PROTOCOL_ENDPOINT: Record<string, string> = { openai: '/v1/chat/completions', anthropic: '/v1/messages' };

const NO_USAGE: Usage = { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };

/**
 * One admitted call in progress. Owns the ticket: the charge is settled once (real usage
 * before the final bytes; an estimate if the answer never completes) and the slot and
 * idempotency key are released once, when the response closes for any reason.
 */
class LiveExchange implements Exchange {
  readonly body: Record<string, unknown>;
  readonly stream: boolean;
  readonly requestId: string;
  aborted = false;
  private settled = false;
  private outputChars = 0;
  private stops: Array<() => void> = [];

  constructor(
    private readonly gw: Gateway,
    private readonly ctx: RequestContext,
    private readonly req: IncomingMessage,
    readonly res: ServerResponse,
    readonly endpoint: Endpoint,
    call: CallRequest,
    readonly model: ModelEntry,
    readonly inputChars: number,
    readonly maxOutputTokens: number,
    private readonly ticket: Ticket,
  ) {
    this.body = call.body;
    this.stream = call.stream;
    this.requestId = ctx.id;
    gw.inFlight++;
    // With a remote limiter the client may have gone while admission was awaited: then
    // 'close' has already fired, so settle and release now rather than wait for it.
    if (res.closed) queueMicrotask(this.onClose);
    else res.on('close', this.onClose); // emitted once
  }

  onAbort(stop: () => void): void {
    this.stops.push(stop);
  }

  head(status: number, contentType: string, extra: string[] = []): void {
    const headers = baseHeaders(this.ctx, contentType);
    for (const value of extra) headers.push(value);
    this.ctx.status = status;
    this.res.writeHead(status, headers);
  }

  noteOutput(chars: number): void {
    this.outputChars += chars;
  }

  observeUpstream(seconds: number): void {
    this.gw.metrics.upstream(this.model.provider.id, seconds);
  }

  upstreamFailed(kind: string): void {
    this.gw.metrics.upstreamError(this.model.provider.id, kind);
  }

  header(name: string): string | undefined {
    const value = this.req.headers[name];
    return Array.isArray(value) ? value[0] : value;
  }

  settle(usage: Usage | null, then: () => void): void {
    if (this.settled) return then();
    const durable = usage === null ? this.charge(this.estimate(), true) : this.charge(usage, false);
    if (!(durable instanceof Promise)) return then();
    // The final bytes leave only once the charge is on disk (group commit).
    durable.then(() => {
      if (!this.aborted) then();
    }, () => this.res.destroy());
  }

  fail(code: ErrorCode, details: ErrorDetails = {}): void {
    this.failSpec(code, ERRORS[code], details);
  }

  failWith(code: string, spec: ErrorSpec, message: string): void {
    this.failSpec(code, spec, { message });
  }

  private failSpec(code: string, spec: ErrorSpec, details: ErrorDetails): void {
    if (this.res.headersSent) return this.cut(null, details.message ?? code);
    if (!this.settled) this.charge(NO_USAGE, false); // no answer reached the client: nothing to bill
    sendErrorSpec(this.ctx, this.res, code, spec, this.gw.done, details);
  }

  cut(usage: Usage | null, why: string): void {
    if (!this.settled) this.charge(usage ?? this.estimate(), usage === null);
    this.gw.logger.warn('stream cut', { request_id: this.ctx.id, reason: why });
    this.res.destroy();
  }

  /** A provider bug: answer 500 if we still can, never leak the ticket. */
  crash(err: unknown): void {
    if (!this.settled) this.charge(this.res.headersSent ? this.estimate() : NO_USAGE, this.res.headersSent);
    this.gw.fault(this.ctx, this.res, err);
  }

  private estimate(): Usage {
    return { inputTokens: tokensOf(this.inputChars), outputTokens: tokensOf(this.outputChars), cacheReadTokens: 0, cacheWriteTokens: 0 };
  }

  /** Settles the ticket and records the call; a promise resolves when the record is durable. */
  private charge(usage: Usage, estimated: boolean): void | Promise<void> {
    this.settled = true;
    const cost = costMicro(this.model.price, usage);
    const gw = this.gw;
    const settlement = gw.limiter.settle(this.ticket, cost);
    if (usage === NO_USAGE) {
      if (settlement instanceof Promise) settlement.catch(() => {}); // nothing to record; the lease expires
      return;
    }
    gw.metrics.charge(this.model.id, usage.inputTokens + usage.cacheReadTokens + usage.cacheWriteTokens, usage.outputTokens, cost);
    // Every call is recorded: billable ones as charges (billing history), free ones as usage only.
    const write = (balanceAfterMicro: number | null) => gw.record({
      id: newEntryId(), type: this.model.billable ? 'charge' : 'usage', accountId: this.ticket.accountId, keyId: this.ctx.key!.id,
      amountMicro: -cost, balanceAfterMicro, createdAt: gw.clock.now(), requestId: this.ctx.id, model: this.model.id,
      inputTokens: usage.inputTokens + usage.cacheReadTokens + usage.cacheWriteTokens, outputTokens: usage.outputTokens,
      estimated, note: null,
    });
    if (!(settlement instanceof Promise)) return write(settlement.balanceAfterMicro);
    // If the shared store cannot take the charge, the history still must: record it anyway.
    return settlement.then((s) => write(s.balanceAfterMicro), (err: unknown) => {
      gw.logger.error('settlement failed; recorded in the ledger only', { request_id: this.ctx.id, error: String(err) });
      return write(null);
    });
  }

  /** The response is over: finished, or the client went away first. */
  private readonly onClose = (): void => {
    if (!this.res.writableFinished) {
      this.aborted = true;
      for (const stop of this.stops) stop();
      if (!this.res.headersSent) this.ctx.status = 499;
    }
    if (!this.settled) this.charge(this.estimate(), true);
    this.gw.limiter.release(this.ticket);
    this.gw.inFlight--;
    this.gw.done(this.ctx);
  };
}
