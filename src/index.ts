/**
 * Model Gateway as a library. `createGateway(config)` validates a config object exactly as
 * the CLI validates a file and returns a request handler for any node:http server (or its
 * own listener), with reload, health and a graceful close.
 */
export { createGateway, startGateway, ConfigError, type CreateOptions, type EmbeddedGateway, type Health } from './create.js';
export { Gateway, type GatewayOptions } from './gateway.js';
export { createGatewayServer, listen } from './server.js';
export { validateConfig, type ValidateResult } from './config/validate.js';
export { loadConfigFile } from './config/load.js';
export { demoConfig, DEMO_KEY } from './config/demo.js';
export type { GatewayConfig } from './config/types.js';
export { MemoryLimiter } from './limiter/memory.js';
export type { Limiter } from './limiter/types.js';
export { Logger, type Level, type Sink } from './log.js';
export type { Clock } from './clock.js';
