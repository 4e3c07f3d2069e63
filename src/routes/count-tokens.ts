import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AccountEntry, KeyEntry, ModelEntry } from '../directory.js';
import { estimateInputTokens, MAX_DEPTH } from '../billing/estimate.js';
import { bodyRefusal, readBody, takeBody } from '../http/body.js';
import { MAX_COUNTS_PER_ACCOUNT } from '../http/counts-in-flight.js';
import { bodyShapeProblem } from '../http/body-shape.js';
import type { RequestContext } from '../http/context.js';
import { releaseWhenClosed } from '../http/pipelined.js';
import { sendError, sendErrorSpec, sendJson } from '../http/reply.js';
import type { AccountLimits, KeyLimits } from '../limiter/types.js';
import { bad, checkBasics, checkMessages } from '../protocols/common.js';
import type { Checked } from '../protocols/types.js';
import type { CountRequest, Provider } from '../providers/types.js';
import type { Router } from '../router.js';
import { Untranslatable } from '../translate/common.js';
import { countBodyFor, type CountEndpoint } from '../translate/count.js';
import type { RouteHost } from './host.js';

/**
 * The token counts clients call: POST /v1/messages/count_tokens (Anthropic's, which Claude Code
 * calls often) and POST /v1/responses/input_tokens (OpenAI's). Each is answered by the model's
 * provider, whatever its protocol: passed through to a provider whose count it is, translated as
 * the call would be to the other's, counted by the mock as it meters; an error for a model that
 * cannot count (never a made-up 0: a client that gets one stops compacting its context). Not
 * billed and holding no slot; counted against the plan's RPM in a window of its own (one for
 * both counts), so a burst of counts never eats the model calls' RPM.
 */
export function registerCountTokensRoute(router: Router<RouteHost>): void {
  router.add('/v1/messages/count_tokens', { auth: true, anthropic: true, methods: { POST: (gw, ctx, req, res) => countTokens(gw, ctx, req, res, 'messages') } });
  router.add('/v1/responses/input_tokens', { auth: true, methods: { POST: (gw, ctx, req, res) => countTokens(gw, ctx, req, res, 'responses') } });
}

/** A count's body problem: the model, and the messages (Anthropic's) or the input (OpenAI's, which a stored context may stand for). */
function countProblem(endpoint: CountEndpoint, body: unknown): Checked | null {
  const basic = checkBasics(body);
  if (basic !== null) return basic;
  const b = body as Record<string, unknown>;
  if (endpoint === 'messages') return checkMessages(b);
  if (b.input !== undefined && b.input !== null && typeof b.input !== 'string' && !Array.isArray(b.input)) {
    return bad('input', '"input" must be a string or an array of input items.');
  }
  return null;
}

/** The limits of counting: the account's and key's rpm, in windows of their own (`#` is in no id). */
function countingAccount(account: AccountEntry): AccountLimits {
  return { id: `${account.id}#count`, rpm: account.rpm, concurrency: null, dailyCapMicro: null, prepaid: false };
}
function countingKey(key: KeyEntry): KeyLimits {
  return { id: `${key.id}#count`, rpm: key.rpm, concurrency: null };
}

