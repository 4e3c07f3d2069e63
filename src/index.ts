/** The package's programmatic entry: build a gateway from a config object and serve it. */
export { Gateway, type GatewayOptions } from './gateway.js';
export { createGatewayServer, listen } from './server.js';
export { validateConfig, type ValidateResult } from './config/validate.js';
export { loadConfigFile } from './config/load.js';
export { demoConfig, DEMO_KEY } from './config/demo.js';
export type { GatewayConfig } from './config/types.js';
export { MemoryLimiter } from './limiter/memory.js';
export type { Limiter } from './limiter/types.js';
export { Logger } from './log.js';
export type { Clock } from './clock.js';
