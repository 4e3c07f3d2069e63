import type { Gateway } from '../gateway.js';
import { sendJson } from '../http/reply.js';
import { microToUsd } from '../money.js';
import type { Router } from '../router.js';

export function registerAccountRoutes(router: Router<Gateway>): void {
  router.add('/v1/balance', {
    auth: true,
    methods: {
      GET: (gw, ctx, _req, res) => {
        const key = ctx.key!;
        const account = key.account;
        gw.decide(ctx, res, gw.limiter.admitInstant(account, key, ctx.idempotencyKey ?? null), (decision) => {
          if (!decision.ok) return gw.reject(ctx, res, decision);
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
}
