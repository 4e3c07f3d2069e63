import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { spawnListening } from '../helpers/spawn.js';

/**
 * The access log never holds a request: the real binary, its stdout a pipe that the reader stops
 * reading (a stalled log shipper) or closes. Requests are all answered, lines that do not fit
 * the bounded buffer are dropped and counted, and what was kept arrives whole, in order, and
 * flushed by the drain.
 */
const MAIN = join(__dirname, '..', '..', 'dist', 'main.js');
const dir = mkdtempSync(join(tmpdir(), 'mg-log-reader-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const config = join(dir, 'gateway.json');
// The smallest buffer allowed, so a stalled reader fills it after about a thousand lines.
writeFileSync(config, JSON.stringify({ server: { logBufferBytes: 65_536 } }));

const agent = new Agent({ keepAlive: true, maxSockets: 32 });
after(() => agent.destroy());

function get(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    request(url, { agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    }).on('error', reject).end();
  });
}

/** `count` unauthenticated GET /v1/models (each a 401 with an access line), 32 at a time. */
async function burst(base: string, count: number): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < count) {
      next++;
      assert.equal((await get(`${base}/v1/models`)).status, 401);
    }
  };
  await Promise.all(Array.from({ length: 32 }, worker));
}

async function droppedMetric(base: string): Promise<number> {
  const text = (await get(`${base}/metrics`)).body;
  const m = /^mg_log_dropped_total (\d+)$/m.exec(text);
  assert.ok(m, 'mg_log_dropped_total is exported');
  return Number(m[1]);
}

test('a log reader that stops reading: every request is answered, lines beyond the buffer are dropped and counted, the rest arrive whole and the drain flushes them', async () => {
  const gw = await spawnListening(process.execPath, [MAIN, '--config', config, '--port', '0']);
  try {
    gw.child.stdout!.pause(); // the reader stalls: the pipe fills, then the gateway's buffer
    const requests = 4000;
    await burst(gw.url, requests);
    const dropped = await droppedMetric(gw.url);
    assert.ok(dropped > 0 && dropped < requests, `some lines dropped (${dropped}), not all`);

    gw.child.stdout!.resume();
    gw.child.kill('SIGTERM');
    assert.equal(await gw.exited, 0);
    const lines = gw.stdout().trimEnd().split('\n').map((line) => JSON.parse(line) as Record<string, unknown>);
    const models = lines.filter((l) => l.msg === 'request' && l.path === '/v1/models');
    // Only /v1/models lines were logged while the reader was stalled: each was kept or counted.
    assert.equal(models.length + dropped, requests);
    const report = lines.find((l) => l.level === 'warn' && String(l.msg).startsWith('log lines dropped'));
    assert.ok(report, 'a line says lines were dropped');
    assert.ok(Number(report.dropped_total) >= dropped);
    assert.equal(lines.at(-1)!.msg, 'stopped', 'the drain flushed the log to its last line');
  } finally {
    gw.child.kill('SIGKILL');
  }
});

test('a log reader that goes away (EPIPE): requests are still answered, the lost lines counted, and the gateway drains and exits 0', async () => {
  const gw = await spawnListening(process.execPath, [MAIN, '--config', config, '--port', '0']);
  try {
    gw.child.stdout!.destroy();
    await burst(gw.url, 300);
    // The batches fail as they are written, up to 10 ms after their requests were answered.
    const deadline = Date.now() + 5000;
    let dropped = 0;
    while ((dropped = await droppedMetric(gw.url)) < 300 && Date.now() < deadline) await new Promise((r) => setImmediate(r));
    assert.ok(dropped >= 300, `the 300 access lines are counted as dropped (${dropped})`);
    gw.child.kill('SIGTERM');
    assert.equal(await gw.exited, 0);
  } finally {
    gw.child.kill('SIGKILL');
  }
});

test('SIGTERM while the log reader is stalled: the drain waits for the log a bounded while, then exits 0 (the lines it could not write are lost, not the exit)', { timeout: 30_000 }, async () => {
  const gw = await spawnListening(process.execPath, [MAIN, '--config', config, '--port', '0']);
  try {
    gw.child.stdout!.pause();
    await burst(gw.url, 4000); // the pipe and the buffer full: a write is stuck on the reader
    const sent = Date.now();
    gw.child.kill('SIGTERM');
    assert.equal(await gw.exited, 0);
    assert.ok(Date.now() - sent < 15_000, `exited ${Date.now() - sent} ms after SIGTERM`);
  } finally {
    gw.child.kill('SIGKILL');
  }
});
