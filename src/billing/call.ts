import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Clock } from '../clock.js';
import type { RoutingConfig } from '../config/types.js';
import { MAX_OUTPUT_TOKEN_LIMIT } from '../config/validate.js';
import type { ModelEntry } from '../directory.js';
import { ERRORS, type ErrorCode, type ErrorDetails, type ErrorSpec } from '../errors.js';
import type { RequestContext } from '../http/context.js';
import { baseHeaders, sendErrorSpec } from '../http/reply.js';
import { noLongerWaiting, whenConnectionCloses } from '../http/pipelined.js';
import { bytesTaken, watchedAnswers } from '../http/slow-readers.js';
import type { LedgerEntry } from '../ledger/types.js';
import type { Limiter, Rejection, Ticket } from '../limiter/types.js';
import type { Logger } from '../log.js';
import type { Metrics } from '../metrics.js';
import { costMicro, MAX_TOKENS, type Price, type Usage } from '../money.js';
import { isObj, tokensOf } from '../protocols/common.js';
import type { Endpoint, Exchange } from '../providers/types.js';
import { Watch, type Watchlist } from '../providers/watchlist.js';
import type { AudioAsked, CallRequest } from '../protocols/types.js';
import { callEntry } from './entries.js';
import { audioInputEstimate, reservation, searchesCeiling } from './estimate.js';

/**
 * What a billed call needs of the gateway, and no more: billing knows nothing of routing,
 * admin or the config beyond these.
 */
export interface CallHost {
  readonly limiter: Limiter;
  readonly metrics: Metrics;
  readonly logger: Logger;
  readonly clock: Clock;
  readonly config: { readonly routing: RoutingConfig };
  /** Calls waiting for a client that does not read (server.clientIdleTimeoutMs). */
  readonly clientIdle: Watchlist;
  /** Calls admitted and not yet over (the drain waits for 0). */
  inFlight: number;
  /** Charges waiting for a remote limiter's settlement before they are recorded (the drain waits for 0 too). */
  settling: number;
  /** True once the drain began. */
  readonly draining: boolean;
  /** Records an entry; a promise resolves once it is durable. */
  record(entry: LedgerEntry): void | Promise<void>;
  /** Writes the access log line of a request, once. */
  done(ctx: RequestContext): void;
  /** Answers a fault (a bug: 500, never a stack trace). */
  fault(ctx: RequestContext, res: ServerResponse, err: unknown): void;
  /** Answers a limiter denial with its contract error. */
  reject(ctx: RequestContext, res: ServerResponse, rejection: Rejection): void;
}

/** The most input a provider's count before a call is believed: the largest context window there is (Llama 4 Scout's 10M tokens). */
const MAX_COUNTED_INPUT = 10_000_000;
/**
 * The most input and cache tokens a call's final usage is believed: ten rounds of the largest
 * context window (Anthropic's usage sums the rounds of a call's server tools, each reading the
 * context again: review).
 */
const MAX_BILLED_INPUT = 10 * MAX_COUNTED_INPUT;

const NO_USAGE: Usage = { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };
const ignore = (): void => {};

/**
 * One admitted call in progress. Owns the ticket: the charge is settled once (the provider's
 * final usage before the final bytes, or the abnormal-end charge when the call ends without
 * it) and the slot and idempotency key are released once, when the response closes for any
 * reason.
 */
