import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { ERRORS, errorBody, type ErrorCode } from './errors.js';
import type { Gateway } from './gateway.js';
import { newRequestId } from './http/context.js';

/**
 * A node:http server around a gateway: timeouts from the config, and malformed requests
 * answered in the contract's envelope (with a request id) instead of Node's bare 400.
 */
export function createGatewayServer(gateway: Gateway): Server {
  const { requestTimeoutMs } = gateway.config.server;
  const server = createServer({
    requestTimeout: requestTimeoutMs,
    headersTimeout: Math.min(requestTimeoutMs, 60_000),
    keepAliveTimeout: 65_000, // longer than common load balancers' idle timeout (60 s)
  }, gateway.handle);
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
    if (!socket.writable || err.code === 'ECONNRESET') {
      socket.destroy();
      return;
    }
    const code: ErrorCode = err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 'request_timeout' : 'invalid_request';
    const spec = ERRORS[code];
    const id = newRequestId();
    const body = errorBody(code, spec, id, { message: code === 'request_timeout' ? spec.message : 'Malformed HTTP request.' });
    const retry = spec.retry === null ? '' : `x-should-retry: ${spec.retry}\r\n`;
    socket.end(
      `HTTP/1.1 ${spec.status} ${code === 'request_timeout' ? 'Request Timeout' : 'Bad Request'}\r\n` +
      `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nx-request-id: ${id}\r\n${retry}` +
      `connection: close\r\n\r\n${body}`,
    );
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
