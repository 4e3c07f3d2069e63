import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { BilledCall } from '../billing/call.js';
import { bodyRefusal, type BodyResult, readBody, takeBody } from '../http/body.js';
import { bodyShapeProblem } from '../http/body-shape.js';
import { newRequestId, type RequestContext } from '../http/context.js';
import { sendError } from '../http/reply.js';
import { MAX_TOKENS, type Price } from '../money.js';
import { estimateInputTokens, MAX_DEPTH, reservation } from '../billing/estimate.js';
import { WIRES } from '../protocols/index.js';
import type { AudioAsked, CallRequest, Endpoint, WireProtocol } from '../protocols/types.js';
import type { Deployment, ModelEntry } from '../directory.js';
import type { Exchange } from '../providers/types.js';
import { RoutedCall } from '../routing/routed-call.js';
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
    takeBody(ctx, req, res, gw.config.server.maxBodyBytes);
    readBody(req, gw.config.server.maxBodyBytes, (result) => {
      try {
        afterBody(gw, ctx, req, res, wire, result);
      } catch (err) {
        gw.fault(ctx, res, err);
      }
    }, gw.bodies, ctx.key!.account.id);
  };
}

/** Each output limit the client set is at most the model's `outputTokenLimit`; null when they are. */
function checkOutputLimits(call: CallRequest, outputTokenLimit: number): { message: string; param: string } | null {
  for (const [name, value] of call.limits) {
    if (value > outputTokenLimit) return { param: name, message: `"${name}" must be an integer from 1 to ${outputTokenLimit} for this model.` };
  }
  return null;
}

/** The field asking for audio the model's prices cannot price (OpenAI bills it far above text), or null. */
function unpricedAudio(audio: AudioAsked, price: Price): string | null {
  if (audio.input !== null && price.audioInput === null) return audio.input;
  if (audio.output !== null && price.audioOutput === null) return audio.output;
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
    const refusal = bodyRefusal(result.reason, gw.config.server.maxBodyBytes);
    return sendError(ctx, res, refusal.code, gw.done, { message: refusal.message, retryAfterS: refusal.retryAfterS });
  }
  const shape = bodyShapeProblem(result.body);
  if (shape !== null) return sendError(ctx, res, 'invalid_request', gw.done, { message: shape, fields: { param: null } });
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
  // Looked up again: the directory may have changed while the body arrived.
  const key = gw.directory.current(ctx.key!);
  if (key === undefined) return sendError(ctx, res, 'invalid_api_key', gw.done);
  ctx.key = key;
  const model = gw.directory.resolveModel(key, call.model);
  if (model === undefined) {
    return sendError(ctx, res, 'model_not_found', gw.done, {
      message: `The model "${call.model}" does not exist or this key may not use it.`,
    });
  }
  const audioProblem = call.audio == null ? null : unpricedAudio(call.audio, model.price);
  if (audioProblem !== null) {
    return sendError(ctx, res, 'invalid_request', gw.done, {
      message: `"${audioProblem}" asks for audio, which this model has no price for.`, fields: { param: audioProblem },
    });
  }
  const outputProblem = checkOutputLimits(call, model.outputTokenLimit);
  if (outputProblem !== null) {
    return sendError(ctx, res, 'invalid_request', gw.done, { message: outputProblem.message, fields: { param: outputProblem.param } });
  }
  // A Responses call may refer to items of the gateway's own translated answers (the AI SDK's
  // default, `store: true`): a translation takes them whole, and they count in the estimate.
  const input = endpoint === 'responses' ? gw.items.resolve(key.id, call.body.input, gw.config.server.maxBodyBytes) : call.body.input;
  const translatable = input === call.body.input ? call.body : { ...call.body, input };
  const inputTokens = estimateInputTokens(translatable);
  if (inputTokens === null) {
    return sendError(ctx, res, 'invalid_request', gw.done, {
      message: `The request body nests deeper than ${MAX_DEPTH} levels.`, fields: { param: null },
    });
  }
  // How the call reaches each deployment: as it is, or translated (src/translate/). A deployment
  // whose protocol cannot express it is left out; when none can, the first one's reason is the answer.
  const deployments = model.deployments;
  const plans = new Array<Plan | Refusal>(deployments.length);
  let excluded = 0;
  let usable = -1;
  let usableCount = 0;
  let maxOutput = 0;
  for (let i = 0; i < deployments.length; i++) {
    const served = deployments[i]!.model;
    const protocol = served.provider.protocol;
    // Deployments of one protocol (and output limit field) take the request the same way: it is planned once for them.
    const field = served.provider.outputLimitField;
    let same = 0;
    while (same < i && (deployments[same]!.model.provider.protocol !== protocol || deployments[same]!.model.provider.outputLimitField !== field)) same++;
    const plan = same < i ? plans[same]! : planFor(protocol, wire, call, translatable, served, inputTokens, ctx.id, req.headers);
    plans[i] = plan;
    if ('message' in plan) {
      excluded |= 1 << i;
      continue;
    }
    if (usableCount++ === 0) usable = i;
    // Reserve for what the provider may really produce (a `-thinking` model's raised limit).
    maxOutput = Math.max(maxOutput, (plan.translator === null ? wire : WIRES[plan.translator.provider]).outputBudget(call, served));
  }
  if (usableCount === 0) {
    const refusal = plans[0] as Refusal;
    return sendError(ctx, res, 'invalid_request', gw.done, { message: refusal.message, fields: { param: refusal.param } });
  }
  // A call whose charge could not be recorded must not reach the provider (which would bill it).
  if (!gw.ledger.ready()) return sendError(ctx, res, 'ledger_unavailable', gw.done, { retryAfterS: 1 });
  // Every answer of `n` may use the whole output budget.
  const reservedOutput = Math.min(MAX_TOKENS, maxOutput * call.choices);
  const estimate = model.billable ? reservation(call, model.price, inputTokens, reservedOutput) : null;
  // In-flight calls keep the providers they started with across a reload.
  const providers = gw.providers;
  gw.admit(ctx, res, gw.limiter.admit(key.account, key, ctx.idempotencyKey ?? null, estimate), (decision) => {
    const billed = new BilledCall(gw, ctx, req, res, endpoint, call, text, model, inputTokens, maxOutput, decision, estimate === null ? null : reservedOutput);
    if (billed.aborted) return; // the client left while admission was awaited: its close gives everything back
    // The usual case, one deployment taking the request as it is: no routing, nothing to allocate.
    const only = usableCount === 1 ? deployments[usable]! : null;
    if (only !== null && (plans[usable] as Plan).translated === null) {
      billed.serve(only.model);
      gw.metrics.attempt(only.model.provider.id);
      try {
        return providers.get(only.model.provider.id)!.handle(billed);
      } catch (err) {
        return billed.crash(err);
      }
    }
    const launch = (deployment: Deployment, index: number, ex: Exchange) => {
      const plan = plans[index] as Plan;
      gw.metrics.attempt(deployment.model.provider.id);
      try {
        ctx.dropped = plan.dropped; // the attempt that answers names what its translation left out
        if (plan.translated === null) return providers.get(deployment.model.provider.id)!.handle(ex);
        providers.get(deployment.model.provider.id)!.handle(new TranslatedCall(ex, plan.translator!, plan.translated, {
          model: model.id, maxOutputTokens: maxOutput, inputTokens, requestId: ctx.id, clientBody: call.body, names: plan.translated.names,
          created: Math.floor(gw.clock.now() / 1000), itemPrefix: newRequestId(),
          // Kept for later calls that refer to them, unless the client said it stores nothing (Codex).
          remember: endpoint === 'responses' && call.body.store !== false ? (output) => gw.items.remember(key.id, output) : undefined,
        }));
      } catch (err) {
        billed.crash(err);
      }
    };
    if (only !== null) {
      billed.serve(only.model);
      return launch(only, usable, billed); // one deployment can take it: its provider's own retries apply
    }
    new RoutedCall(billed, deployments, excluded, gw.config.routing, gw, launch).start();
  });
}