export class BilledCall implements Exchange {
  readonly body: Record<string, unknown>;
  readonly stream: boolean;
  readonly requestId: string;
  readonly tenant: string;
  readonly maxAttempts: number;
  aborted = false;
  private settled = false;
  private outputChars = 0;
  /** Answers asked for (chat's `n`): each may hold up to the model's output limit. */
  private readonly choices: number;
  /** Where the request asked for audio (chat), or null: an estimate then prices it as audio. */
  private readonly audio: AudioAsked | null;
  /** Searches the request asks to be billed whatever its answer says (CallRequest.searchesPerCall). */
  private readonly searchesPerCall: number;
  /** Usage the provider reported before its final count, if any. */
  private reported: Usage | null = null;
  /** When the last attempt went to the provider (performance.now(); 0: none went). */
  private sentAt = 0;
  /** Input the provider bills beyond what it reported so far (Exchange.noteUnreportedInput). */
  private unreportedInput = 0;
  /** The price the call was admitted at (its reservation's): `model` is the serving deployment's. */
  private readonly admittedPrice: Price;
  /** The provider's count of the input, taken before the call (0: none). */
  private countedInput = 0;
  /** Whether the provider has the whole request (and did not refuse it). */
  private delivered = false;
  private stops: Array<() => void> = [];
  /** Closed: everything the call held is given back. */
  private closed = false;
  /** The connection a pipelined answer waited on (null: it had the socket from the start). */
  private queuedOn: Socket | null = null;
  /** Armed while the client is not reading what it was sent, on the list it was first armed on. */
  private clientWatch: Watch | null = null;
  private clientList: Watchlist | null = null;
  /** Bytes of the client's socket the kernel had taken when the watch was last armed. */
  private taken = 0;
  /**
   * The answer's head, held until its first bytes (`head`): Node sends a head with the first
   * write anyway, and until then the call can still answer an error or move to another
   * deployment (found in review: a stream that broke before its first event reached the client
   * as a reset, with no status, and was not failed over).
   */
  private headStatus = 0;
  private headHeaders: string[] | null = null;

  constructor(
    private readonly gw: CallHost,
    private readonly ctx: RequestContext,
    private readonly req: IncomingMessage,
    readonly res: ServerResponse,
    readonly endpoint: Endpoint,
    private readonly call: CallRequest,
    readonly text: string,
    /** The model as the deployment serving the call has it (a routed call switches it per attempt: `serve`). */
    public model: ModelEntry,
    readonly inputTokens: number,
    readonly maxOutputTokens: number,
    private readonly ticket: Ticket,
    /** The output a billable call reserved for (with its input, at its model's price: `reservation`); null for a free call. */
    private readonly reservedOutput: number | null = null,
  ) {
    this.body = call.body;
    this.stream = call.stream;
    this.choices = call.choices;
    this.audio = call.audio ?? null;
    this.searchesPerCall = call.searchesPerCall ?? 0;
    this.requestId = ctx.id;
    this.tenant = ctx.key?.account.id ?? '';
    this.admittedPrice = model.price;
    this.maxAttempts = gw.config.routing.maxAttempts;
    gw.inFlight++;
    // With a remote limiter the client may have gone while admission was awaited: then
    // 'close' has already fired, so settle and release now rather than wait for it.
    // `aborted` is set at once, so the caller sends nothing upstream for a client already gone.
    // A pipelined answer waits behind the ones before it with no socket of its own, and Node
    // never closes it if the connection dies meanwhile (found in review: its slot and key
    // were held for good): the connection's own close releases it then.
    const queued = res.socket === null;
    if (res.closed || (queued && req.socket.destroyed)) {
      this.aborted = true;
      queueMicrotask(this.onClose);
    } else {
      res.on('close', this.onClose); // emitted once
      if (queued) {
        this.queuedOn = req.socket;
        whenConnectionCloses(req.socket, this.onClose);
      }
    }
  }

  onAbort(stop: () => void): void {
    this.stops.push(stop);
  }

  /** The call is now on this deployment (a routed call's attempt). */
  serve(model: ModelEntry): void {
    this.model = model;
    // What a deployment that refused the call counted counts only there (found in review: one
    // that counted 9,000,000 tokens and then failed set the charge of the call another served).
    // One that had the whole request may bill it: its count stays (review of that fix).
    if (!this.delivered) {
      this.countedInput = 0;
      this.unreportedInput = 0;
    }
  }

  head(status: number, contentType: string, extra: string[] = []): void {
    const headers = baseHeaders(this.ctx, contentType);
    headers.push('x-gateway-deployment', this.model.provider.id);
    for (const value of extra) headers.push(value);
    this.ctx.status = status;
    this.headStatus = status;
    this.headHeaders = headers;
  }

