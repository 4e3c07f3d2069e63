import { spawn, type ChildProcess } from 'node:child_process';

export interface Spawned {
  child: ChildProcess;
  /** The base URL from the process's `"msg":"listening"` line. */
  url: string;
  stdout(): string;
  stderr(): string;
  /** Resolves with the exit code. */
  exited: Promise<number | null>;
}

/** Spawns a gateway-like process and resolves once it prints its "listening" JSON line. */
export async function spawnListening(
  command: string, args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; onSpawn?: (child: ChildProcess) => void } = {},
): Promise<Spawned> {
  const child = spawn(command, args, { env: options.env ?? process.env, cwd: options.cwd, stdio: ['ignore', 'pipe', 'pipe'] });
  options.onSpawn?.(child);
  let out = '';
  let err = '';
  child.stderr!.on('data', (d) => { err += d; });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (d) => {
      out += d;
      const m = /"msg":"listening".*?"url":"([^"]+)"/.exec(out);
      if (m !== null) resolve(m[1]!);
    });
    exited.then((code) => reject(new Error(`exited ${code} before listening: ${err}`)));
  });
  return { child, url, stdout: () => out, stderr: () => err, exited };
}
