import type { ServerResponse } from 'node:http';
import { ERRORS, errorBody, type ErrorCode, type ErrorDetails, type ErrorSpec } from '../errors.js';
import type { RequestContext } from './context.js';

/** Called once per request when its answer is complete (the access log). */
export type OnDone = (ctx: RequestContext) => void;

/** The headers every answer carries: request id (twice for /v1/messages) and the close hint; its content type, if it has a body. */
export function baseHeaders(ctx: RequestContext, contentType: string | null): string[] {
  const headers = contentType === null ? ['x-request-id', ctx.id] : ['content-type', contentType, 'x-request-id', ctx.id];
  if (ctx.anthropic) headers.push('request-id', ctx.id);
  if (ctx.closeConnection || ctx.unreadBody) headers.push('connection', 'close');
  return headers;
}

/** A complete JSON answer with one writeHead and one end. */
export function sendJson(ctx: RequestContext, res: ServerResponse, status: number, body: string | Buffer, onDone: OnDone): void {
  const headers = baseHeaders(ctx, 'application/json');
  headers.push('content-length', String(typeof body === 'string' ? Buffer.byteLength(body) : body.length));
  ctx.status = status;
  res.writeHead(status, headers);
  res.end(body);
  onDone(ctx);
}

/** An error answer in the contract's envelope, with the table's retry hints. */
export function sendError(
  ctx: RequestContext, res: ServerResponse, code: ErrorCode, onDone: OnDone, details: ErrorDetails = {}, extra: string[] = [],
): void {
  sendErrorSpec(ctx, res, code, ERRORS[code], onDone, details, extra);
}

export function sendErrorSpec(
  ctx: RequestContext, res: ServerResponse, code: string, spec: ErrorSpec, onDone: OnDone,
  details: ErrorDetails = {}, extra: string[] = [],
): void {
  if (res.headersSent) {
    // Too late for a status: cut the connection so the client sees a failure, not a short answer.
    res.destroy();
    ctx.status = ctx.status || spec.status;
    onDone(ctx);
    return;
  }
  const body = errorBody(code, spec, ctx.id, details);
  const headers = baseHeaders(ctx, 'application/json');
  headers.push('content-length', String(Buffer.byteLength(body)));
  if (spec.retry !== null) headers.push('x-should-retry', spec.retry ? 'true' : 'false');
  if (details.retryAfterS !== undefined) headers.push('retry-after', String(Math.max(1, Math.ceil(details.retryAfterS))));
  if (spec.status === 401) headers.push('www-authenticate', 'Bearer');
  for (const value of extra) headers.push(value);
  ctx.status = spec.status;
  res.writeHead(spec.status, headers);
  res.end(body);
  onDone(ctx);
}