  private writeHead(): void {
    this.res.writeHead(this.headStatus, this.headHeaders!);
    this.headHeaders = null;
  }

  clientEvent(event: string): string {
    return event;
  }

  write(chunk: string, raw?: Buffer): boolean {
    if (this.headHeaders !== null) this.writeHead();
    return this.res.write(raw ?? chunk);
  }

  whenDrained(resume: () => void): void {
    this.waitForClient();
    this.res.once('drain', () => {
      this.clientRead();
      if (!this.aborted) resume();
    });
  }

  end(chunk?: string | Buffer): void {
    // An answer begun before the drain was sent keep-alive: its connection closes once the
    // answer has left (so the drain ends with its last call), never before.
    const socket = this.gw.draining ? this.res.socket : null;
    if (socket !== null) this.res.once('finish', () => socket.destroySoon());
    if (this.headHeaders !== null) this.writeHead();
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
    this.reported = this.reported === null ? usage : atLeast(usage, this.reported);
  }

  /**
   * A count above MAX_COUNTED_INPUT (no model reads that much) is taken down to it, and logged:
   * a broken provider's 999,999,999 made a client leaving early $2,000 of charge (found in review).
   * A count above the estimate raises the call's reservation to it, with the cap and balance
   * checked again (Limiter.raise), before `then` sends the call: a file's or a stored context's
   * input, which the estimate cannot see, counts against the cap while the call runs, and calls
   * sent together with such input no longer each pass a cap that the first of them reaches
   * (found in review: 50 calls holding a 100-page PDF each were admitted on 3,000 tokens apiece).
   */
  noteInputCount(tokens: number, then: () => void): void {
    if (tokens > MAX_COUNTED_INPUT) {
      this.gw.logger.warn('provider counted more input than any model reads', { request_id: this.ctx.id, model: this.model.id, input_tokens: tokens, ceiling: MAX_COUNTED_INPUT });
      tokens = MAX_COUNTED_INPUT;
    }
    const account = this.ctx.key?.account;
    if (this.reservedOutput === null || account === undefined || tokens <= this.inputTokens || this.settled) {
      if (tokens > this.countedInput) this.countedInput = tokens;
      return then();
    }
    let answer: Rejection | null | Promise<Rejection | null>;
    try {
      answer = this.gw.limiter.raise(this.ticket, account, reservation(this.call, this.admittedPrice, tokens, this.reservedOutput));
    } catch (err) {
      return this.crash(err);
    }
    if (!(answer instanceof Promise)) return this.raised(answer, tokens, then);
    answer.then((rejection) => this.raised(rejection, tokens, then), (err: unknown) => {
      if (!this.aborted) this.crash(err); // the limiter unreachable: 503, nothing sent
    }).catch((err: unknown) => this.crash(err));
  }

  /**
   * After a raise: the call goes on with its count, or is refused as an admission is, not sent
   * there. (The count is the deployment's that would have had it: a refused call keeps what it
   * had, and is charged only if an earlier deployment of a routed call had the request.)
   */
  private raised(rejection: Rejection | null, tokens: number, then: () => void): void {
    if (this.aborted) return; // the client left meanwhile: its close gave everything back
    if (rejection === null) {
      if (tokens > this.countedInput) this.countedInput = tokens;
      return this.guarded(then);
    }
    this.gw.metrics.raiseRefusal(rejection.reason);
    if (!this.settled) this.chargeAside(this.delivered ? this.abnormalUsage() : NO_USAGE, this.delivered);
    this.gw.reject(this.ctx, this.res, rejection);
  }

  noteUnreportedInput(tokens: number): void {
    this.unreportedInput = tokens;
  }

  noteSent(sent: boolean): void {
    this.sentAt = sent ? performance.now() : 0;
  }

  noteDelivered(delivered: boolean): void {
    this.delivered = delivered;
  }

  observeUpstream(seconds: number): void {
    this.gw.metrics.upstream(this.model.provider.id, seconds);
  }

  upstreamFailed(kind: string, _retryAfterMs?: number | null): void {
    this.gw.metrics.upstreamError(this.model.provider.id, kind);
  }

