import { hash, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { boolField, capField, ENTITY_ID, ENTITY_ID_RULE, limitField, modelsField, type Field } from '../config/fields.js';
import type { AccountConfig, Limit, PlanConfig } from '../config/types.js';
import { GatewayError } from '../errors.js';
import type { RouteHost } from './host.js';
import { bodyRefusal, readBodyAsync, takeBody } from '../http/body.js';
import type { RequestContext } from '../http/context.js';
import { baseHeaders, sendError, sendJson } from '../http/reply.js';
import { microToUsd, parseUsd } from '../money.js';
import type { Router } from '../router.js';
import { historyItem } from './account.js';

type Body = Record<string, unknown>;

/** An admin credit's note: what billing history shows (no control characters; PostgreSQL text cannot hold a NUL). */
const NOTE = /^[^\u0000-\u001f\u007f]{0,1000}$/;

function bad(param: string, message: string): GatewayError {
  return new GatewayError('invalid_request', { message, fields: { param } });
}

/** Reads a JSON object body with only `allowed` fields, then runs `then`; every failure is answered. */
function withBody(gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse, allowed: string[],
  then: (body: Body) => Promise<void> | void): void {
  takeBody(ctx, req, res, gw.config.server.maxBodyBytes);
  readBodyAsync(req, gw.config.server.maxBodyBytes).then(async (result) => {
    try {
      if (!result.ok) {
        if (result.reason === 'aborted') return;
        ctx.closeConnection = true;
        const refusal = bodyRefusal(result.reason, gw.config.server.maxBodyBytes);
        return sendError(ctx, res, refusal.code, gw.done, { message: refusal.message });
      }
      let body: unknown;
      try {
        body = result.body.length === 0 ? {} : JSON.parse(result.body.toString('utf8'));
      } catch {
        return sendError(ctx, res, 'invalid_json', gw.done);
      }
      if (body === null || typeof body !== 'object' || Array.isArray(body)) throw bad('', 'The body must be a JSON object.');
      for (const field of Object.keys(body)) {
        if (!allowed.includes(field)) throw bad(field, `Unknown field "${field}" (allowed: ${allowed.join(', ')}).`);
      }
      await then(body as Body);
    } catch (err) {
      gw.fault(ctx, res, err);
    }
  });
}

/** A body field checked by the same rule as in a config file (config/fields.ts); undefined when absent. */
function field<T>(body: Body, name: string, rule: (v: unknown) => Field<T>): T | undefined {
  const v = body[name];
  if (v === undefined) return undefined;
  const r = rule(v);
  if (!r.ok) throw bad(name, `"${name}" ${r.message}.`);
  return r.value;
}

function modelsOf(gw: RouteHost, body: Body): string[] | null | undefined {
  const v = body.models;
  if (v === undefined) return undefined;
  if (v === null) return null;
  const r = modelsField(v, gw.config.models);
  if (!r.ok) throw bad('models', `"models" ${r.message}${r.index === undefined ? '' : ` (element ${r.index})`}.`);
  return r.value;
}

/** An id in a path or a body: the config file's rule for ids of plans, accounts and keys. */
function checkId(param: string, id: unknown, what: string): string {
  if (typeof id !== 'string' || !ENTITY_ID.test(id)) throw bad(param, `A ${what} id ${ENTITY_ID_RULE}.`);
  return id;
}

/** Answers 400 with the first problem when a change does not fit the config. */
function rejectChange(problems: string[], param: string): GatewayError {
  return bad(param, `The change does not fit the configuration: ${problems.join('; ')}`);
}

const noKey = (id: string) => new GatewayError('not_found', { message: `No key "${id}".` });

const usdOrUnlimited = (v: Limit | undefined) => (v === undefined ? null : v === null ? 'unlimited' : microToUsd(v));
const limitOrUnlimited = (v: Limit | undefined) => (v === undefined ? null : v === null ? 'unlimited' : v);

function keyObject(gw: RouteHost, id: string) {
  const k = gw.config.keys.get(id)!;
  const created = gw.admin.state.keys.get(id)?.createdAt;
  return {
    id, account: k.account, models: k.models, rpm: k.rpm, concurrency: k.concurrency, disabled: k.disabled,
    created_at: created === undefined ? null : new Date(created).toISOString(),
  };
}

function planObject(p: PlanConfig) {
  return { name: p.name, rpm: p.rpm, concurrency: p.concurrency, dailyCapUsd: p.dailyCapMicro === null ? null : microToUsd(p.dailyCapMicro) };
}

function sendAccount(gw: RouteHost, ctx: RequestContext, res: ServerResponse, id: string): void {
  const a = gw.config.accounts.get(id)!;
  const entry = gw.directory.accounts.get(id)!;
  gw.decide(ctx, res, gw.limiter.snapshot(entry), (snap) => sendJson(ctx, res, 200, JSON.stringify({
    id, plan: a.plan, rpm: limitOrUnlimited(a.rpm), concurrency: limitOrUnlimited(a.concurrency), dailyCapUsd: usdOrUnlimited(a.dailyCapMicro),
    prepaid: a.balanceMicro !== null, balance: snap.balanceMicro === null ? null : microToUsd(snap.balanceMicro),
    daily_spend: microToUsd(snap.spentTodayMicro), in_flight: snap.inFlight,
  }), gw.done));
}

export function registerAdminRoutes(router: Router<RouteHost>): void {
  router.add('/admin/v1/keys', {
    admin: true,
    methods: {
      GET: (gw, ctx, _req, res) => {
        const data = [...gw.config.keys.keys()].sort().map((id) => keyObject(gw, id));
        sendJson(ctx, res, 200, JSON.stringify({ object: 'list', data }), gw.done);
      },
      POST: (gw, ctx, req, res) => withBody(gw, ctx, req, res, ['account', 'id', 'models', 'rpm', 'concurrency'], async (body) => {
        if (typeof body.account !== 'string' || !gw.config.accounts.has(body.account)) throw bad('account', '"account" must name an existing account.');
        const account = body.account;
        const id = body.id === undefined ? `key_${randomBytes(6).toString('hex')}` : checkId('id', body.id, 'key');
        const plaintext = `sk-mg-${randomBytes(24).toString('base64url')}`;
        const models = modelsOf(gw, body) ?? null;
        const rpm = field(body, 'rpm', limitField) ?? null;
        const concurrency = field(body, 'concurrency', limitField) ?? null;
        const problems = await gw.changeAdmin((s) => {
          // Checked in the queue: of two calls creating one id at once, exactly one succeeds.
          if (gw.config.keys.has(id) || s.keys.has(id) || s.deletedKeys.has(id)) throw bad('id', `A key "${id}" exists already.`);
          s.keys.set(id, { id, account, sha256: hash('sha256', plaintext), models, rpm, concurrency, disabled: false, createdAt: Date.now() });
        });
        if (problems.length > 0) throw rejectChange(problems, 'id');
        sendJson(ctx, res, 201, JSON.stringify({ ...keyObject(gw, id), key: plaintext }), gw.done);
      }),
    },
  });

  router.add('/admin/v1/keys/*', {
    admin: true,
    methods: {
      PATCH: (gw, ctx, req, res) => withBody(gw, ctx, req, res, ['disabled', 'models', 'rpm', 'concurrency'], async (body) => {
        const id = ctx.param;
        if (!gw.config.keys.has(id)) throw noKey(id);
        const patch = {
          ...(body.disabled !== undefined ? { disabled: field(body, 'disabled', boolField)! } : {}),
          ...(body.models !== undefined ? { models: modelsOf(gw, body)! } : {}),
          ...(body.rpm !== undefined ? { rpm: field(body, 'rpm', limitField)! } : {}),
          ...(body.concurrency !== undefined ? { concurrency: field(body, 'concurrency', limitField)! } : {}),
        };
        const problems = await gw.changeAdmin((s) => {
          const own = s.keys.get(id);
          if (own !== undefined) s.keys.set(id, { ...own, ...patch });
          else if (gw.config.keys.has(id)) s.keyPatches.set(id, { ...(s.keyPatches.get(id) ?? {}), ...patch });
          else throw noKey(id); // deleted while this call waited its turn
        });
        if (problems.length > 0) throw rejectChange(problems, 'models');
        sendJson(ctx, res, 200, JSON.stringify(keyObject(gw, id)), gw.done);
      }),
      DELETE: (gw, ctx, _req, res) => {
        const id = ctx.param;
        gw.changeAdmin((s) => {
          if (!gw.config.keys.has(id)) throw noKey(id);
          if (!s.keys.delete(id)) s.deletedKeys.add(id);
          s.keyPatches.delete(id);
        }).then((problems) => {
          if (problems.length > 0) throw rejectChange(problems, 'id');
          ctx.status = 204;
          res.writeHead(204, baseHeaders(ctx, null)); // a drain's or an unread body's close included
          res.end();
          gw.done(ctx);
        }).catch((err: unknown) => gw.fault(ctx, res, err));
      },
    },
  });

  router.add('/admin/v1/plans/*', {
    admin: true,
    methods: {
      PUT: (gw, ctx, req, res) => withBody(gw, ctx, req, res, ['rpm', 'concurrency', 'dailyCapUsd'], async (body) => {
        const name = checkId('name', ctx.param, 'plan');
        if (body.rpm === undefined) throw bad('rpm', '"rpm" is required.');
        if (body.concurrency === undefined) throw bad('concurrency', '"concurrency" is required.');
        const plan: PlanConfig = {
          name, rpm: field(body, 'rpm', limitField)!, concurrency: field(body, 'concurrency', limitField)!,
          dailyCapMicro: field(body, 'dailyCapUsd', capField) ?? null,
        };
        const problems = await gw.changeAdmin((s) => { s.plans.set(name, plan); });
        if (problems.length > 0) throw rejectChange(problems, 'name');
        sendJson(ctx, res, 200, JSON.stringify(planObject(gw.config.plans.get(name)!)), gw.done);
      }),
    },
  });

  router.add('/admin/v1/accounts/*', {
    admin: true,
    methods: {
      GET: (gw, ctx, _req, res) => {
        if (!gw.config.accounts.has(ctx.param)) return sendError(ctx, res, 'not_found', gw.done, { message: `No account "${ctx.param}".` });
        sendAccount(gw, ctx, res, ctx.param);
      },
      PUT: (gw, ctx, req, res) => withBody(gw, ctx, req, res, ['plan', 'rpm', 'concurrency', 'dailyCapUsd', 'prepaid'], async (body) => {
        const id = checkId('id', ctx.param, 'account');
        if (typeof body.plan !== 'string' || !gw.config.plans.has(body.plan)) throw bad('plan', '"plan" must name an existing plan.');
        const plan = body.plan;
        const prepaid = field(body, 'prepaid', boolField);
        // An account's limit left unset (absent, or null as GET shows it) is its plan's; only
        // "unlimited" lifts it (found in review: a GET put back as it was lifted all three).
        const rpm = body.rpm === null ? undefined : field(body, 'rpm', limitField);
        const concurrency = body.concurrency === null ? undefined : field(body, 'concurrency', limitField);
        const dailyCapMicro = body.dailyCapUsd === null ? undefined : field(body, 'dailyCapUsd', capField);
        const problems = await gw.changeAdmin((s) => {
          // Whether an account is prepaid (and its one-time credit) is kept; a new one starts at 0.
          const existing = gw.config.accounts.get(id);
          const balanceMicro = existing !== undefined ? existing.balanceMicro : prepaid === true ? 0 : null;
          const account: AccountConfig = { id, plan, rpm, concurrency, dailyCapMicro, balanceMicro };
          s.accounts.set(id, account);
        });
        if (problems.length > 0) throw rejectChange(problems, 'plan');
        sendAccount(gw, ctx, res, id);
      }),
    },
  });

  // Its own route, so a wrong method on either is 405 with its own Allow (found in review: GET
  // here was 404 "No account x/credits", POST on an account was 404).
  router.add('/admin/v1/accounts/*/credits', {
    admin: true,
    methods: {
      POST: (gw, ctx, req, res) => {
        const id = ctx.param;
        if (!gw.config.accounts.has(id)) return sendError(ctx, res, 'not_found', gw.done, { message: `No account "${id}".` });
        withBody(gw, ctx, req, res, ['amountUsd', 'note'], async (body) => {
          // Looked up again: a reload may have removed it while the body arrived.
          const account = gw.directory.accounts.get(id);
          if (account === undefined) throw new GatewayError('not_found', { message: `No account "${id}".` });
          if (!account.prepaid) throw bad('account', 'Credits apply to prepaid accounts only.');
          const amount = parseUsd(body.amountUsd);
          if (typeof amount === 'string') throw bad('amountUsd', `"amountUsd" ${amount}.`);
          if (amount <= 0) throw bad('amountUsd', '"amountUsd" must be an amount above 0.');
          // No control characters: a note is shown in billing history, and PostgreSQL text cannot hold a NUL.
          if (body.note !== undefined && (typeof body.note !== 'string' || !NOTE.test(body.note))) {
            throw bad('note', '"note" must be a string of at most 1000 characters without control characters.');
          }
          const entry = await gw.credits.credit({
            account, amountMicro: amount, note: (body.note as string | undefined) ?? null,
            idempotencyKey: ctx.idempotencyKey ?? null, requestId: ctx.id,
          });
          sendJson(ctx, res, 201, JSON.stringify({ ...historyItem(entry), note: entry.note }), gw.done);
        });
      },
    },
  });
}
