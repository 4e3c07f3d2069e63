/**
 * A diagnostic target (`npm run bench -- --nolog`): the built gateway (dist/) through its public
 * API, exactly as dist/main.js serves it, except that the logger's level is "warn", so no
 * access-log line is built or written. Compared with the normal gateway it shows what the
 * access log costs per request.
 *
 *   node bench/gateway-nolog.ts --config FILE   (with --import tsx)
 */
import { Gateway, Logger, createGatewayServer, listen, loadConfigFile } from '../dist/index.js';
import { parseFlags, str } from './cli.js';

const flags = parseFlags('gateway-nolog.ts', {
  config: str({ default: '', arg: 'FILE', help: "the gateway's config file" }),
}, { check: (f) => (f.config === '' ? '--config is required' : null) });
const loaded = loadConfigFile(flags.config);
if (!loaded.ok) {
  process.stderr.write(`invalid config: ${loaded.errors.join('; ')}\n`);
  process.exit(1);
}
const gateway = new Gateway(loaded.config, { logger: new Logger(undefined, 'warn') });
const server = createGatewayServer(gateway);
listen(server, 0, '127.0.0.1').then((url) => {
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), level: 'info', msg: 'listening', url })}\n`);
});
const stop = () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