  header(name: string): string | undefined {
    const value = this.req.headers[name];
    return Array.isArray(value) ? value[0] : value;
  }

  settle(usage: Usage | null, then: () => void): void {
    if (this.settled) return this.guarded(then);
    // Input counts are cumulative: a final input below one reported earlier (a provider's bug,
    // or a hostile one: found in review) is not taken lower than that.
    const durable = usage === null ? this.charge(this.abnormalUsage(), true)
      : this.charge(this.reported === null ? usage : atLeast(usage, this.reported), false);
    if (!(durable instanceof Promise)) return this.guarded(then);
    // The final bytes leave only once the charge is on disk (group commit).
    durable.then(() => {
      if (!this.aborted) this.guarded(then);
    }, () => this.res.destroy());
  }

  /**
   * Usage past what any call can use, taken down to it, and logged: a broken provider reporting
   * 1e9 tokens was charged $8,000 for a call that reserved 16 (found in review), and 1e9 input
   * and cache tokens or searches made one call $7,000 or $10,000,000 (found in review).
   * - Output past the largest `outputTokenLimit` any model may have (10,000,000) per answer
   *   asked for. Not the model's own `outputTokenLimit`: a call that sets no limit is sent
   *   none, and a provider may rightly bill more than that policy on clients' limits.
   * - Input, cache reads and writes together past MAX_BILLED_INPUT.
   * - Searches past what the request's tools allow (searchesCeiling): the provider runs no more.
   */
  private withinLimit(usage: Usage): Usage {
    const ceiling = MAX_OUTPUT_TOKEN_LIMIT * this.choices;
    const input = usage.inputTokens + usage.cacheReadTokens + usage.cacheWriteTokens;
    const searches = usage.webSearches ?? 0;
    const searchCeiling = searches > 0 ? searchesCeiling(this.body) : 0;
    if (usage.outputTokens <= ceiling && input <= MAX_BILLED_INPUT && searches <= searchCeiling) return usage;
    this.gw.logger.warn('provider reported more usage than any call has', {
      request_id: this.ctx.id, model: this.model.id, output_tokens: usage.outputTokens, input_tokens: input, web_searches: searches,
      output_ceiling: ceiling, input_ceiling: MAX_BILLED_INPUT, search_ceiling: searchCeiling,
    });
    const outputTokens = Math.min(usage.outputTokens, ceiling);
    const inputTokens = Math.min(usage.inputTokens, MAX_BILLED_INPUT);
    const cacheReadTokens = Math.min(usage.cacheReadTokens, MAX_BILLED_INPUT - inputTokens);
    const cacheWriteTokens = Math.min(usage.cacheWriteTokens, MAX_BILLED_INPUT - inputTokens - cacheReadTokens);
    return {
      ...usage, inputTokens, outputTokens, cacheReadTokens, cacheWriteTokens,
      cacheWrite1hTokens: Math.min(usage.cacheWrite1hTokens ?? 0, cacheWriteTokens), webSearches: Math.min(searches, searchCeiling),
      audioInputTokens: Math.min(usage.audioInputTokens ?? 0, inputTokens), audioOutputTokens: Math.min(usage.audioOutputTokens ?? 0, outputTokens),
    };
  }

  /** Runs what writes the final bytes: a bug there fails this call (after a ledger's promise, it would end the process). */
  private guarded(then: () => void): void {
    try {
      then();
    } catch (err) {
      this.crash(err);
    }
  }

  fail(code: ErrorCode, details: ErrorDetails = {}): void {
    this.failSpec(code, ERRORS[code], details);
  }

  failWith(code: string, spec: ErrorSpec, message: string): void {
    this.failSpec(code, spec, { message });
  }

  private failSpec(code: string, spec: ErrorSpec, details: ErrorDetails): void {
    if (this.res.headersSent) return this.cut(details.message ?? code);
    this.headHeaders = null; // an answer's head held: the error's goes instead
    // The provider had the request and did not refuse it (it timed out, or its answer could
    // not be relayed): it bills the call, so the client is charged too. A refusal is free.
    if (!this.settled) this.chargeAside(this.delivered ? this.abnormalUsage() : NO_USAGE, this.delivered);
    sendErrorSpec(this.ctx, this.res, code, spec, this.gw.done, details);
  }

