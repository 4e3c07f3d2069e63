import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ModelEntry } from '../directory.js';
import { ERRORS, type ErrorCode, type ErrorDetails, type ErrorSpec } from '../errors.js';
import type { Gateway } from '../gateway.js';
import { readBody, type BodyResult } from '../http/body.js';
import { newEntryId } from '../ledger/entry-id.js';
import type { RequestContext } from '../http/context.js';
import { baseHeaders, sendError, sendErrorSpec } from '../http/reply.js';
import type { Ticket } from '../limiter/types.js';
import { costMicro, MAX_TOKENS, type Usage } from '../money.js';
import { estimateInputTokens, MAX_DEPTH } from '../providers/estimate.js';
import { supports, thinkingLimits } from '../providers/protocols.js';
import { tokensOf } from '../providers/text.js';
import { Watch, type Watchlist } from '../providers/watchlist.js';
import type { Endpoint, Exchange } from '../providers/types.js';
import type { Router } from '../router.js';
import { checkCall, checkOutputLimits, type CallRequest } from './validate.js';

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
  const outputProblem = checkOutputLimits(call, model.outputTokenLimit);
  if (outputProblem !== null) {
    return sendError(ctx, res, 'invalid_request', gw.done, { message: outputProblem.message, fields: { param: outputProblem.param } });
  }
  const inputTokens = estimateInputTokens(call.body);
  if (inputTokens === null) {
    return sendError(ctx, res, 'invalid_request', gw.done, {
      message: `The request body nests deeper than ${MAX_DEPTH} levels.`, fields: { param: null },
    });
  }
  // A call whose charge could not be recorded must not reach the provider (which would bill it).
  if (!gw.ledger.ready()) return sendError(ctx, res, 'ledger_unavailable', gw.done, { retryAfterS: 1 });
  let maxOutput = call.maxTokens ?? model.maxOutputTokens;
  // Reserve for what the provider may really produce: thinking can raise max_tokens.
  if (model.thinking && model.provider.protocol === 'anthropic') maxOutput = thinkingLimits(maxOutput).maxTokens;
  // Every answer of `n` may use the whole output budget.
  const reservedOutput = endpoint === 'embeddings' ? 0 : Math.min(MAX_TOKENS, maxOutput * call.choices);
  const estimate = model.billable
    ? costMicro(model.price, { inputTokens, outputTokens: reservedOutput, cacheReadTokens: 0, cacheWriteTokens: 0 })
    : null;
  gw.admit(ctx, res, gw.limiter.admit(key.account, key, ctx.idempotencyKey ?? null, estimate), (decision) => {
    const exchange = new LiveExchange(gw, ctx, req, res, endpoint, call, model, inputTokens, maxOutput, decision);
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
const ignore = (): void => {};

/**
 * One admitted call in progress. Owns the ticket: the charge is settled once (the provider's
 * final usage before the final bytes, or the abnormal-end charge when the call ends without
 * it) and the slot and idempotency key are released once, when the response closes for any
 * reason.
 */
class LiveExchange implements Exchange {
  readonly body: Record<string, unknown>;
  readonly stream: boolean;
  readonly requestId: string;
  aborted = false;
  private settled = false;
  private outputChars = 0;
  /** Usage the provider reported before its final count, if any. */
  private reported: Usage | null = null;
  /** Whether the provider has the whole request (and did not refuse it). */
  private delivered = false;
  private stops: Array<() => void> = [];
  /** Armed while the client is not reading what it was sent, on the list it was first armed on. */
  private clientWatch: Watch | null = null;
  private clientList: Watchlist | null = null;

  constructor(
    private readonly gw: Gateway,
    private readonly ctx: RequestContext,
    private readonly req: IncomingMessage,
    readonly res: ServerResponse,
    readonly endpoint: Endpoint,
    call: CallRequest,
    readonly model: ModelEntry,
    readonly inputTokens: number,
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

  write(chunk: string): boolean {
    return this.res.write(chunk);
  }

  whenDrained(resume: () => void): void {
    this.waitForClient();
    this.res.once('drain', () => {
      this.clientRead();
      if (!this.aborted) resume();
    });
  }

  end(chunk?: string | Buffer): void {
    this.res.end(chunk);
    // The last bytes may sit in the socket's buffer if the client stopped reading: the slot is
    // held until they are read, so the same idle bound applies.
    if (!this.res.writableFinished && (this.res.socket?.writableLength ?? 0) > 0) {
      this.waitForClient();
      this.res.once('finish', () => this.clientRead());
    }
  }

  noteOutput(chars: number): void {
    this.outputChars += chars;
  }

  noteUsage(usage: Usage): void {
    this.reported = usage;
  }

  noteDelivered(delivered: boolean): void {
    this.delivered = delivered;
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
    const durable = usage === null ? this.charge(this.abnormalUsage(), true) : this.charge(usage, false);
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
    if (this.res.headersSent) return this.cut(details.message ?? code);
    // The provider had the request and did not refuse it (it timed out, or its answer could
    // not be relayed): it bills the call, so the client is charged too. A refusal is free.
    if (!this.settled) this.chargeAside(this.delivered ? this.abnormalUsage() : NO_USAGE, this.delivered);
    sendErrorSpec(this.ctx, this.res, code, spec, this.gw.done, details);
  }

  cut(why: string, finalUsage: Usage | null = null): void {
    if (!this.settled) this.chargeAside(finalUsage ?? this.abnormalUsage(), finalUsage === null);
    this.gw.logger.warn('stream cut', { request_id: this.ctx.id, reason: why });
    this.res.destroy();
  }

  /** A provider bug: answer 500 if we still can, never leak the ticket. */
  crash(err: unknown): void {
    if (!this.settled) {
      const billed = this.res.headersSent || this.delivered;
      this.chargeAside(billed ? this.abnormalUsage() : NO_USAGE, billed);
    }
    this.gw.fault(this.ctx, this.res, err);
  }

  /**
   * What a call that ended without the provider's final usage is charged (CONTRACT section 7):
   * the larger of the input the provider reported (cache tokens included, at their prices) and
   * the gateway's input estimate, plus the larger of the output it reported and the output
   * relayed so far (characters / 4). So never less than either.
   */
  private abnormalUsage(): Usage {
    const relayed = tokensOf(this.outputChars);
    const reported = this.reported;
    if (reported === null) return { inputTokens: this.inputTokens, outputTokens: relayed, cacheReadTokens: 0, cacheWriteTokens: 0 };
    const price = this.model.price;
    const reportedInput = { ...reported, outputTokens: 0 };
    const estimatedInput = { inputTokens: this.inputTokens, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };
    const input = costMicro(price, reportedInput) >= costMicro(price, estimatedInput) ? reportedInput : estimatedInput;
    input.outputTokens = Math.max(reported.outputTokens, relayed);
    return input;
  }

  /**
   * The same when no answer waits for the record (the call failed, was cut, or its client left):
   * a record that fails is logged by the ledger, and its promise is handled here.
   */
  private chargeAside(usage: Usage, estimated: boolean): void {
    const durable = this.charge(usage, estimated);
    if (durable instanceof Promise) durable.catch(ignore);
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
      estimated, note: null, idempotencyKey: null,
    });
    if (!(settlement instanceof Promise)) return write(settlement.balanceAfterMicro);
    // If the shared store cannot take the charge, the history still must: record it anyway.
    return settlement.then((s) => write(s.balanceAfterMicro), (err: unknown) => {
      gw.logger.error('settlement failed; recorded in the ledger only', { request_id: this.ctx.id, error: String(err) });
      return write(null);
    });
  }

  /** The client stopped reading: from now on the call waits for it, at most clientIdleTimeoutMs. */
  private waitForClient(): void {
    // The list of the config this call started under: a reload may swap the gateway's list.
    const list = (this.clientList ??= this.gw.clientIdle);
    this.clientWatch ??= new Watch(() => {
      if (this.aborted || this.res.writableFinished) return;
      this.cut(`the client read nothing for ${list.ms} ms`);
    });
    list.arm(this.clientWatch);
  }

  private clientRead(): void {
    if (this.clientWatch !== null) this.clientList!.remove(this.clientWatch);
  }

  /** The response is over: finished, or the client went away first. */
  private readonly onClose = (): void => {
    this.clientRead();
    if (!this.res.writableFinished) {
      this.aborted = true;
      for (const stop of this.stops) stop();
      if (!this.res.headersSent) this.ctx.status = 499;
    }
    // A client gone before the provider had the request costs nothing; after, it is charged.
    if (!this.settled) this.chargeAside(this.delivered ? this.abnormalUsage() : NO_USAGE, this.delivered);
    this.gw.limiter.release(this.ticket);
    this.gw.inFlight--;
    this.gw.done(this.ctx);
  };
}
