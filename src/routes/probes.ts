import type { Gateway } from '../gateway.js';
import { sendJson } from '../http/reply.js';
import type { Router } from '../router.js';

// Probe answers never change: built once.
const OK = Buffer.from('{"status":"ok"}');
const READY = Buffer.from('{"status":"ready"}');

export function registerProbeRoutes(router: Router<Gateway>): void {
  router.add('/healthz', {
    methods: { GET: (gw, ctx, _req, res) => sendJson(ctx, res, 200, OK, gw.done) },
  });
  router.add('/readyz', {
    methods: {
      GET: (gw, ctx, _req, res) => {
        const state = gw.ready();
        if (state.ready) sendJson(ctx, res, 200, READY, gw.done);
        else sendJson(ctx, res, 503, JSON.stringify({ status: 'not_ready', reason: state.reason }), gw.done);
      },
    },
  });
}
