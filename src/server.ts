import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { ERRORS, errorBody, type ErrorCode } from './errors.js';
import type { Gateway } from './gateway.js';
import { newRequestId } from './http/context.js';
import { cutStalledReaders } from './http/slow-readers.js';

/**
 * A node:http server around a gateway: timeouts and a connection bound from the config, and
 * every answer the gateway's own, in the contract's envelope with a request id: malformed
 * requests, timeouts, a missing Host and an unsupported Expect included (Node would answer
 * those bare).
 */
export function createGatewayServer(gateway: Gateway): Server {
  const { requestTimeoutMs, headersTimeoutMs, maxConnections } = gateway.config.server;
  const headersTimeout = Math.min(headersTimeoutMs, requestTimeoutMs);
  const server = createServer({
    requestTimeout: requestTimeoutMs,
    headersTimeout,
    // Node enforces both timeouts by a sweep over all connections, every 30 s by default: a
    // slow client would keep its connection for up to 30 s past its timeout. Every second
    // (at most half the shorter timeout) it costs little and keeps the timeouts honest.
    connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(headersTimeout / 2))),
    keepAliveTimeout: 65_000, // longer than common load balancers' idle timeout (60 s)
    requireHostHeader: false, // the gateway answers a missing Host itself (gateway.ts)
  }, gateway.handle);
  server.maxConnections = maxConnections;
  cutStalledReaders(server, () => gateway.config.server.clientIdleTimeoutMs, gateway.logger);
  server.on('checkExpectation', gateway.expectationFailed);
  server.on('checkContinue', gateway.handleContinue);
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
    // An answer under way on this connection (a malformed request pipelined after it, or a
    // body never finished after it): nothing may be written into it, as Node's own handler does.
    // (One already ended is sent whole first: the 400 follows it.)
    const current = (socket as Socket & { _httpMessage?: { headersSent?: boolean; writableEnded?: boolean } | null })._httpMessage;
    if (!socket.writable || err.code === 'ECONNRESET' || (current?.headersSent === true && current.writableEnded !== true)) {
      socket.destroy();
      return;
    }
    // As Node itself would answer: 408, 431 for headers over its limit (16 KB), else 400.
    const code: ErrorCode = err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 'request_timeout'
      : err.code === 'HPE_HEADER_OVERFLOW' ? 'headers_too_large' : 'invalid_request';
    const spec = ERRORS[code];
    const id = newRequestId();
    const body = errorBody(code, spec, id, { message: code === 'invalid_request' ? 'Malformed HTTP request.' : spec.message });
    const retry = spec.retry === null ? '' : `x-should-retry: ${spec.retry}\r\n`;
    socket.end(
      `HTTP/1.1 ${spec.status} ${STATUS_TEXT[code as keyof typeof STATUS_TEXT] ?? 'Bad Request'}\r\n` +
      `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nx-request-id: ${id}\r\n${retry}` +
      `connection: close\r\n\r\n${body}`,
    );
    // Half-closed by end(): a client that never closes its side would keep the connection (and
    // a place under maxConnections) for ever. A second is enough to read the answer.
    const gone = setTimeout(() => socket.destroy(), 1000);
    gone.unref();
    socket.once('close', () => clearTimeout(gone));
    // Counted and logged like any request (found in review: malformed, timed-out and oversized
    // requests were in neither), though nothing of it can be trusted: no method, no path. A
    // request whose handler runs (one that timed out reading its body) writes its own line.
    if (current === null || current === undefined || current.writableEnded === true) {
      gateway.metrics.request('unmatched', spec.status, 0);
      gateway.logger.access(id, '-', '-', spec.status, 0, null);
    }
  });
  return server;
}

/** Listens and resolves with the base URL (`--port 0` picks a free port). */
export function listen(server: Server, port: number, host: string): Promise<string> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.removeListener('error', reject);
      const address = server.address() as AddressInfo;
      const shown = address.family === 'IPv6' ? `[${address.address}]` : address.address;
      resolve(`http://${shown}:${address.port}`);
    });
  });
}

const STATUS_TEXT = { request_timeout: 'Request Timeout', headers_too_large: 'Request Header Fields Too Large' } as const;
