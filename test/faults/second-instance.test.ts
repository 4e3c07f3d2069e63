import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { testConfig } from '../helpers/gateway.js';
import { spawnListening } from '../helpers/spawn.js';

const run = promisify(execFile);
const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');

/**
 * Two instances on one ledger directory (a rolling deploy on one volume) corrupted each
 * other's offsets and snapshots. Now the second exits 1 naming the directory; once the first
 * has stopped, or died (kill -9), a new one starts.
 */
describe('fault: a second instance on the same ledger directory', () => {
  test('is refused at start, naming the directory; the directory is free again after a stop or a crash', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mg-second-'));
    const config = join(dir, 'gateway.json');
    writeFileSync(config, JSON.stringify({ ...testConfig(), ledger: { store: 'file', dir: join(dir, 'data') } }));
    const first = await spawnListening(process.execPath, [MAIN, '--config', config, '--port', '0']);
    try {
      const second = await run(process.execPath, [MAIN, '--config', config, '--port', '0']).then(() => null, (err: { code: number; stderr: string }) => err);
      assert.ok(second !== null, 'the second instance must not start');
      assert.equal(second.code, 1);
      assert.match(second.stderr, new RegExp(`ledger\\.dir: ${join(dir, 'data').replace(/[/.]/g, '\\$&')} is in use by another gateway \\(pid ${first.child.pid}`));
      const res = await fetch(`${first.url}/healthz`);
      assert.equal(res.status, 200, 'the first one is untouched');
    } finally {
      first.child.kill('SIGTERM');
      assert.equal(await first.exited, 0, `first: ${first.stderr()} ${first.stdout()}`);
    }
    const third = await spawnListening(process.execPath, [MAIN, '--config', config, '--port', '0']);
    third.child.kill('SIGKILL');
    await third.exited;
    const fourth = await spawnListening(process.execPath, [MAIN, '--config', config, '--port', '0']);
    fourth.child.kill('SIGTERM');
    assert.equal(await fourth.exited, 0, `fourth: ${fourth.stderr()} ${fourth.stdout()}`);
  });
});