  cut(why: string, finalUsage: Usage | null = null): void {
    if (!this.settled) this.chargeAside(finalUsage ?? this.abnormalUsage(), finalUsage === null);
    if (!this.res.headersSent) {
      // Nothing reached the client yet (events it was not given: a translation's): an error
      // answer, not a dropped connection.
      this.headHeaders = null;
      return sendErrorSpec(this.ctx, this.res, 'upstream_error', ERRORS.upstream_error, this.gw.done, { message: `The provider's answer was cut off: ${why}.` });
    }
    this.gw.logger.warn('stream cut', { request_id: this.ctx.id, reason: why });
    this.res.destroy();
  }

  /** A provider bug: answer 500 if we still can, never leak the ticket. */
  crash(err: unknown): void {
    if (!this.settled) {
      const billed = this.res.headersSent || this.delivered;
      this.chargeAside(billed ? this.abnormalUsage() : NO_USAGE, billed);
    }
    this.headHeaders = null;
    this.gw.fault(this.ctx, this.res, err);
  }

  /**
   * What a call that ended without the provider's final usage is charged (CONTRACT section 7):
   * the larger of the input the provider reported (cache tokens included, at their prices) and
   * the gateway's input estimate, plus the larger of the output it reported and the output
   * relayed so far (characters / 4). So never less than either. The estimate's input is at
   * least the provider's own count taken before the call, when there is one (a stored context);
   * input the provider has not reported yet (server tool results) adds to both inputs; the
   * output is at least the unseen reasoning estimated (unseenOutput).
   */
  private abnormalUsage(): Usage {
    // Input beyond the request and the provider's reports (server tool results) adds to both.
    const inputTokens = Math.min(MAX_TOKENS, Math.max(this.inputTokens, this.countedInput) + this.unreportedInput);
    // No provider bills more output than the model's limit allows (a broken one may send more).
    const relayed = Math.max(Math.min(tokensOf(this.outputChars), this.model.outputTokenLimit * this.choices), this.unseenOutput());
    const reported = this.reported;
    if (reported === null) return this.asAudio({ inputTokens, outputTokens: relayed, cacheReadTokens: 0, cacheWriteTokens: 0 });
    const price = this.model.price;
    // Input against input: the searches reported are added after (found in review: compared
    // with the estimate's input, they could replace it, or be dropped).
    const reportedInput: Usage = {
      ...reported, inputTokens: Math.min(MAX_TOKENS, reported.inputTokens + this.unreportedInput), outputTokens: 0, webSearches: 0, audioOutputTokens: 0,
    };
    const estimatedInput = this.asAudio({ inputTokens, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, webSearches: 0 });
    const input = costMicro(price, reportedInput) >= costMicro(price, estimatedInput) ? reportedInput : estimatedInput;
    input.outputTokens = Math.max(reported.outputTokens, relayed);
    input.webSearches = reported.webSearches ?? 0;
    if (this.audio?.output != null) input.audioOutputTokens = input.outputTokens;
    return input;
  }

  /**
   * The output a model that reasons unseen (`reasoningTokensPerSecond`) generated by now: its
   * rate for the seconds since the provider had the request, within the output reserved; 0 for
   * other models. Its reasoning is billed, and never relayed, so the output relayed says nothing
   * of it (found in review: a client that left a reasoning model's call at its first words, or
   * during a long answer's padding, was charged none of the thousands of tokens it reasoned).
   */
  private unseenOutput(): number {
    const rate = this.model.reasoningTokensPerSecond;
    if (rate === 0 || this.sentAt === 0 || !this.reasons()) return 0;
    return Math.min(Math.ceil(((performance.now() - this.sentAt) / 1000) * rate), this.maxOutputTokens * this.choices);
  }

