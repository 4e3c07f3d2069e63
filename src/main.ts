#!/usr/bin/env node
import { hash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { DEMO_KEY, demoConfig } from './config/demo.js';
import { loadConfigFile } from './config/load.js';
import type { GatewayConfig } from './config/types.js';
import { validateConfig, type ValidateResult } from './config/validate.js';
import { startGateway, type EmbeddedGateway } from './create.js';
import { LedgerCorruptError } from './ledger/file.js';
import { importFileLedger } from './ledger/import.js';
import { PostgresLedger } from './ledger/postgres.js';
import { LedgerLockedError } from './ledger/lock.js';
import { Logger } from './log.js';

const USAGE = `Usage:
  model-gateway [--config FILE] [--host HOST] [--port PORT]   start the gateway (no config: the demo)
  model-gateway hash-key KEY                                  print the SHA-256 of KEY (for keys.*.sha256)
  model-gateway new-key                                       print a fresh random key and its SHA-256
  model-gateway check-config FILE                             validate a config file
  model-gateway import-ledger DIR --config FILE               copy a file ledger's books into the config's PostgreSQL ledger
Environment: MODEL_GATEWAY_CONFIG, HOST, PORT (flags win).`;

interface StartOptions {
  config?: string;
  host?: string;
  port?: number;
}

function fail(message: string): never {
  process.stderr.write(`${message}\n`);
  process.exit(1);
}

function parseStart(args: string[]): StartOptions {
  const options: StartOptions = {};
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    const eq = arg.indexOf('=');
    const name = arg.startsWith('--') && eq !== -1 ? arg.slice(0, eq) : arg;
    const value = () => {
      if (eq !== -1 && arg.startsWith('--')) return arg.slice(eq + 1);
      const next = args[++i];
      if (next === undefined) fail(`${name} needs a value\n\n${USAGE}`);
      return next;
    };
    switch (name) {
      case '--config': options.config = value(); break;
      case '--host': options.host = value(); break;
      case '--port': options.port = parsePort(value(), '--port'); break;
      case '--help': case '-h': process.stdout.write(`${USAGE}\n`); process.exit(0);
      default: fail(`unknown argument ${JSON.stringify(arg)}\n\n${USAGE}`);
    }
  }
  return options;
}

function parsePort(text: string, from: string): number {
  const port = Number(text);
  if (!/^\d+$/.test(text) || port > 65535) fail(`${from}: not a port number: ${JSON.stringify(text)}`);
  return port;
}

function report(result: ValidateResult, source: string): GatewayConfig {
  if (!result.ok) fail(`invalid config ${source}:\n${result.errors.map((e) => `  ${e}`).join('\n')}`);
  return result.config;
}

/**
 * Whether V8's young generation may grow (V8's default growth factor is 2). Every object built
 * while a config is loaded survives, which makes V8 grow the young generation to its maximum,
 * and it stays that size until V8's memory reducer runs, long after: with 10,000 accounts,
 * 25 MB more RSS under any later load (bench/MORE.md). So it is held while the gateway is
 * built, and may grow again with traffic afterwards. Nothing should be `require`d while it is
 * held: with a V8 flag changed, Node compiles built-in modules without their code cache.
 */
function youngGenerationMayGrow(grow: boolean): void {
  setFlagsFromString(`--semi-space-growth-factor=${grow ? 2 : 1}`);
}

/**
 * Signals while the gateway starts: SIGHUP is remembered (`reloadAsked`, for the caller to
 * reload once started), SIGTERM and SIGINT stop the start (exit 0: nothing was served).
 * `done()` hands the signals over to the caller's handlers.
 */
function startupSignals(logger: Logger): { done(): void; readonly reloadAsked: boolean } {
  const state = {
    reloadAsked: false,
    done() {
      process.off('SIGHUP', hup);
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
    },
  };
  const hup = () => {
    state.reloadAsked = true;
    logger.info('SIGHUP during start-up: the config is reloaded once started');
  };
  const stop = (signal: NodeJS.Signals) => {
    logger.info('stopped during start-up', { signal });
    process.exit(0); // the exit handler flushes the log
  };
  process.on('SIGHUP', hup);
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  return state;
}

