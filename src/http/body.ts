import type { IncomingMessage } from 'node:http';

export type BodyResult = { ok: true; body: Buffer } | { ok: false; reason: 'too_large' | 'aborted' };

/**
 * Reads a request body, enforcing the size limit while reading: a declared Content-Length
 * over the limit is refused before a byte is read, and a body that grows past it stops being
 * buffered at once. Calls `then` exactly once. A callback, not a promise, and its listeners
 * stay (each ignores what comes after the result): this runs for every model call.
 */
export function readBody(req: IncomingMessage, maxBytes: number, then: (result: BodyResult) => void): void {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > maxBytes) return then({ ok: false, reason: 'too_large' });
  const chunks: Buffer[] = [];
  let size = 0;
  let settled = false;
  const done = (result: BodyResult) => {
    if (settled) return;
    settled = true;
    then(result);
  };
  req.on('data', (chunk: Buffer) => {
    if (settled) return;
    size += chunk.length;
    if (size > maxBytes) {
      req.pause();
      return done({ ok: false, reason: 'too_large' });
    }
    chunks.push(chunk);
  });
  req.on('end', () => done({ ok: true, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size) }));
  // A client gone mid-body: 'close' before 'end'. (A request emits 'error' only to listeners
  // of it, so none is added: one listener less per call.)
  req.on('close', () => {
    if (!req.complete) done({ ok: false, reason: 'aborted' });
  });
}

/** The same as a promise (for the admin API, which is not a hot path). */
export function readBodyAsync(req: IncomingMessage, maxBytes: number): Promise<BodyResult> {
  return new Promise((resolve) => readBody(req, maxBytes, resolve));
}