  /**
   * Whether the call reasons on its deployment (found in review: a plain call of a model with a
   * rate was charged the wait for its first words as reasoning). OpenAI's reasoning models reason
   * unless asked for no or minimal effort; Claude only with thinking on: a `-thinking` id, the
   * client's `thinking`, or an effort that a translation turns into it.
   */
  private reasons(): boolean {
    const b = this.body;
    // The endpoint's own field (chat's `reasoning_effort`, the Responses API's
    // `reasoning.effort`), and the other's too when it is sent: a compatible server may read
    // that one (found in review: a decoy `reasoning.effort: "none"` beside `reasoning_effort:
    // "high"` turned the charge off).
    const nested = isObj(b.reasoning) ? b.reasoning.effort : undefined;
    const [effort, other] = this.endpoint === 'responses' ? [nested, b.reasoning_effort] : [b.reasoning_effort, nested];
    const small = (e: unknown) => e === 'none' || e === 'minimal';
    const little = small(effort) && (other === undefined || other === null || small(other));
    if (this.model.provider.protocol !== 'anthropic') return !little;
    // The client's own `thinking` goes as it is, a `-thinking` id's included (found in review: disabled there, it was charged).
    if (b.thinking !== undefined) return isObj(b.thinking) && b.thinking.type !== 'disabled';
    if (this.model.thinking) return true;
    // A translation that left thinking off for this step (a tool loop's, see to-anthropic.ts) named the effort dropped.
    if (this.ctx.dropped !== null && this.ctx.dropped.split(',').includes(this.endpoint === 'responses' ? 'reasoning.effort' : 'reasoning_effort')) return false;
    return effort !== undefined && effort !== null && !little;
  }

  /**
   * An estimate of a call that asked for audio, priced as audio, as it was reserved (found in
   * review: a client leaving before the usage came was charged its audio at the text prices).
   */
  private asAudio(usage: Usage): Usage {
    if (this.audio === null) return usage;
    if (this.audio.input !== null) usage.audioInputTokens = audioInputEstimate(this.audio, usage.inputTokens);
    if (this.audio.output !== null) usage.audioOutputTokens = usage.outputTokens;
    return usage;
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
    if (usage !== NO_USAGE) usage = this.withinLimit(usage);
    // The provider had the request (a refusal is NO_USAGE): OpenAI bills the searches of every
    // call of a search model, and those the request asked for (another server runs none: found
    // in review, an Anthropic fallback of a search model was charged one).
    if (usage !== NO_USAGE && this.model.provider.protocol === 'openai') {
      const perCall = Math.max(this.model.price.webSearchesPerCall, this.searchesPerCall);
      if (perCall > (usage.webSearches ?? 0)) usage = { ...usage, webSearches: perCall };
    }
    const cost = costMicro(this.model.price, usage);
    const gw = this.gw;
    const settlement = gw.limiter.settle(this.ticket, cost);
    if (usage === NO_USAGE) {
      if (settlement instanceof Promise) settlement.catch(() => {}); // nothing to record; the lease expires
      return;
    }
    gw.metrics.charge(this.model.id, usage.inputTokens + usage.cacheReadTokens + usage.cacheWriteTokens, usage.outputTokens, cost);
    // Every call is recorded: billable ones as charges (billing history), free ones as usage only.
    const write = (balanceAfterMicro: number | null, balanceUnknown = false) => gw.record(callEntry({
      accountId: this.ticket.accountId, keyId: this.ctx.key!.id, requestId: this.ctx.id, model: this.model.id, deployment: this.model.provider.id, billable: this.model.billable,
      costMicro: cost, balanceAfterMicro, balanceUnknown, usage, estimated, at: gw.clock.now(),
    }));
    if (!(settlement instanceof Promise)) return write(settlement.balanceAfterMicro);
    // Counted until recorded: a call already over (its slot given back) may still be waiting
    // for its settlement, and the drain must not close the ledger under it.
    gw.settling++;
    // If the shared store cannot take the charge, the history still must: record it anyway.
    return settlement.then((s) => {
      gw.settling--;
      return write(s.balanceAfterMicro);
    }, (err: unknown) => {
      gw.settling--;
      gw.logger.error('settlement not confirmed by the limiter; recorded in the ledger (a Redis limiter sends it again)', { request_id: this.ctx.id, error: String(err) });
      // Its balance after is not known, but a prepaid charge is taken from the balance all the
      // same: the ledger's books (which a shared store's money is rebuilt from) must count it.
      return write(null, this.ticket.prepaid && cost > 0);
    });
  }

