import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { connect, createServer, type Server, type Socket } from 'node:net';

export const hasRedis = spawnSync('redis-server', ['--version']).status === 0;

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** A private redis-server on a free port, which a test can stop, pause and restart. */
export class RedisServer {
  private child: ChildProcess | null = null;
  port = 0;

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    if (this.port === 0) this.port = await freePort();
    this.child = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
      stdio: 'ignore',
    });
    for (let i = 0; i < 200; i++) {
      if (spawnSync('redis-cli', ['-p', String(this.port), 'ping']).stdout?.toString().trim() === 'PONG') return this;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error('redis-server did not start');
  }

  async stop(): Promise<void> {
    const child = this.child;
    if (child === null) return;
    this.child = null;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await exited;
  }

  pause(): void {
    this.child?.kill('SIGSTOP');
  }

  resume(): void {
    this.child?.kill('SIGCONT');
  }
}

/**
 * A TCP relay in front of a Redis, for faults between a client and Redis: it can drop the next
 * request or the next answer and cut the connection, or be away (cut every connection and refuse
 * new ones) until told otherwise.
 */
export class RedisRelay {
  /**
   * The next request (client to Redis) or answer (Redis to client) is dropped and its connection
   * cut; with `cutFor`, only a request holding those bytes, or the next answer after one went by
   * (whatever answer it is: the connection goes with it, so the request's answer is lost too). A
   * renewal, which the limiter sends on its own every third of a lease, then takes no cut meant for
   * a settlement (found flaky under load: it did, and the settlement went through).
   */
  cut: 'request' | 'answer' | null = null;
  cutFor: string | null = null;
  /** The request the answer's cut waits for went by. */
  private armed = false;
  private away_ = false;
  private readonly open = new Set<Socket>();
  private readonly server: Server;

  constructor(private readonly redisPort: number) {
    this.server = createServer((client: Socket) => {
      if (this.away_) return client.destroy();
      const upstream = connect(this.redisPort, '127.0.0.1');
      this.open.add(client);
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      const wanted = (d: Buffer) => this.cutFor === null || d.includes(this.cutFor);
      client.on('data', (d) => {
        if (this.cut === 'request' && wanted(d)) return this.cutNow(close);
        upstream.write(d);
        if (this.cut === 'answer' && wanted(d)) this.armed = true;
      });
      upstream.on('data', (d) => {
        if (this.cut !== 'answer' || (!this.armed && this.cutFor !== null)) return client.write(d);
        this.cutNow(close);
      });
      for (const s of [client, upstream]) {
        s.on('close', () => {
          this.open.delete(client);
          close();
        });
        s.on('error', close);
      }
    });
  }

  private cutNow(close: () => void): void {
    this.cut = null;
    this.cutFor = null;
    this.armed = false;
    close();
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${(this.server.address() as { port: number }).port}`;
  }

  /** Away: every connection cut and new ones refused; back: connections taken again. */
  set away(away: boolean) {
    this.away_ = away;
    if (away) for (const s of this.open) s.destroy();
  }

  get away(): boolean {
    return this.away_;
  }

  close(): void {
    this.server.close();
  }
}
