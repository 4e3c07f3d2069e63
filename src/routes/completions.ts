import type { IncomingMessage, ServerResponse } from 'node:http';
import { BilledCall } from '../billing/call.js';
import { readBody, type BodyResult } from '../http/body.js';
import type { RequestContext } from '../http/context.js';
import { sendError } from '../http/reply.js';
import { costMicro, MAX_TOKENS } from '../money.js';
import { estimateInputTokens, MAX_DEPTH } from '../providers/estimate.js';
import { supports, thinkingLimits } from '../providers/protocols.js';
import type { Endpoint } from '../providers/types.js';
import type { Router } from '../router.js';
import type { RouteHost } from './host.js';
import { checkCall, checkOutputLimits } from './validate.js';

export function registerCompletionRoutes(router: Router<RouteHost>): void {
  router.add('/v1/chat/completions', { auth: true, methods: { POST: modelCall('chat') } });
  router.add('/v1/messages', { auth: true, anthropic: true, methods: { POST: modelCall('messages') } });
  router.add('/v1/embeddings', { auth: true, methods: { POST: modelCall('embeddings') } });
}

/** POST handler of a model call: body, model, admission (contract order), then the provider. */
function modelCall(endpoint: Endpoint) {
  return (gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse): void => {
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
  gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse, endpoint: Endpoint, result: BodyResult,
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
    const billed = new BilledCall(gw, ctx, req, res, endpoint, call, model, inputTokens, maxOutput, decision);
    const provider = gw.providers.get(model.provider.id)!;
    try {
      provider.handle(billed);
    } catch (err) {
      billed.crash(err);
    }
  });
}

const ENDPOINT_PATHS: Record<Endpoint, string> = {
  chat: '/v1/chat/completions', messages: '/v1/messages', embeddings: '/v1/embeddings',
};
const PROTOCOL_ENDPOINT: Record<string, string> = { openai: '/v1/chat/completions', anthropic: '/v1/messages' };
