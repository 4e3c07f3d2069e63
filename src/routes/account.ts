import type { IncomingMessage, ServerResponse } from 'node:http';
import { DAY_MS } from '../clock.js';
import { GatewayError } from '../errors.js';
import type { RequestContext } from '../http/context.js';
import { releaseWhenClosed } from '../http/pipelined.js';
import type { RouteHost } from './host.js';
import { sendJson } from '../http/reply.js';
import type { GroupBy, LedgerEntry } from '../ledger/types.js';
import { microToUsd } from '../money.js';
import type { Router } from '../router.js';

const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;
const MAX_RANGE_DAYS = 366;

/** A YYYY-MM-DD that names a real day, as a UTC day number; null otherwise. */
function parseDay(text: string): number | null {
  const m = DATE.exec(text);
  if (m === null) return null;
  const ms = Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]));
  if (new Date(ms).toISOString().slice(0, 10) !== text) return null; // 2026-02-30 and the like
  return ms / DAY_MS;
}

function badParam(param: string, message: string): GatewayError {
  return new GatewayError('invalid_request', { message, fields: { param } });
}

/**
 * Admits a read that awaits the ledger (the file's or PostgreSQL's): it holds a concurrency slot
 * and its Idempotency-Key until its answer closes, as every authenticated /v1/ request counts
 * toward concurrency (found in review: admitted as instant, thousands of history reads of one
 * key ran at once, slowing every other tenant's calls).
 */
function admitHeld(gw: RouteHost, ctx: RequestContext, req: IncomingMessage, res: ServerResponse, then: () => void): void {
  const key = ctx.key!;
  gw.admit(ctx, res, gw.limiter.admit(key.account, key, ctx.idempotencyKey ?? null, null), (ticket) => {
    // Given back once: when the answer closes, or, for a pipelined answer still waiting behind
    // another, when its connection does (found in review: Node never closes such an answer).
    if (!releaseWhenClosed(req, res, () => gw.limiter.release(ticket))) {
      // The client left while a remote limiter decided: nothing to answer.
      ctx.status = 499;
      return gw.done(ctx);
    }
    then();
  });
}

export function registerAccountRoutes(router: Router<RouteHost>): void {
  router.add('/v1/balance', {
    auth: true,
    methods: {
      GET: (gw, ctx, _req, res) => {
        const key = ctx.key!;
        const account = key.account;
        gw.admit(ctx, res, gw.limiter.admitInstant(account, key, ctx.idempotencyKey ?? null), () => {
          gw.decide(ctx, res, gw.limiter.snapshot(account), (snap) => {
            const cap = account.dailyCapMicro;
            sendJson(ctx, res, 200, JSON.stringify({
              object: 'balance',
              account_id: account.id,
              currency: 'USD',
              balance: snap.balanceMicro === null ? null : microToUsd(snap.balanceMicro),
              daily_cap: cap === null ? null : microToUsd(cap),
              daily_spend: microToUsd(snap.spentTodayMicro),
              daily_remaining: cap === null ? null : microToUsd(Math.max(0, cap - snap.spentTodayMicro)),
              resets_at: new Date(snap.resetsAtMs).toISOString(),
            }), gw.done);
          });
        });
      },
    },
  });

  router.add('/v1/usage', {
    auth: true,
    methods: {
      GET: (gw, ctx, req, res) => {
        const key = ctx.key!;
        // Parameters are checked before admission: a bad request consumes nothing.
        const params = new URLSearchParams(ctx.query);
        const today = Math.floor(gw.clock.now() / DAY_MS);
        const startText = params.get('start');
        const endText = params.get('end');
        const groupBy = (params.get('group_by') ?? 'day') as GroupBy;
        const end = endText === null ? today : parseDay(endText);
        const start = startText === null ? (end ?? today) - 6 : parseDay(startText);
        if (start === null) return gw.fault(ctx, res, badParam('start', '"start" must be a date YYYY-MM-DD.'));
        if (end === null) return gw.fault(ctx, res, badParam('end', '"end" must be a date YYYY-MM-DD.'));
        if (start > end) return gw.fault(ctx, res, badParam('start', '"start" must not be after "end".'));
        if (end - start + 1 > MAX_RANGE_DAYS) {
          return gw.fault(ctx, res, badParam('end', `The range may span at most ${MAX_RANGE_DAYS} days.`));
        }
        if (groupBy !== 'day' && groupBy !== 'model' && groupBy !== 'key') {
          return gw.fault(ctx, res, badParam('group_by', '"group_by" must be day, model or key.'));
        }
        admitHeld(gw, ctx, req, res, () => {
          gw.decide(ctx, res, gw.ledger.usage(key.account.id, start, end, groupBy), (usage) => {
            const rows = usage.map((r) => ({
              date: r.date, model: r.model, key_id: r.keyId, requests: r.requests, input_tokens: r.inputTokens,
              output_tokens: r.outputTokens, cost: microToUsd(r.costMicro),
            }));
            sendJson(ctx, res, 200, JSON.stringify({ object: 'list', data: rows }), gw.done);
          });
        });
      },
    },
  });

  router.add('/v1/billing/history', {
    auth: true,
    methods: {
      GET: (gw, ctx, req, res) => {
        const key = ctx.key!;
        const params = new URLSearchParams(ctx.query);
        const limitText = params.get('limit');
        const limit = limitText === null ? 20 : Number(limitText);
        if (!/^\d+$/.test(limitText ?? '20') || limit < 1 || limit > 100) {
          return gw.fault(ctx, res, badParam('limit', '"limit" must be an integer from 1 to 100.'));
        }
        const after = params.get('after');
        admitHeld(gw, ctx, req, res, () => {
          gw.decide(ctx, res, gw.ledger.history(key.account.id, limit, after === '' ? null : after), (page) => {
            sendJson(ctx, res, 200, JSON.stringify({
              object: 'list', data: page.entries.map(historyItem), has_more: page.hasMore, next_cursor: page.nextCursor,
            }), gw.done);
          });
        });
      },
    },
  });
}

/** A ledger entry as billing history shows it. */
export function historyItem(e: LedgerEntry) {
  const item: Record<string, unknown> = {
    id: e.id, type: e.type, amount: microToUsd(e.amountMicro),
    balance_after: e.balanceAfterMicro === null ? null : microToUsd(e.balanceAfterMicro),
    created_at: new Date(e.createdAt).toISOString(), request_id: e.requestId, model: e.model, estimated: e.estimated,
  };
  if (e.deployment !== null) item.deployment = e.deployment;
  if (e.note !== null) item.note = e.note;
  return item;
}
