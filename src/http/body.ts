import type { IncomingMessage, ServerResponse } from 'node:http';
import type { RequestContext } from './context.js';
import { releaseWhenClosed } from './pipelined.js';

export type BodyResult = { ok: true; body: Buffer } | { ok: false; reason: 'too_large' | 'fragmented' | 'busy' | 'aborted' };

/**
 * The most pieces a body may come in. Node hands each chunk of a chunked body to JavaScript as
 * a Buffer of its own: 4 MB sent a byte a chunk (4 million pieces) took 10 s of CPU and 1.6 GB
 * of memory before admission, and a few such requests ended the process (found in review). A
 * real client's body comes in a few pieces per 64 KB.
 */
export const MAX_BODY_PIECES = 65_536;
/** Pieces under this size are copied together, 64 at a time, so a body held costs about its size. */
const SMALL_PIECE = 4096;
const SMALL_RUN = 64;

/**
 * The bytes of request bodies being read, before admission: at most 16 bodies' worth
 * (`maxBodyBytes`) for one account, and 256 in all. A body is read before any limit is checked
 * (the contract's order), so without this one key's connections, each sending a body just under
 * the limit and then nothing until the request timeout, could hold 10,000 x 4 MiB (found in
 * review); counted by account, not by key, as an account's many keys could otherwise take all.
 */
export class BodyBudget {
  private total = 0;
  private readonly byAccount = new Map<string, number>();

  constructor(private readonly maxBodyBytes: () => number) {}

  /** Takes `bytes` for a body of `key` (an account); false (nothing taken) when that would pass a bound. */
  take(key: string, bytes: number): boolean {
    const max = this.maxBodyBytes();
    const mine = this.byAccount.get(key) ?? 0;
    if (mine + bytes > 16 * max || this.total + bytes > 256 * max) return false;
    this.byAccount.set(key, mine + bytes);
    this.total += bytes;
    return true;
  }

  give(key: string, bytes: number): void {
    const left = (this.byAccount.get(key) ?? 0) - bytes;
    if (left > 0) this.byAccount.set(key, left);
    else this.byAccount.delete(key);
    this.total -= bytes;
  }

  /** Bytes held now, in all: for tests. */
  get held(): number {
    return this.total;
  }
}

/**
 * Reads a request body, enforcing the size limit while reading: a declared Content-Length
 * over the limit is refused before a byte is read, and a body that grows past it (or past
 * MAX_BODY_PIECES pieces, or past its account's share of `bodies`, `key` naming the account)
 * stops being buffered at once; a body read whole gives its share back at once, or, with
 * `keepUntilClosed`, when that answer closes. Calls `then` exactly once. A callback, not a
 * promise, and its listeners stay (each ignores what comes after the result): this runs for
 * every model call.
 */
export function readBody(
  req: IncomingMessage, maxBytes: number, then: (result: BodyResult) => void, bodies?: BodyBudget, key = '', keepUntilClosed?: ServerResponse,
): void {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > maxBytes) return then({ ok: false, reason: 'too_large' });
  const chunks: Buffer[] = [];
  let size = 0;
  let pieces = 0;
  // Small pieces not yet copied together, and their bytes.
  let small: Buffer[] | null = null;
  let smallBytes = 0;
  const joinSmall = () => {
    chunks.push(small!.length === 1 ? small![0]! : Buffer.concat(small!, smallBytes));
    small = null;
    smallBytes = 0;
  };
  let settled = false;
  const done = (result: BodyResult) => {
    if (settled) return;
    settled = true;
    if (bodies !== undefined && size > 0) {
      // Kept until the answer closes (a pipelined one's connection, if it waits), for a caller
      // that holds the body that long with no slot: count_tokens.
      const taken = size;
      if (result.ok && keepUntilClosed !== undefined) releaseWhenClosed(req, keepUntilClosed, () => bodies.give(key, taken));
      else bodies.give(key, size);
    }
    then(result);
  };
  req.on('data', (chunk: Buffer) => {
    if (settled) return;
    // The body's own faults first: a body that cannot pass is never told to retry (found in review).
    const problem = size + chunk.length > maxBytes ? 'too_large' : ++pieces > MAX_BODY_PIECES ? 'fragmented'
      : bodies !== undefined && !bodies.take(key, chunk.length) ? 'busy' : null;
    if (problem !== null) {
      req.pause();
      return done({ ok: false, reason: problem });
    }
    size += chunk.length; // taken from `bodies`, given back whole at the end
    // Most bodies come in one piece: kept as it is, as large ones are.
    if (chunk.length >= SMALL_PIECE || pieces === 1) {
      if (small !== null) joinSmall();
      chunks.push(chunk);
      return;
    }
    (small ??= []).push(chunk);
    smallBytes += chunk.length;
    if (small.length === SMALL_RUN) joinSmall();
  });
  req.on('end', () => {
    if (small !== null) joinSmall();
    done({ ok: true, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size) });
  });
  // A client gone mid-body: 'close' before 'end'. (A request emits 'error' only to listeners
  // of it, so none is added: one listener less per call.)
  req.on('close', () => {
    if (!req.complete) done({ ok: false, reason: 'aborted' });
  });
}

/** The answer to a body refused while it was read (its connection is then closed: the rest is not read). */
export function bodyRefusal(reason: 'too_large' | 'fragmented' | 'busy', maxBytes: number): {
  code: 'payload_too_large' | 'invalid_request' | 'concurrency_limit_exceeded'; message: string; retryAfterS?: number;
} {
  switch (reason) {
    case 'too_large': return { code: 'payload_too_large', message: `The request body is larger than ${maxBytes} bytes.` };
    case 'fragmented': return { code: 'invalid_request', message: `The request body came in more than ${MAX_BODY_PIECES} pieces; send it in fewer, larger chunks.` };
    case 'busy': return { code: 'concurrency_limit_exceeded', message: 'Too many request bodies are being received or held for this account, or in all; retry shortly.', retryAfterS: 1 };
  }
}

/** A request whose client waits for `100 Continue` before it sends its body. */
export type ContinueRequest = IncomingMessage & { continueWanted?: boolean };

/**
 * A handler begins to read the request's body: the connection may then be kept, and a client
 * waiting for `100 Continue` is told to send it now, unless it declared one over the limit
 * (answered 413 unread). Not before: a request refused first never asks for a body it drops
 * (found in review).
 */
export function takeBody(ctx: RequestContext, req: IncomingMessage, res: ServerResponse, maxBytes: number): void {
  ctx.unreadBody = false;
  if ((req as ContinueRequest).continueWanted !== true) return;
  const declared = req.headers['content-length'];
  if (declared === undefined || Number(declared) <= maxBytes) res.writeContinue();
}

/** The same as a promise (for the admin API, which is not a hot path). */
export function readBodyAsync(req: IncomingMessage, maxBytes: number): Promise<BodyResult> {
  return new Promise((resolve) => readBody(req, maxBytes, resolve));
}
