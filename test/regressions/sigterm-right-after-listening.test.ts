import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');

/**
 * Found: the CLI printed its "listening" line before it installed its SIGTERM handler, so a
 * supervisor that signalled as soon as it read the line killed the process undrained (exit by
 * signal, and the ledger's lock left behind): 24 times in 40 on a 2-core machine.
 */
test('regression: a SIGTERM sent the moment "listening" is read drains and exits 0', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mg-sigterm-'));
  const config = join(dir, 'gateway.json');
  writeFileSync(config, JSON.stringify({ ledger: { store: 'file', dir: join(dir, 'data') } }));
  for (let i = 0; i < 12; i++) {
    const result = await new Promise<{ code: number | null; signal: string | null }>((resolve) => {
      const child = spawn(process.execPath, [MAIN, '--config', config, '--port', '0'], { stdio: ['ignore', 'pipe', 'ignore'] });
      let out = '';
      let sent = false;
      child.stdout.on('data', (d: Buffer) => {
        out += d;
        if (!sent && out.includes('"msg":"listening"')) {
          sent = true;
          child.kill('SIGTERM');
        }
      });
      child.on('exit', (code, signal) => resolve({ code, signal }));
    });
    assert.deepEqual(result, { code: 0, signal: null }, `start ${i + 1}`);
  }
});