function countTokens(gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse, endpoint: CountEndpoint): void {
  takeBody(ctx, req, res, gw.config.server.maxBodyBytes);
  // Counts' bodies have a budget of their own, and keep their share until the answer closes: a
  // count holds no slot, so counts waiting on a slow provider could otherwise hold bodies bounded
  // only by rpm (found in review), and held in the model calls' budget they would refuse those.
  readBody(req, gw.config.server.maxBodyBytes, (result) => {
    try {
      if (!result.ok) {
        if (result.reason === 'aborted') {
          ctx.status = 499;
          return gw.done(ctx);
        }
        ctx.closeConnection = true;
        const refusal = bodyRefusal(result.reason, gw.config.server.maxBodyBytes);
        return sendError(ctx, res, refusal.code, gw.done, { message: refusal.message, retryAfterS: refusal.retryAfterS });
      }
      const shape = bodyShapeProblem(result.body);
      if (shape !== null) return sendError(ctx, res, 'invalid_request', gw.done, { message: shape, fields: { param: null } });
      let body: unknown;
      try {
        body = JSON.parse(result.body.toString('utf8'));
      } catch {
        return sendError(ctx, res, 'invalid_json', gw.done);
      }
      const problem = countProblem(endpoint, body);
      if (problem !== null && !problem.ok) {
        return sendError(ctx, res, 'invalid_request', gw.done, { message: problem.message, fields: { param: problem.param || null } });
      }
      const b = body as Record<string, unknown>;
      // As for a call: a body nested too deeply to walk (or to serialise upstream) is the client's 400, not a 500.
      if (estimateInputTokens(b) === null) {
        return sendError(ctx, res, 'invalid_request', gw.done, { message: `The request body nests deeper than ${MAX_DEPTH} levels.`, fields: { param: null } });
      }
      // Looked up again: the directory may have changed while the body arrived.
      const key = gw.directory.current(ctx.key!);
      if (key === undefined) return sendError(ctx, res, 'invalid_api_key', gw.done);
      ctx.key = key;
      const model = gw.directory.resolveModel(key, b.model as string);
      if (model === undefined) {
        return sendError(ctx, res, 'model_not_found', gw.done, { message: `The model "${String(b.model)}" does not exist or this key may not use it.` });
      }
      // The deployment and provider as they are now (a reload while admission is awaited must
      // not take them away), and the body translated for its count: what the call's translation
      // refuses is the request's 400 before admission (CONTRACT section 4: a rejected request
      // consumes nothing; found in review: it used up an RPM count).
      const candidates = countingCandidates(gw, model);
      // References to the gateway's own translated answers, put back whole as the call's are (found in review: the call took them, its count refused them).
      const input = endpoint === 'responses' ? gw.items.resolve(key.id, b.input, gw.config.server.maxBodyBytes) : b.input;
      const bodies: CountBodies = { client: b, translatable: input === b.input ? b : { ...b, input } };
      const first = countingDeployment(candidates, 0, endpoint, bodies, ctx.id);
      if (first instanceof Untranslatable) {
        return sendError(ctx, res, 'invalid_request', gw.done, { message: first.message, fields: { param: first.param } });
      }
      // At most MAX_COUNTS_PER_ACCOUNT at once, before admission (a refusal consumes nothing),
      // held until the answer closes, as its body is.
      const account = key.account.id;
      if (!gw.counts.take(account)) {
        return sendError(ctx, res, 'concurrency_limit_exceeded', gw.done, {
          message: `This account has ${MAX_COUNTS_PER_ACCOUNT} token counts under way on this gateway instance; retry after one ends.`, retryAfterS: 1,
        });
      }
      if (!releaseWhenClosed(req, res, () => gw.counts.give(account))) return;
      gw.admit(ctx, res, gw.limiter.admitInstant(countingAccount(key.account), countingKey(key), null), () => {
        let stops: Array<() => void> = [];
        // Answered, failed or abandoned: exactly one of them, and one access-log line (found in
        // review: a client that left mid-count stopped the count and logged nothing).
        let over = false;
        const end = (): boolean => {
          if (over) return false;
          over = true;
          return true;
        };
        const abandon = () => {
          if (!end()) return;
          for (const stop of stops) stop();
          stops = [];
          ctx.status = 499;
          gw.done(ctx);
        };
        // Abandoned when its answer closes unanswered (or, pipelined and still waiting, its
        // connection does); at once if the client left while a remote limiter decided: then
        // nothing goes upstream (found in review).
        if (!releaseWhenClosed(req, res, abandon)) return;
        let attempts = 0;
        const ask = (counting: Counting): void => {
          attempts++;
          try {
            // The next deployment that can take the body, if any: where a failure moves the count on.
            const later = countingDeployment(candidates, counting.index + 1, endpoint, bodies, ctx.id);
            const next = later instanceof Untranslatable ? null : later;
            /** Asks the next deployment, else runs `otherwise`. */
            const passOn = (attempt: boolean, otherwise: () => void): void => {
              if (over) return;
              if (next === null || (attempt && attempts >= gw.config.routing.maxAttempts)) return otherwise();
              ask(next);
            };
            const request: CountRequest = {
              endpoint, body: b, upstream: counting.upstream, model: counting.deployment, requestId: ctx.id, tenant: key.account.id,
              // Section 6's retries where no other deployment can take the count (found in review: a
              // routed model's one usable deployment had one attempt), the attempts left in all.
              attempts: next === null ? Math.max(1, gw.config.routing.maxAttempts - attempts + 1) : 1,
              header: (name) => {
                const value = req.headers[name];
                return Array.isArray(value) ? value[0] : value;
              },
              answer(json) {
                if (end()) sendJson(ctx, res, 200, json, gw.done);
              },
              fail: (code, details) => {
                if (end()) sendError(ctx, res, code, gw.done, details);
              },
              failWith: (code, spec, message) => {
                if (end()) sendErrorSpec(ctx, res, code, spec, gw.done, { message });
              },
              onAbort: (stop) => { stops.push(stop); },
              // Its server has no count (a vLLM or Ollama deployment): the next deployment that can
              // take the body is asked, within the same admission, else the request's 400.
              noCount: (message) => {
                // Not an attempt that failed: it takes none of `routing.maxAttempts` (found in review: a
                // vLLM deployment's 404 left the last deployment that could count unasked).
                attempts--;
                passOn(false, () => request.fail('invalid_request', { message, fields: { param: 'model' } }));
              },
              // It failed as a routed call fails over: the next is asked, up to `routing.maxAttempts`
              // counts in all, else this failure is the answer. Nothing cools down: a count is not a call.
              unavailable: (answer) => passOn(true, answer),
            };
            counting.provider.countTokens(request);
          } catch (err) {
            // A bug (maybe run from a socket's events): it fails this count, never the process, and it is answered.
            if (end()) gw.fault(ctx, res, err);
          }
        };
        ask(first!);
      });
    } catch (err) {
      gw.fault(ctx, res, err);
    }
  }, gw.countBodies, ctx.key!.account.id, res);
}

