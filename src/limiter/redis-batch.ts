/**
 * Batches a Redis limiter's hot calls: the admissions, settlements and releases made for one
 * account in one turn of the event loop go to Redis as one call of the BATCH script of
 * redis-scripts.ts (FCALL, or EVALSHA), sent at `setImmediate`, so the requests parsed in the
 * same poll phase share it. (Holding an account's ops while its previous call is out makes
 * calls larger, but Redis's cost is per op, not per call: measured with three gateway
 * processes per limiter, 0.577x the memory limiter against 0.62-0.69x sending every turn;
 * holding back only the releases, which nothing waits for, measured worse too: they then
 * delay the calls that something waits for.) Ops of one account keep
 * their order; accounts are never mixed in one call (all of a call's keys share the account's
 * hash tag, as on Redis Cluster). All the calls sent at once share one deadline timer; a reply
 * that comes after it still reaches the ops that ask for it, and so does the news that none
 * will come (an admission Redis may have run after its request was refused gives its slot back
 * at once, not when its lease runs out).
 */

/** One op waiting for its account's batch: its own keys, its arguments (kind first), its callbacks. */
export interface BatchOp {
  readonly keys: readonly string[];
  readonly args: readonly string[];
  readonly resolve: (reply: unknown) => void;
  readonly reject: (err: Error) => void;
  /**
   * For an op that was failed without its answer (the call's deadline passed, or it failed: an
   * error, the connection lost, never sent): the reply when it came after all, else undefined
   * (Redis may have run it). An admission gives back what it may have taken, which nothing else
   * would release.
   */
  readonly late?: (reply: unknown) => void;
}

/** Sends one account's ops as one call: resolves to one reply per op, in order. */
export type SendBatch = (accountKeys: readonly string[], ops: readonly BatchOp[]) => Promise<unknown>;

/** Most ops in one script call: a larger turn is split, so one call never holds Redis long. */
const MAX_OPS_PER_CALL = 256;

/** One call's ops; `late` once its deadline failed them before Redis answered. */
interface Call {
  readonly ops: BatchOp[];
  done: boolean;
  late: boolean;
}

interface Queue {
  readonly keys: readonly string[];
  ops: BatchOp[];
}

export class BatchQueue {
  private queues = new Map<string, Queue>();
  private scheduled = false;

  constructor(
    private readonly send: SendBatch,
    private readonly timeoutMs: number,
    /** The error every op of a call gets when the call fails or misses its deadline. */
    private readonly failure: (cause: Error | null) => Error,
    /** An op that Redis answered with its own error. */
    private readonly opError: (message: string) => Error,
    /**
     * Called right after a flush is scheduled. The Redis client writes its commands at a
     * setImmediate of its own, and one scheduled during the flush (itself a setImmediate) runs
     * only after the next poll phase: work that came in meanwhile delays the batch. A command
     * sent here schedules the client's write now, after the flush, so the batch leaves in the
     * same check phase.
     */
    private readonly onSchedule: () => void = () => {},
  ) {}

  /** Queues an op of `accountId`, whose account keys are `accountKeys`; sent at the next setImmediate. */
  push(accountId: string, accountKeys: () => readonly string[], op: BatchOp): void {
    let q = this.queues.get(accountId);
    if (q === undefined) {
      q = { keys: accountKeys(), ops: [] };
      this.queues.set(accountId, q);
    }
    q.ops.push(op);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flushAll);
      this.onSchedule();
    }
  }

  /**
   * Sends the ops of one account now: a command that is not batched calls it first, so it
   * reaches Redis after the ops made before it on the same connection, as without batching.
   */
  flushAccount(accountId: string): void {
    const q = this.queues.get(accountId);
    if (q === undefined) return;
    this.queues.delete(accountId);
    this.sendAll([q]);
  }

  /** Sends everything waiting (at the end of the turn, and at close). */
  readonly flushAll = (): void => {
    this.scheduled = false;
    if (this.queues.size === 0) return;
    const queues = [...this.queues.values()];
    this.queues = new Map();
    this.sendAll(queues);
  };

  private sendAll(queues: Queue[]): void {
    const calls: Call[] = [];
    for (const q of queues) {
      for (let i = 0; i < q.ops.length; i += MAX_OPS_PER_CALL) calls.push({ ops: q.ops.slice(i, i + MAX_OPS_PER_CALL), done: false, late: false });
    }
    let open = calls.length;
    const fail = (call: Call, cause: Error | null) => {
      if (call.done) return;
      call.done = true;
      const err = this.failure(cause);
      for (const op of call.ops) op.reject(err);
    };
    // One deadline for every call sent now: a Redis that stops answering fails them all.
    const timer = setTimeout(() => {
      for (const call of calls) {
        if (!call.done) call.late = true;
        fail(call, null);
      }
    }, this.timeoutMs);
    const settled = () => {
      if (--open === 0) clearTimeout(timer);
    };
    let c = 0;
    for (const q of queues) {
      for (let i = 0; i < q.ops.length; i += MAX_OPS_PER_CALL, c++) {
        const call = calls[c]!;
        let sent: Promise<unknown>;
        try {
          sent = this.send(q.keys, call.ops);
        } catch (err) {
          sent = Promise.reject(err);
        }
        sent.then((reply) => {
          settled();
          if (call.late) this.deliverLate(call.ops, reply);
          if (call.done) return;
          call.done = true;
          this.deliver(call.ops, reply);
        }, (err: Error) => {
          settled();
          fail(call, err);
          // Failed without an answer (an error, the connection lost, or never sent), and none
          // will come: Redis may have run the call.
          this.deliverLate(call.ops, undefined);
        });
      }
    }
  }

  /**
   * A call whose ops were failed without their answers: each op that asked gets its own reply
   * when one came after the deadline, or undefined when none will (Redis may or may not have
   * run it).
   */
  private deliverLate(ops: BatchOp[], reply: unknown): void {
    const replies = Array.isArray(reply) ? reply : null;
    for (let i = 0; i < ops.length; i++) {
      const late = ops[i]!.late;
      if (late === undefined) continue;
      const r = replies === null ? undefined : replies[i];
      late(r === null ? undefined : r);
    }
  }

  private deliver(ops: BatchOp[], reply: unknown): void {
    const replies = Array.isArray(reply) ? reply : [];
    for (let i = 0; i < ops.length; i++) {
      const op = ops[i]!;
      const r = replies[i];
      if (r === undefined || r === null) op.reject(this.failure(new Error('redis limiter: a batch answered no reply for an op')));
      else if (Array.isArray(r) && r[0] === 'error') op.reject(this.opError(String(r[1])));
      else op.resolve(r);
    }
  }
}
