import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/**
 * A pipelined answer waits behind the ones before it on its connection with no socket of its
 * own, and Node never closes it if the connection dies meanwhile: whatever it holds (a
 * concurrency slot, an Idempotency-Key) is given back by the connection's own close instead.
 */

/**
 * The pipelined answers waiting on each connection: one 'close' listener a connection, however
 * many wait (found in review: one each, Node warned of a leak past ten).
 */
const waitingOn = new WeakMap<Socket, Set<() => void>>();

/** Runs `close` when the connection closes, unless `noLongerWaiting` came first. */
export function whenConnectionCloses(socket: Socket, close: () => void): void {
  let waiting = waitingOn.get(socket);
  if (waiting === undefined) {
    const calls = new Set<() => void>();
    waitingOn.set(socket, calls);
    socket.once('close', () => {
      waitingOn.delete(socket);
      for (const call of calls) call();
    });
    waiting = calls;
  }
  waiting.add(close);
}

/** The answer closed by itself: the connection's close has nothing left to do for it. */
export function noLongerWaiting(socket: Socket, close: () => void): void {
  waitingOn.get(socket)?.delete(close);
}

/**
 * Runs `release` once: when the answer closes or, for a pipelined answer still waiting behind
 * another, when its connection does; at once if either is gone already (then false: the client
 * left, nothing is to be answered).
 */
export function releaseWhenClosed(req: IncomingMessage, res: ServerResponse, release: () => void): boolean {
  const queued = res.socket === null ? req.socket : null;
  let held = true;
  const once = () => {
    if (!held) return;
    held = false;
    if (queued !== null) noLongerWaiting(queued, once);
    release();
  };
  if (res.closed || queued?.destroyed === true) {
    once();
    return false;
  }
  res.once('close', once);
  if (queued !== null) whenConnectionCloses(queued, once);
  return true;
}
