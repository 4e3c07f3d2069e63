import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import type { Logger } from '../log.js';

/**
 * Bytes of a socket the kernel has taken so far: how a client's reading shows on this side.
 * A large write is one libuv request until it completes, so the writable length does not go
 * down while the client reads it; libuv's write-queue size does. Both numbers Node keeps are
 * internal (`_bytesDispatched`, `_handle.writeQueueSize`); without them, progress shows only
 * when a whole write completes.
 */
export function bytesTaken(socket: Socket | null): number {
  if (socket === null) return 0;
  const s = socket as Socket & { _bytesDispatched?: unknown; _handle?: { writeQueueSize?: unknown } | null };
  const queued = s._handle?.writeQueueSize;
  if (typeof s._bytesDispatched === 'number' && typeof queued === 'number') return s._bytesDispatched - queued;
  return -socket.writableLength;
}

/** Whether answer bytes wait on this side of a socket (the kernel's buffers are full). */
function backedUp(socket: Socket): boolean {
  const queued = (socket as Socket & { _handle?: { writeQueueSize?: unknown } | null })._handle?.writeQueueSize;
  return socket.writableLength > 0 || (typeof queued === 'number' && queued > 0);
}

/**
 * Answers whose client is watched by their own call (a billed call that waits for its client:
 * it cuts and charges it itself), left alone by the sweep below.
 */
export const watchedAnswers = new WeakSet<object>();

interface Stall {
  taken: number;
  since: number;
}

/**
 * Cuts connections whose client stopped reading: answer bytes have waited with no progress for
 * twice `idleMs()` (server.clientIdleTimeoutMs). A billed call watches its own client
 * (watchedAnswers); this covers every other answer, and pipelined requests whose answers a
 * client never reads, which Node holds: such a connection kept its place under maxConnections
 * for ever. Twice: progress shows only when one of Node's writes completes (see bytesTaken),
 * so a client reading a large answer steadily but slowly can show none for a while. A sweep
 * every quarter of the timeout: nothing is done per request or per write, and a connection
 * costs one entry in a set.
 */
export function cutStalledReaders(server: Server, idleMs: () => number, logger: Logger): void {
  const sockets = new Set<Socket>();
  const stalls = new Map<Socket, Stall>();
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.once('close', () => {
      sockets.delete(socket);
      stalls.delete(socket);
    });
  });
  let timer: NodeJS.Timeout | null = null;
  const sweep = () => {
    const ms = idleMs();
    try {
      const now = Date.now();
      let cut = 0;
      for (const socket of sockets) {
        const answer = (socket as Socket & { _httpMessage?: object | null })._httpMessage;
        if (!backedUp(socket) || (answer != null && watchedAnswers.has(answer))) {
          stalls.delete(socket);
          continue;
        }
        const taken = bytesTaken(socket);
        const stall = stalls.get(socket);
        if (stall === undefined || stall.taken !== taken) stalls.set(socket, { taken, since: now });
        else if (now - stall.since >= 2 * ms) {
          stalls.delete(socket);
          socket.destroy();
          cut++;
        }
      }
      if (cut > 0) logger.warn('cut connections whose clients read nothing', { connections: cut, idle_ms: 2 * ms });
    } catch {
      // Nothing here may take the server down (a logger that throws, say): the next sweep tries again.
    } finally {
      timer = setTimeout(sweep, Math.max(100, Math.min(30_000, Math.floor(ms / 4))));
      timer.unref();
    }
  };
  server.once('listening', sweep);
  server.once('close', () => {
    if (timer !== null) clearTimeout(timer);
  });
}
