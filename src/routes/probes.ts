import type { RouteHost } from './host.js';
import { baseHeaders, sendError, sendJson } from '../http/reply.js';
import type { Router } from '../router.js';

// Probe answers never change: built once.
const OK = Buffer.from('{"status":"ok"}');
const READY = Buffer.from('{"status":"ready"}');

export function registerProbeRoutes(router: Router<RouteHost>): void {
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
  router.add('/metrics', {
    methods: {
      GET: (gw, ctx, _req, res) => {
        if (!gw.config.server.metrics) return sendError(ctx, res, 'not_found', gw.done);
        const body = gw.metrics.render();
        const headers = baseHeaders(ctx, 'text/plain; version=0.0.4; charset=utf-8');
        headers.push('content-length', String(Buffer.byteLength(body)));
        ctx.status = 200;
        res.writeHead(200, headers);
        res.end(body);
        gw.done(ctx);
      },
    },
  });
}