/** How a call reaches providers of one protocol. */
interface Plan {
  /** null: the provider speaks the client's endpoint, and gets the request as it is. */
  translator: Translator | null;
  translated: TranslatedRequest | null;
  /** The optional fields the translation left out (access log), or null. */
  dropped: string | null;
}

const AS_IT_IS: Plan = Object.freeze({ translator: null, translated: null, dropped: null });

interface Refusal {
  message: string;
  param: string | null;
}

/**
 * The call as a provider of `protocol` takes it, or why it cannot (answered 400 before
 * admission): as it is, or `body` (the call's, its references to kept items resolved) translated.
 */
function planFor(
  protocol: Protocol, wire: WireProtocol, call: CallRequest, body: Record<string, unknown>, model: ModelEntry, inputTokens: number, requestId: string,
  headers: IncomingHttpHeaders,
): Plan | Refusal {
  if (protocol === 'mock') return AS_IT_IS;
  if (supports(protocol, wire.endpoint)) return wire.passThroughRefusal?.(call, headers) ?? AS_IT_IS;
  const translator = translatorFor(wire.endpoint, protocol);
  if (translator === null) {
    return { message: `The model "${call.model}" is served over the ${protocol} protocol, which has no ${wire.path}; use ${servedPaths(protocol)}.`, param: 'model' };
  }
  try {
    const translated = translator.request(body, {
      model: model.id, maxOutputTokens: call.maxTokens ?? model.maxOutputTokens, inputTokens, requestId, clientBody: call.body,
      outputLimitField: model.provider.outputLimitField,
    });
    return { translator, translated, dropped: translated.dropped.length > 0 ? translated.dropped.join(',') : null };
  } catch (err) {
    if (!(err instanceof Untranslatable)) throw err;
    return { message: err.message, param: err.param };
  }
}

/** The client paths a provider protocol answers (for the error naming them). */
function servedPaths(protocol: Exclude<Protocol, 'mock'>): string {
  return (Object.keys(KINDS[protocol].paths) as Endpoint[]).map((e) => WIRES[e].path).join(' or ');
}
