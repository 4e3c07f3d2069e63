import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Real clients (Claude Code, Codex, the AI SDK) for the client tests. They are large (Claude
 * Code and Codex ship hundreds of megabytes of native binary), so they are not dev dependencies:
 * the pinned versions are installed on demand into a cache outside the repo (MG_CLIENTS_DIR,
 * default <tmp>/model-gateway-clients), reused between runs. Anything that prevents installing
 * or starting one is a reason to skip, not a failure; what the client then does against the
 * gateway is the test.
 */

export const CLIENTS_DIR = process.env.MG_CLIENTS_DIR ?? join(tmpdir(), 'model-gateway-clients');
const INSTALL_TIMEOUT_MS = 10 * 60_000;

export type Installed = { bin: string } | { skip: string };
export type InstalledPackages = { dir: string } | { skip: string };

/**
 * Installs exact `specs` (`name@version`) together, once, atomically (a temp folder renamed into
 * place), and returns the folder whose node_modules holds them.
 */
export async function installPackages(specs: string[]): Promise<InstalledPackages> {
  const dir = join(CLIENTS_DIR, specs.map((spec) => spec.replace('/', '+')).join(','));
  if (existsSync(join(dir, '.installed'))) return { dir };
  try {
    await mkdir(CLIENTS_DIR, { recursive: true });
    const staging = await mkdtemp(join(CLIENTS_DIR, '.staging-'));
    try {
      await writeFile(join(staging, 'package.json'), '{"private":true}\n');
      await run('npm', ['install', '--prefix', staging, '--no-audit', '--no-fund', '--no-save', '--loglevel=error', ...specs], INSTALL_TIMEOUT_MS);
      await writeFile(join(staging, '.installed'), `${specs.join('\n')}\n`);
      // Another run may have finished first; then its copy is as good as ours.
      await rename(staging, dir).catch(() => undefined);
    } finally {
      await rm(staging, { recursive: true, force: true });
    }
  } catch (err) {
    return { skip: `${specs.join(' ')} could not be installed into ${CLIENTS_DIR}: ${(err as Error).message.split('\n')[0]}` };
  }
  return { dir };
}

/** Installs `pkg@version` once and returns its binary, checked to run and to be that version. */
export async function installClient(pkg: string, version: string, binName: string): Promise<Installed> {
  const installed = await installPackages([`${pkg}@${version}`]);
  if ('skip' in installed) return installed;
  const bin = join(installed.dir, 'node_modules', '.bin', binName);
  try {
    const out = await run(bin, ['--version'], 60_000);
    if (!out.includes(version)) return { skip: `${bin} --version printed ${JSON.stringify(out.trim())}, not ${version}` };
  } catch (err) {
    return { skip: `${bin} does not run here: ${(err as Error).message.split('\n')[0]}` };
  }
  return { bin };
}

function run(command: string, args: string[], timeout: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { timeout, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err !== null) reject(new Error(`${err.message}${stderr === '' ? '' : `: ${stderr.trim()}`}`));
      else resolve(stdout);
    });
  });
}

/**
 * A local "proxy" that refuses every connection and counts them. Clients get it as their
 * HTTP(S)_PROXY / ALL_PROXY, so whatever they still try to send off this machine (telemetry,
 * update checks, plugins) lands here instead, and a test can assert that nothing was tried.
 */
export class RefusingProxy {
  attempts = 0;
  private server: Server | undefined;

  async start(): Promise<string> {
    this.server = createServer((socket) => {
      this.attempts++;
      socket.destroy();
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    const { port } = this.server.address() as { port: number };
    return `http://127.0.0.1:${port}`;
  }

  /** The environment that sends every proxied request here and keeps loopback direct. */
  env(url: string): Record<string, string> {
    const env: Record<string, string> = {};
    for (const name of ['HTTP_PROXY', 'HTTPS_PROXY', 'ALL_PROXY']) {
      env[name] = url;
      env[name.toLowerCase()] = url;
    }
    env.NO_PROXY = env.no_proxy = '127.0.0.1,localhost';
    return env;
  }

  close(): Promise<void> {
    return new Promise((resolve) => (this.server === undefined ? resolve() : this.server.close(() => resolve())));
  }
}

export interface ClientRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs a client to completion with exactly `env` (nothing inherited but PATH: no test-runner
 * flags, no coverage hooks, no real credentials), stdin closed, and a hard time limit.
 */
export function runClient(bin: string, args: string[], env: Record<string, string>, cwd: string, timeoutMs = 180_000): Promise<ClientRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${bin} ${args.join(' ')} ran over ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}