  /**
   * The client stopped reading: from now on the call waits for it. It is cut only when a whole
   * `clientIdleTimeoutMs` passes in which it read nothing (the bytes waiting for it did not go
   * down): a client still reading a large answer slowly keeps going.
   */
  private waitForClient(): void {
    // The list of the config this call started under: a reload may swap the gateway's list.
    const list = (this.clientList ??= this.gw.clientIdle);
    watchedAnswers.add(this.res);
    this.taken = bytesTaken(this.res.socket);
    this.clientWatch ??= new Watch(() => {
      if (this.aborted || this.res.writableFinished) return;
      const taken = bytesTaken(this.res.socket);
      if (taken > this.taken) {
        this.taken = taken; // it read some: another full period
        return list.arm(this.clientWatch!);
      }
      this.cut(`the client read nothing for ${list.ms} ms`);
    });
    list.arm(this.clientWatch);
  }

  private clientRead(): void {
    if (this.clientWatch !== null) {
      this.clientList!.remove(this.clientWatch);
      watchedAnswers.delete(this.res); // unwatched again: the server's sweep covers it
    }
  }

  /** The response is over: finished, or the client went away first. */
  private readonly onClose = (): void => {
    if (this.closed) return; // a pipelined answer's connection, then its own close
    this.closed = true;
    if (this.queuedOn !== null) noLongerWaiting(this.queuedOn, this.onClose);
    try {
      this.clientRead();
      if (!this.res.writableFinished) {
        this.aborted = true;
        for (const stop of this.stops) stop();
        if (!this.res.headersSent) this.ctx.status = 499;
      }
      // A client gone before the provider had the request costs nothing; after, it is charged.
      if (!this.settled) this.chargeAside(this.delivered ? this.abnormalUsage() : NO_USAGE, this.delivered);
    } catch (err) {
      this.gw.logger.error('internal error closing a call', { request_id: this.ctx.id, error: String((err as Error)?.stack ?? err) });
    } finally {
      // Whatever went wrong above, the slot and the idempotency key go back, once; and a
      // release that throws still ends the call (else the drain waited for it for ever, and
      // the calls queued after it on a dying connection were never released).
      try {
        this.gw.limiter.release(this.ticket);
      } catch (err) {
        this.gw.logger.error('internal error releasing a call', { request_id: this.ctx.id, error: String((err as Error)?.stack ?? err) });
      }
      this.gw.inFlight--;
      this.gw.done(this.ctx);
    }
  };
}

/**
 * `usage`, with its input taken from `floor` (all three kinds, as `floor` splits them) when
 * `floor` reported more input in all. The input as a whole, not each kind: a server may count
 * cache tokens inside its running input and split them out only at the end, and the larger of
 * each kind would count them twice (found in review). Output is not floored: the first count
 * a stream reports (Anthropic's message_start: 1) is a placeholder, not a running total.
 */
function atLeast(usage: Usage, floor: Usage): Usage {
  const input = usage.inputTokens + usage.cacheReadTokens + usage.cacheWriteTokens;
  if (input >= floor.inputTokens + floor.cacheReadTokens + floor.cacheWriteTokens) return usage;
  return {
    inputTokens: floor.inputTokens, outputTokens: usage.outputTokens, cacheReadTokens: floor.cacheReadTokens, cacheWriteTokens: floor.cacheWriteTokens,
    cacheWrite1hTokens: floor.cacheWrite1hTokens ?? 0, webSearches: usage.webSearches ?? 0,
    audioInputTokens: Math.min(floor.audioInputTokens ?? 0, floor.inputTokens), audioOutputTokens: usage.audioOutputTokens ?? 0,
  };
}
