import type { IncomingMessage, ServerResponse } from 'node:http';
import { BilledCall } from '../billing/call.js';
import { readBody, type BodyResult } from '../http/body.js';
import type { RequestContext } from '../http/context.js';
import { sendError } from '../http/reply.js';
import { costMicro, MAX_TOKENS } from '../money.js';
import { estimateInputTokens, MAX_DEPTH } from '../billing/estimate.js';
import { WIRES } from '../protocols/index.js';
import type { CallRequest, Endpoint, WireProtocol } from '../protocols/types.js';
import type { Protocol } from '../config/types.js';
import { KINDS, supports } from '../providers/kinds.js';
import type { Router } from '../router.js';
import { TranslatedCall, translatorFor, Untranslatable, type Translator } from '../translate/index.js';
import type { TranslatedRequest } from '../translate/types.js';
import type { RouteHost } from './host.js';

/** The model calls: one POST route per wire protocol (src/protocols/). */
export function registerCompletionRoutes(router: Router<RouteHost>): void {
  for (const wire of Object.values(WIRES)) {
    router.add(wire.path, { auth: true, anthropic: wire.anthropic, methods: { POST: modelCall(wire) } });
  }
  // The gateway keeps no responses: what would read or change a stored one says so.
  const noStore = (gw: RouteHost, ctx: RequestContext, _req: IncomingMessage, res: ServerResponse) => sendError(ctx, res, 'not_found', gw.done, {
    message: 'This gateway keeps no responses (GET, DELETE, cancel and input_items of a stored response are not available): send the whole conversation in "input" with each call.',
  });
  router.add('/v1/responses/*', { auth: true, methods: { GET: noStore, POST: noStore, DELETE: noStore } });
}

/** POST handler of a model call: body, model, admission (contract order), then the provider. */
function modelCall(wire: WireProtocol) {
  return (gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse): void => {
    readBody(req, gw.config.server.maxBodyBytes, (result) => {
      try {
        afterBody(gw, ctx, req, res, wire, result);
      } catch (err) {
        gw.fault(ctx, res, err);
      }
    });
  };
}

/** Each output limit the client set is at most the model's `outputTokenLimit`; null when they are. */
function checkOutputLimits(call: CallRequest, outputTokenLimit: number): { message: string; param: string } | null {
  for (const [name, value] of call.limits) {
    if (value > outputTokenLimit) return { param: name, message: `"${name}" must be an integer from 1 to ${outputTokenLimit} for this model.` };
  }
  return null;
}

function afterBody(
  gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse, wire: WireProtocol, result: BodyResult,
): void {
  const endpoint = wire.endpoint;
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
  const text = result.body.toString('utf8');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return sendError(ctx, res, 'invalid_json', gw.done);
  }
  const checked = wire.check(parsed);
  if (!checked.ok) return sendError(ctx, res, 'invalid_request', gw.done, { message: checked.message, fields: { param: checked.param || null } });
  const call = checked.call;
  const key = ctx.key!;
  const model = gw.directory.resolveModel(key, call.model);
  if (model === undefined) {
    return sendError(ctx, res, 'model_not_found', gw.done, {
      message: `The model "${call.model}" does not exist or this key may not use it.`,
    });
  }
  const protocol = model.provider.protocol;
  // A model on an endpoint its provider does not speak is translated (src/translate/).
  let translator: Translator | null = null;
  if (protocol !== 'mock' && !supports(protocol, endpoint)) {
    translator = translatorFor(endpoint, protocol);
    if (translator === null) {
      return sendError(ctx, res, 'invalid_request', gw.done, {
        message: `The model "${call.model}" is served over the ${protocol} protocol, which has no ${wire.path}; use ${servedPaths(protocol)}.`,
        fields: { param: 'model' },
      });
    }
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
  let translated: TranslatedRequest | null = null;
  if (translator !== null) {
    try {
      translated = translator.request(call.body, {
        model: model.id, maxOutputTokens: call.maxTokens ?? model.maxOutputTokens, inputTokens, requestId: ctx.id, clientBody: call.body,
      });
    } catch (err) {
      if (!(err instanceof Untranslatable)) throw err;
      return sendError(ctx, res, 'invalid_request', gw.done, { message: err.message, fields: { param: err.param } });
    }
    if (translated.dropped.length > 0) ctx.dropped = translated.dropped.join(',');
  }
  // A call whose charge could not be recorded must not reach the provider (which would bill it).
  if (!gw.ledger.ready()) return sendError(ctx, res, 'ledger_unavailable', gw.done, { retryAfterS: 1 });
  // Reserve for what the provider may really produce (a `-thinking` model's raised limit);
  // every answer of `n` may use the whole output budget.
  const maxOutput = (translator === null ? wire : WIRES[translator.provider]).outputBudget(call, model);
  const reservedOutput = Math.min(MAX_TOKENS, maxOutput * call.choices);
  const estimate = model.billable
    ? costMicro(model.price, { inputTokens, outputTokens: reservedOutput, cacheReadTokens: 0, cacheWriteTokens: 0 })
    : null;
  gw.admit(ctx, res, gw.limiter.admit(key.account, key, ctx.idempotencyKey ?? null, estimate), (decision) => {
    const billed = new BilledCall(gw, ctx, req, res, endpoint, call, text, model, inputTokens, maxOutput, decision);
    const provider = gw.providers.get(model.provider.id)!;
    try {
      provider.handle(translated === null ? billed : new TranslatedCall(billed, translator!, translated, {
        model: model.id, maxOutputTokens: maxOutput, inputTokens, requestId: ctx.id, clientBody: call.body, names: translated.names,
        created: Math.floor(gw.clock.now() / 1000),
      }));
    } catch (err) {
      billed.crash(err);
    }
  });
}

/** The client paths a provider protocol answers (for the error naming them). */
function servedPaths(protocol: Exclude<Protocol, 'mock'>): string {
  return (Object.keys(KINDS[protocol].paths) as Endpoint[]).map((e) => WIRES[e].path).join(' or ');
}
