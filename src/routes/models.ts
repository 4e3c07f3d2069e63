import type { RouteHost } from './host.js';
import { sendError, sendJson } from '../http/reply.js';
import type { Router } from '../router.js';

export function registerModelRoutes(router: Router<RouteHost>): void {
  // The hottest path: the answer is precomputed per key; admission is synchronous in memory.
  router.add('/v1/models', {
    auth: true,
    methods: {
      GET: (gw, ctx, _req, res) => {
        const key = ctx.key!;
        const decision = gw.limiter.admitInstant(key.account, key, ctx.idempotencyKey ?? null);
        if (decision instanceof Promise || !decision.ok) {
          return gw.admit(ctx, res, decision, () => sendJson(ctx, res, 200, key.modelsBody, gw.done));
        }
        // Admitted synchronously (memory store): answer without allocating a callback.
        gw.metrics.admission('admitted');
        sendJson(ctx, res, 200, key.modelsBody, gw.done);
      },
    },
  });
  router.add('/v1/models/*', {
    auth: true,
    methods: {
      GET: (gw, ctx, _req, res) => {
        const key = ctx.key!;
        gw.admit(ctx, res, gw.limiter.admitInstant(key.account, key, ctx.idempotencyKey ?? null), () => {
          const model = gw.directory.listedModel(key, ctx.param);
          if (model === undefined) return sendError(ctx, res, 'model_not_found', gw.done);
          sendJson(ctx, res, 200, model.objectBody, gw.done);
        });
      },
    },
  });
}