/** The deployment that counts, its provider, the body its count takes, and its place among the candidates. */
interface Counting {
  readonly deployment: ModelEntry;
  readonly provider: Provider;
  readonly upstream: Record<string, unknown>;
  readonly index: number;
}

/**
 * The deployments that may count a model's tokens, in the order calls take them: those not
 * cooling down first, then the non-fallback ones first (found in review: counts sent to a
 * fallback counted for a model the calls do not go to), in config order.
 */
function countingCandidates(gw: RouteHost, model: ModelEntry): Candidate[] {
  // Their providers as they are now: a reload while a count is under way must not take them away.
  const candidate = (deployment: ModelEntry): Candidate => ({ deployment, provider: gw.providers.get(deployment.provider.id)! });
  if (model.deployments.length <= 1) return [candidate(model)];
  return model.deployments
    .map((d, i) => ({ d, rank: (gw.cooldowns.until(d.key) === 0 ? 0 : 2) + (d.fallback ? 1 : 0), i }))
    .sort((x, y) => x.rank - y.rank || x.i - y.i)
    .map(({ d }) => candidate(d.model));
}

interface Candidate {
  readonly deployment: ModelEntry;
  readonly provider: Provider;
}

/**
 * The first candidate from `from` on that can take the body, and the body for its count (the
 * client's, or its translation). One whose translation refuses the body is passed over (found
 * in review: an Anthropic client's block that chat cannot express was refused though an
 * Anthropic deployment could count it); when every one refuses, the first refusal, or null when
 * none is left.
 */
/** A count's body as the client sent it (passed through), and with its references resolved (translated). */
interface CountBodies {
  readonly client: Record<string, unknown>;
  readonly translatable: Record<string, unknown>;
}

function countingDeployment(
  candidates: readonly Candidate[], from: number, endpoint: CountEndpoint, bodies: CountBodies, requestId: string,
): Counting | Untranslatable | null {
  let refused: Untranslatable | null = null;
  for (let index = from; index < candidates.length; index++) {
    const { deployment, provider } = candidates[index]!;
    // Its own count (the mock counts either): passed through.
    if (provider.countsAs === null || provider.countsAs === endpoint) return { deployment, provider, upstream: bodies.client, index };
    try {
      return {
        deployment, provider, index, upstream: countBodyFor(endpoint, bodies.translatable, {
          model: deployment.id, maxOutputTokens: deployment.maxOutputTokens, inputTokens: 0, requestId, clientBody: bodies.client,
          outputLimitField: deployment.provider.outputLimitField,
        }),
      };
    } catch (err) {
      if (!(err instanceof Untranslatable)) throw err;
      refused ??= err;
    }
  }
  return refused;
}
