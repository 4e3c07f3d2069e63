import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, readFileSync, readSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { mock, test } from 'node:test';
import { AccessLines } from '../../src/access-line.js';
import { LogOutput } from '../../src/log-output.js';
import { Logger } from '../../src/log.js';

test('access log lines: the time is the exact ISO instant within and across seconds; the path stays right as it changes', () => {
  mock.timers.enable({ apis: ['Date'], now: Date.UTC(2026, 10, 22, 23, 59, 58, 990) });
  try {
    const lines: string[] = [];
    const logger = new Logger((text) => lines.push(...text.trimEnd().split('\n')));
    const instants: number[] = [];
    // Steps of 1, 9, 90, 900 ms cross the 10 ms, 100 ms and second boundaries, and midnight;
    // the caller's performance.now() moves with the wall clock (the log reads that once a second).
    let perf = 5000.25;
    for (const step of [0, 1, 9, 90, 900, 1, 9, 90, 900, 0, 5]) {
      mock.timers.tick(step);
      perf += step;
      instants.push(Date.now());
      logger.access('req_1', 'POST', step === 9 ? '/v1/models' : '/v1/chat/"x"', 200, 1.2345, null, null, perf);
    }
    logger.flush();
    assert.equal(lines.length, instants.length);
    lines.forEach((line, i) => {
      const parsed = JSON.parse(line) as Record<string, unknown>;
      assert.equal(parsed.time, new Date(instants[i]!).toISOString());
      assert.equal(parsed.path, i === 2 || i === 6 ? '/v1/models' : '/v1/chat/"x"'); // the path changes and changes back
      assert.equal(parsed.ms, 1.235);
      assert.equal(parsed.account_id, null);
    });
  } finally {
    mock.timers.reset();
  }
});