async function start(options: StartOptions): Promise<void> {
  // Log lines go to file descriptor 1 from the thread pool (src/log-output.ts). process.stdout
  // is created only for what it does to a pipe: it makes the pipe non-blocking, so a pool thread
  // never blocks on a reader that stopped (it gets EAGAIN and tries again later), and a blocked
  // thread cannot hold the process's exit. A closed stdout (EPIPE) must not crash the gateway.
  process.stdout.on('error', () => {});
  const file = options.config ?? process.env.MODEL_GATEWAY_CONFIG;
  const demo = file === undefined || file === '';
  const adminKey = process.env.MODEL_GATEWAY_ADMIN_KEY;
  const envPort = process.env.PORT;
  const portFromEnv = envPort !== undefined && envPort !== '' ? parsePort(envPort, 'PORT') : undefined;
  youngGenerationMayGrow(false);
  let config: GatewayConfig;
  let logger: Logger;
  let embedded: EmbeddedGateway;
  let early: ReturnType<typeof startupSignals>;
  try {
    const result = demo ? validateConfig(demoConfig(), { baseDir: process.cwd(), env: process.env }) : loadConfigFile(file);
    config = report(result, demo ? '(embedded demo)' : file);
    logger = new Logger(undefined, config.server.logLevel, { bufferBytes: config.server.logBufferBytes });
    const atExit = logger;
    process.on('exit', () => atExit.flushSync());
    if (result.ok) for (const warning of result.warnings) logger.warn(warning);
    // Start-up can take seconds (Redis, a PostgreSQL migration waiting its turn): a signal then
    // must not take the default action (SIGHUP would kill the process). A reload waits for the
    // gateway; a stop has nothing to drain yet, and exits at once.
    early = startupSignals(logger);
    try {
      embedded = await startGateway(config, { logger, ...(adminKey ? { adminKey } : {}) });
      early.done();
    } catch (err) {
      fail(err instanceof LedgerCorruptError || err instanceof LedgerLockedError ? `ledger.dir: ${err.message}` : (err as Error).message);
    }
  } finally {
    youngGenerationMayGrow(true);
  }
  // An empty HOST or --host is unset, as PORT is (found in review: it bound every interface,
  // which the config itself refuses).
  const envHost = process.env.HOST;
  const host = options.host || (envHost !== undefined && envHost !== '' ? envHost : config.server.host);
  const port = options.port ?? portFromEnv ?? config.server.port;
  const gateway = embedded.gateway;
  if (adminKey) logger.info('admin API enabled', { path: '/admin/v1/', kept_in: gateway.admin.where });
  // Signals are handled before the "listening" line: a supervisor may signal the moment it reads it.
  const reload = () => {
    if (demo) return logger.warn('SIGHUP ignored: the demo configuration has no file to reload');
    youngGenerationMayGrow(false);
    let next: ValidateResult;
    try {
      next = loadConfigFile(file);
    } catch (err) {
      youngGenerationMayGrow(true);
      throw err;
    }
    if (!next.ok) {
      youngGenerationMayGrow(true);
      return logger.error('config reload rejected; keeping the running config', { problems: next.errors });
    }
    const loaded = next.config;
    // Against what the process started with (the running server, limiter, ledger and logger),
    // not the last reload: a change not yet in effect is named at every reload.
    const restartOnly = [
      ...(['limiter', 'ledger'] as const).filter((section) => JSON.stringify(loaded[section]) !== JSON.stringify(config[section])),
      ...RESTART_SERVER_FIELDS.filter((f) => JSON.stringify(loaded.server[f]) !== JSON.stringify(config.server[f])).map((f) => `server.${f}`),
    ];
    // Applied in turn with admin changes (one queue); the young generation is held until the
    // new config is built.
    gateway.reload(loaded).then((problems) => {
      youngGenerationMayGrow(true);
      if (problems.length > 0) return logger.error('config reload rejected: admin changes do not fit it; keeping the running config', { problems });
      logger.info('config reloaded', { config: resolve(file) });
      if (restartOnly.length > 0) logger.warn('changes to these sections apply only after a restart', { sections: restartOnly });
    }, (err: unknown) => {
      youngGenerationMayGrow(true);
      logger.error('config reload failed; keeping the running config', { error: String(err) });
    });
  };
  process.on('SIGHUP', reload);
  if (early.reloadAsked) reload();
  let stopping = false;
  const drain = (signal: string) => {
    if (stopping) return;
    stopping = true;
    const { drainDelayMs, drainTimeoutMs } = gateway.config.server;
    logger.info('draining', { signal, drain_delay_ms: drainDelayMs, drain_timeout_ms: drainTimeoutMs });
    embedded.close().then(async () => {
      logger.info('stopped');
      await logger.flush();
      process.exit(0);
    }, async (err: unknown) => {
      logger.error('error while stopping', { error: String(err) });
      await logger.flush();
      process.exit(1);
    });
  };
  process.on('SIGTERM', () => drain('SIGTERM'));
  process.on('SIGINT', () => drain('SIGINT'));
  let url: string;
  try {
    url = await embedded.listen(port, host);
  } catch (err) {
    fail(`cannot listen on ${host}:${port}: ${(err as Error).message}`);
  }
  logger.info('listening', { url, config: demo ? 'demo' : resolve(file) });
  void logger.flush();
  if (demo) printDemoBanner(url);
}

