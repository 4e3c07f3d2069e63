import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { KeyEntry } from '../directory.js';

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
/** A random per-process prefix plus a counter: unique across instances, far cheaper than a UUID. */
const ID_PREFIX = `req_${randomBytes(6).toString('hex')}`;
let idCounter = 0;

export function newRequestId(): string {
  return `${ID_PREFIX}${(++idCounter).toString(36).padStart(6, '0')}`;
}

/**
 * What the gateway knows about one request: its id, path, the headers it cares about (read
 * in one pass over rawHeaders, which is cheaper than building `req.headers`), and what
 * authentication found. One allocation per request.
 */
export class RequestContext {
  readonly id: string;
  readonly method: string;
  readonly path: string;
  readonly query: string;
  readonly startMs: number;
  /** The API key presented, '' when none, null when the two forms conflict. */
  readonly apiKey: string | null;
  /** The raw `Idempotency-Key` header, or undefined when absent. */
  readonly idempotencyKey: string | undefined;
  key: KeyEntry | null = null;
  status = 0;
  /** Add `request-id` too (the header the Anthropic SDK reads). */
  anthropic = false;
  /** Ask the client to close the connection after this response (draining, unread body). */
  closeConnection = false;
  /**
   * The request announced a body no handler has taken to read: any answer then closes the
   * connection, which Node would otherwise keep, draining the body for up to `requestTimeoutMs`
   * and then answering the same request again, 408 (found in review). A handler that reads the
   * body sets it false.
   */
  unreadBody = false;
  /** The path parameter of a pattern route (`/v1/models/{id}`). */
  param = '';
  /** Set once the access log line is written. */
  logged = false;
  /** Request fields a translation left out (the log line's `dropped`), or null. */
  dropped: string | null = null;
  /** The matched route's pattern, for metrics. */
  route = 'unmatched';
  /** How many Host headers the request has (HTTP/1.1 requires exactly one). */
  readonly hosts: number;

  constructor(req: IncomingMessage, startMs: number) {
    this.startMs = startMs;
    this.method = req.method ?? 'GET';
    let url = req.url ?? '/';
    // The absolute form (`GET http://host/v1/models`, which proxies send), read as its path.
    if (url.charCodeAt(0) !== 47 /* / */) url = pathOfAbsolute(url);
    const q = url.indexOf('?');
    this.path = q === -1 ? url : url.slice(0, q);
    this.query = q === -1 ? '' : url.slice(q + 1);

    let requestId: string | undefined;
    let apiKeyHeader: string | undefined;
    let authorization: string | undefined;
    let idempotencyKey: string | undefined;
    let conflict = false;
    let hosts = 0;
    let unreadBody = false;
    const raw = req.rawHeaders;
    // Hot path: compare lengths first so most header names are skipped, then the usual
    // spellings, so a name is lowercased only when it is written unusually.
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!;
      switch (name.length) {
        case 4:
          if (name === 'host' || name === 'Host' || name.toLowerCase() === 'host') hosts++;
          break;
        case 9:
          if (name === 'x-api-key' || name === 'X-Api-Key' || name.toLowerCase() === 'x-api-key') {
            if (apiKeyHeader !== undefined && apiKeyHeader !== raw[i + 1]) conflict = true;
            apiKeyHeader = raw[i + 1];
          }
          break;
        case 12:
          if (name === 'x-request-id' || name === 'X-Request-Id' || name.toLowerCase() === 'x-request-id') requestId = raw[i + 1];
          break;
        case 13:
          if (name === 'authorization' || name === 'Authorization' || name.toLowerCase() === 'authorization') {
            if (authorization !== undefined && authorization !== raw[i + 1]) conflict = true;
            authorization = raw[i + 1];
          }
          break;
        // (The first letter rules out the SDKs' other names of these lengths, x-stainless-os and
        // anthropic-version, before any lowercasing.)
        case 14:
          if ((name === 'content-length' || name === 'Content-Length' || ((name.charCodeAt(0) | 0x20) === 99 && name.toLowerCase() === 'content-length')) &&
            Number(raw[i + 1]) !== 0) unreadBody = true;
          break;
        case 17:
          if (name === 'transfer-encoding' || name === 'Transfer-Encoding' || ((name.charCodeAt(0) | 0x20) === 116 && name.toLowerCase() === 'transfer-encoding')) {
            unreadBody = true;
          }
          break;
        case 15:
          if (name === 'idempotency-key' || name === 'Idempotency-Key' || name.toLowerCase() === 'idempotency-key') {
            // Two different values: neither is the key (a proxy in front may go by the first,
            // the gateway went by the last: found in review). '' is refused as invalid.
            idempotencyKey = idempotencyKey !== undefined && idempotencyKey !== raw[i + 1] ? '' : raw[i + 1];
          }
          break;
      }
    }
    this.hosts = hosts;
    this.unreadBody = unreadBody;
    this.id = requestId !== undefined && REQUEST_ID.test(requestId) ? requestId : newRequestId();
    this.idempotencyKey = idempotencyKey;
    this.apiKey = conflict ? null : pickKey(apiKeyHeader, authorization);
  }
}

/** CONTRACT section 3: either form; another scheme or an empty Bearer counts as none; differing values conflict. */
function pickKey(apiKeyHeader: string | undefined, authorization: string | undefined): string | null {
  const fromHeader = apiKeyHeader === undefined ? '' : apiKeyHeader.trim();
  let fromBearer = '';
  if (authorization !== undefined && authorization.length > 7 &&
    (authorization.startsWith('Bearer ') || authorization.slice(0, 7).toLowerCase() === 'bearer ')) {
    fromBearer = authorization.slice(7).trim();
  }
  if (fromHeader !== '' && fromBearer !== '' && fromHeader !== fromBearer) return null;
  return fromHeader !== '' ? fromHeader : fromBearer;
}

/** Visible ASCII (0x21-0x7E), 1 to 255 characters. */
export function validIdempotencyKey(value: string): boolean {
  if (value.length === 0 || value.length > 255) return false;
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

/** The path and query of an absolute-form request target (`http://host:port/path?q`); others unchanged. */
function pathOfAbsolute(url: string): string {
  const scheme = /^https?:\/\/[^/?#]*/i.exec(url);
  if (scheme === null) return url;
  const rest = url.slice(scheme[0].length);
  return rest === '' || rest.charCodeAt(0) !== 47 ? `/${rest}` : rest;
}