test('log output to a non-blocking pipe that fills (EAGAIN): the event loop goes on, lines beyond the bound are dropped and counted, the rest arrive whole and in order', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mg-log-'));
  const fifo = join(dir, 'fifo');
  execFileSync('mkfifo', [fifo]);
  const reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  const writer = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
  try {
    const output = new LogOutput(writer, 65_536);
    const total = 3000;
    for (let i = 0; i < total; i++) output.line(`{"n":${i},"pad":"${'x'.repeat(90)}"}`);
    assert.ok(output.dropped > 0, 'a full pipe and a full buffer drop lines');
    // Nobody reads yet: the writer meets EAGAIN and tries again later, the loop is not held.
    await new Promise((r) => setTimeout(r, 30));
    let text = '';
    const chunk = Buffer.alloc(65_536);
    const flushed = output.flush(10_000);
    let done = false;
    void flushed.then(() => { done = true; });
    while (!done) {
      try {
        const n = readSync(reader, chunk);
        text += chunk.toString('utf8', 0, n);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') throw err;
      }
      await new Promise((r) => setImmediate(r));
    }
    for (;;) {
      try {
        const n = readSync(reader, chunk);
        if (n === 0) break;
        text += chunk.toString('utf8', 0, n);
      } catch {
        break;
      }
    }
    const kept = text.trimEnd().split('\n').map((line) => (JSON.parse(line) as { n: number }).n);
    assert.equal(kept.length + output.dropped, total);
    assert.deepEqual(kept, [...kept].sort((a, b) => a - b), 'in order');
    assert.deepEqual(kept.slice(0, 100), Array.from({ length: 100 }, (_, i) => i), 'the first lines were kept (new lines are the ones dropped)');
  } finally {
    closeSync(writer);
    closeSync(reader);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('log output: a write that fails after part of a line went out (the pipe\'s reader left) leaves that line on its own; the next lines are not glued to it (found in review)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mg-log-torn-'));
  const fifo = join(dir, 'fifo');
  execFileSync('mkfifo', [fifo]);
  let reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  const writer = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
  const chunk = Buffer.alloc(1 << 20);
  const readAll = (fd: number) => {
    let text = '';
    for (;;) {
      try {
        const n = readSync(fd, chunk);
        if (n === 0) return text;
        text += chunk.toString('utf8', 0, n);
      } catch {
        return text; // EAGAIN: nothing more now
      }
    }
  };
  try {
    const output = new LogOutput(writer, 400_000);
    // 200 lines of 1,001 bytes: more than the pipe holds (64 KiB, which ends inside a line).
    for (let i = 0; i < 200; i++) output.line(`{"n":${String(i).padStart(3, '0')},"pad":"${'x'.repeat(984)}"}`);
    void output.flush(100);
    await new Promise((r) => setTimeout(r, 30)); // part written, the rest waits on EAGAIN
    // The reader takes what was written and leaves, in one turn: the next try fails (EPIPE).
    const first = readAll(reader);
    closeSync(reader);
    assert.ok(first.length > 0 && !first.endsWith('\n'), 'the pipe took part of a line');
    await new Promise((r) => setTimeout(r, 50));
    const whole = first.split('\n').length - 1;
    assert.equal(output.dropped, 200 - whole, 'the lines not written whole are counted as dropped');
    // A reader again: the next line starts a line of its own.
    reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    output.line('{"n":"after"}');
    await output.flush(1000);
    const lines = (first + readAll(reader)).split('\n');
    assert.equal(lines.at(-1), '', 'ends with a whole line');
    assert.equal(lines.at(-2), '{"n":"after"}', 'the next line is whole, on its own');
    assert.equal(lines.length, whole + 3, 'the cut line stands alone');
  } finally {
    closeSync(writer);
    closeSync(reader);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('log output to a file under a steady stream: the lines that come in while a batch is written wait for their own batch (its size or its 10 ms), not a write each', async () => {
  // Sent as soon as a write ended, they made a write (a thread-pool hand-off, ~30-70 µs of the
  // event loop on this VM) per few lines under load: ten times the writes of full batches.
  const dir = mkdtempSync(join(tmpdir(), 'mg-log-batch-'));
  const fd = openSync(join(dir, 'out.log'), 'w');
  mock.timers.enable({ apis: ['setTimeout'] });
  try {
    const output = new LogOutput(fd, 1_048_576);
    const line = (i: number) => `${String(i).padStart(6, '0')} ${'x'.repeat(192)}`; // 200 bytes with its newline
    let i = 0;
    while (output.batches === 0) output.line(line(i++)); // the line that fills a batch (256 KiB to a file) sends it
    const first = i;
    for (let k = 0; k < 5; k++) output.line(line(i++)); // these come in while it is written
    mock.timers.tick(10); // their wait is over while the write is still under way: nothing sent
    assert.equal(output.batches, 1);
    while (output.busy) await new Promise((resolve) => setImmediate(resolve));
    assert.equal(output.batches, 1, 'the write ended and the five lines waiting were not sent at once');
    assert.equal(output.room(), 1_048_576 - 5 * 200);
    mock.timers.tick(10); // the end of the write gave them a new wait, now over
    assert.equal(output.batches, 2);
    await output.flush();
    const text = readFileSync(join(dir, 'out.log'), 'utf8');
    assert.equal(text.length, (first + 5) * 200);
    assert.deepEqual(text.trimEnd().split('\n').map((l) => Number(l.slice(0, 6))), Array.from({ length: first + 5 }, (_, n) => n));
  } finally {
    mock.timers.reset();
    closeSync(fd);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('log output: a failed write (EBADF) loses its lines, counted; flush resolves and nothing throws', async () => {
  const output = new LogOutput(1_000_000, 65_536); // not an open descriptor
  for (let i = 0; i < 10; i++) output.line(`line ${i}`);
  await output.flush();
  assert.equal(output.dropped, 10);
});

test('logger: a line says how many lines were dropped, once there is room again', async () => {
  const batches: string[] = [];
  const logger = new Logger((text) => batches.push(text), 'info', { bufferBytes: 4096 }); // smaller than a batch: it fills within one turn
  for (let i = 0; i < 1000; i++) logger.info('filler', { i, pad: 'y'.repeat(100) }); // about 150 KB in one turn, 4 KB kept
  const dropped = logger.dropped;
  assert.ok(dropped > 0);
  await logger.flush();
  logger.info('after');
  await logger.flush();
  const lines = batches.join('').trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  const report = lines.find((l) => l.msg === 'log lines dropped: the log reader did not keep up');
  assert.ok(report);
  assert.equal(report.dropped, dropped);
  assert.equal(lines.filter((l) => l.msg === 'filler').length + dropped, 1000);
  assert.equal(lines.at(-1)!.msg, 'after');
});

test('access lines: every field right through the byte encoder, its caches (300 paths, two methods on one path) and its slow path (dropped); a path needing escapes', async () => {
  const batches: string[] = [];
  const logger = new Logger((text) => batches.push(text));
  const expected: Array<Record<string, unknown>> = [];
  const log = (id: string, method: string, path: string, status: number, ms: number, account: string | null, dropped: string | null) => {
    logger.access(id, method, path, status, ms, account, dropped);
    expected.push({ request_id: id, method, path, status, ms: Math.round(ms * 1000) / 1000, account_id: account, ...(dropped === null ? {} : { dropped }) });
  };
  for (let i = 0; i < 300; i++) log(`req_${i}`, i % 3 === 0 ? 'POST' : 'GET', `/v1/p${i % 280}`, 200 + (i % 7), i * 1.0015, i % 2 === 0 ? 'acct_a' : null, null);
  log('req_A-z.0:9_', 'GET', '/v1/ünïcode "path"', 404, 0.0004, 'acct_b', null);
  log('req_x', 'DELETE', '/v1/models', 400, 12345.6789, 'acct_b', 'logprobs,seed');
  log('req_y', 'GET', '/v1/models', 503, 0, null, null);
  await logger.flush();
  const lines = batches.join('').trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.equal(lines.length, expected.length);
  lines.forEach((line, i) => {
    const { time, level, msg, ...rest } = line;
    assert.equal(level, 'info');
    assert.equal(msg, 'request');
    assert.match(String(time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(Math.abs(Date.parse(String(time)) - Date.now()) < 60_000);
    assert.deepEqual(rest, expected[i], `line ${i}`);
  });
});

test('access lines: the parts kept per path stay small in bytes; a long path is written whole, never kept (found in review: 256 paths of 16 KB were kept)', () => {
  const lines: string[] = [];
  const access = new AccessLines(new LogOutput((text) => lines.push(text), 1_048_576), (line) => lines.push(line));
  const kept = () => (access as unknown as { middles: Map<string, unknown> }).middles.size;
  for (let i = 0; i < 300; i++) access.write(performance.now(), 'req_1', 'GET', `/${'\\'.repeat(600)}${i}`, 404, 10, null, null);
  assert.equal(kept(), 0);
  access.write(performance.now(), 'req_2', 'GET', '/v1/models', 200, 10, null, null);
  assert.equal(kept(), 1, 'a short path is kept as before');
  (access as unknown as { output: LogOutput }).output.flushSync();
  const written = lines.join('').trimEnd().split('\n').map((l) => JSON.parse(l) as { path: string });
  assert.equal(written.length, 301);
  assert.equal(written[299]!.path, `/${'\\'.repeat(600)}299`);
});

test('access lines: a path over 1,024 characters shows its first 1,024 and its length (found in review: a 16 KB path of quotes made a 32 KB line)', () => {
  const lines: string[] = [];
  const access = new AccessLines(new LogOutput((text) => lines.push(text), 1_048_576), (line) => lines.push(line));
  const path = `/${'"'.repeat(16_383)}`;
  access.write(performance.now(), 'req_1', 'GET', path, 404, 10, null, null);
  (access as unknown as { output: LogOutput }).output.flushSync();
  const line = lines.join('').trimEnd();
  assert.ok(line.length < 2_500, `${line.length} bytes`);
  assert.equal((JSON.parse(line) as { path: string }).path, `${path.slice(0, 1024)}...(16384 characters)`);
});
