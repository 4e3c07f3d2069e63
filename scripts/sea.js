#!/usr/bin/env node
// Builds a single executable (Node's single-executable-application support): the bundled
// gateway (dist/model-gateway.js, from `npm run bundle`) injected into a copy of this node
// binary. The result, dist/model-gateway, runs the full CLI with no node_modules beside it.
//
//   npm run sea && ./dist/model-gateway --port 0
'use strict';
const { execFileSync } = require('node:child_process');
const { copyFileSync, chmodSync, readFileSync, statSync, writeFileSync, rmSync } = require('node:fs');
const { join, resolve } = require('node:path');

async function main() {
  const dist = resolve(__dirname, '..', 'dist');
  const config = join(dist, 'sea-config.json');
  const blob = join(dist, 'sea-prep.blob');
  const target = join(dist, 'model-gateway');
  writeFileSync(config, JSON.stringify({ main: join(dist, 'model-gateway.js'), output: blob, disableExperimentalSEAWarning: true }));
  execFileSync(process.execPath, ['--experimental-sea-config', config], { stdio: 'inherit' });
  rmSync(target, { force: true });
  copyFileSync(process.execPath, target);
  chmodSync(target, 0o755);
  const { inject } = require('postject');
  await inject(target, 'NODE_SEA_BLOB', readFileSync(blob), { sentinelFuse: 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2' });
  rmSync(blob);
  rmSync(config);
  process.stdout.write(`dist/model-gateway: ${(statSync(target).size / 1024 / 1024).toFixed(1)} MiB (node ${process.version} plus the bundle)\n`);
}

main().catch((err) => {
  process.stderr.write(`sea build failed: ${err.stack || err}\n`);
  process.exit(1);
});