function printDemoBanner(url: string): void {
  const base = url.replace('://0.0.0.0:', '://127.0.0.1:').replace('://[::]:', '://[::1]:');
  process.stderr.write(`
  Model Gateway is running the embedded demo configuration (in-memory state, mock models).

  Demo API key:  ${DEMO_KEY}

  List the models this key may use:
    curl -s ${base}/v1/models -H "Authorization: Bearer ${DEMO_KEY}"

  Chat with the echo model:
    curl -s ${base}/v1/chat/completions -H "Authorization: Bearer ${DEMO_KEY}" -H "content-type: application/json" -d '{"model":"echo-1","messages":[{"role":"user","content":"Hello, gateway"}]}'

  Run with your own config:  node dist/main.js --config FILE   (see README.md)

`);
}

/**
 * Copies a file ledger's books (stopped: its lock is taken) into the PostgreSQL ledger the config
 * names, so a fleet moving to PostgreSQL keeps its balances, spend and history. Safe to run again.
 */
async function importLedger(args: string[]): Promise<void> {
  const options = parseStart(args.filter((a, i) => i !== 0 || a.startsWith('--')));
  const dir = args[0];
  if (dir === undefined || dir.startsWith('--')) fail(`import-ledger needs the file ledger's DIR\n\n${USAGE}`);
  if (!existsSync(dir)) fail(`import-ledger: ${dir} does not exist`);
  const file = options.config ?? process.env.MODEL_GATEWAY_CONFIG;
  if (file === undefined) fail(`import-ledger needs --config FILE (the config whose ledger is PostgreSQL)\n\n${USAGE}`);
  const result = loadConfigFile(file);
  if (!result.ok) fail(`invalid config ${file}:\n${result.errors.map((e) => `  ${e}`).join('\n')}`);
  const ledger = result.config.ledger;
  if (ledger.store !== 'postgres') fail(`import-ledger copies into PostgreSQL: ${file} has ledger.store "${ledger.store}"`);
  const logger = new Logger();
  const target = await PostgresLedger.open({ url: ledger.url, schema: ledger.schema, logger });
  let done;
  try {
    done = await importFileLedger(resolve(dir), target, logger);
  } finally {
    await target.close();
  }
  process.stderr.write(`imported ${done.imported} entries from ${dir} into PostgreSQL (schema "${ledger.schema}"); ${done.refused} refused\n`);
  if (done.refused > 0) process.exitCode = 1;
}

/** The `server` fields read once, when the server and its logger are made: changed, they apply at the next start. */
const RESTART_SERVER_FIELDS = ['host', 'port', 'requestTimeoutMs', 'headersTimeoutMs', 'maxConnections', 'logLevel', 'logBufferBytes'] as const;

function main(argv: string[]): void {
  const [command, ...rest] = argv;
  switch (command) {
    case 'hash-key':
      if (rest.length !== 1 || rest[0] === '') fail(`hash-key needs exactly one KEY\n\n${USAGE}`);
      process.stdout.write(`${hash('sha256', rest[0]!)}\n`);
      return;
    case 'new-key': {
      const key = `sk-mg-${randomBytes(24).toString('base64url')}`;
      process.stdout.write(`key:    ${key}\nsha256: ${hash('sha256', key)}\n`);
      return;
    }
    case 'check-config': {
      if (rest.length !== 1) fail(`check-config needs exactly one FILE\n\n${USAGE}`);
      const result = loadConfigFile(rest[0]!);
      if (!result.ok) fail(`invalid config ${rest[0]}:\n${result.errors.map((e) => `  ${e}`).join('\n')}`);
      for (const warning of result.warnings) process.stderr.write(`warning: ${warning}\n`);
      process.stdout.write(`ok: ${rest[0]} is a valid config\n`);
      return;
    }
    case 'import-ledger':
      importLedger(rest).catch((err: unknown) => fail(`import-ledger failed: ${(err as Error).message}`));
      return;
    default:
      start(parseStart(argv)).catch((err: unknown) => fail(`fatal: ${(err as Error).stack ?? String(err)}`));
  }
}

main(process.argv.slice(2));
