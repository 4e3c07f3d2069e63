import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { hash } from 'node:crypto';
import { copyFileSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { DEMO_KEY } from '../../src/config/demo.js';
import { spawnListening } from '../helpers/spawn.js';

const run = promisify(execFile);
const root = join(__dirname, '..', '..');

/** Starts a CLI (a bundle or an executable) with the demo config and lists the models with the demo key. */
async function demoWorks(command: string, args: string[], cwd: string): Promise<void> {
  const { child, url, exited } = await spawnListening(command, [...args, '--port', '0'], { cwd, env: { PATH: process.env.PATH ?? '' } });
  try {
    const res = await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${DEMO_KEY}` } });
    assert.equal(res.status, 200);
    assert.ok(((await res.json()) as { data: Array<{ id: string }> }).data.some((m) => m.id === 'echo-1'));
  } finally {
    child.kill('SIGTERM');
    assert.equal(await exited, 0);
  }
}

describe('single-file build and single executable', () => {
  test('npm run bundle: one .js file that needs only Node built-ins runs the CLI', async () => {
    await run(process.execPath, [join(root, 'scripts', 'bundle.js')]);
    const alone = mkdtempSync(join(tmpdir(), 'mg-bundle-'));
    try {
      const file = join(alone, 'model-gateway.js');
      copyFileSync(join(root, 'dist', 'model-gateway.js'), file); // no node_modules, no dist/ beside it
      assert.equal((await run(process.execPath, [file, 'hash-key', 'k'], { cwd: alone })).stdout.trim(), hash('sha256', 'k'));
      await demoWorks(process.execPath, [file], alone);
    } finally {
      rmSync(alone, { recursive: true, force: true });
    }
  });

  test('npm run sea: a standalone executable runs the demo with no node_modules beside it', { timeout: 120_000 }, async () => {
    await run(process.execPath, [join(root, 'scripts', 'bundle.js')]);
    await run(process.execPath, [join(root, 'scripts', 'sea.js')], { cwd: root });
    const alone = mkdtempSync(join(tmpdir(), 'mg-sea-'));
    try {
      const exe = join(alone, 'model-gateway');
      copyFileSync(join(root, 'dist', 'model-gateway'), exe);
      await run('chmod', ['+x', exe]);
      assert.ok(statSync(exe).size > 10e6);
      assert.equal((await run(exe, ['hash-key', 'k'], { cwd: alone })).stdout.trim(), hash('sha256', 'k'));
      await demoWorks(exe, [], alone);
    } finally {
      rmSync(alone, { recursive: true, force: true });
    }
  });
});
