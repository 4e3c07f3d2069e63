import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { describe, test } from 'node:test';
import { eventData, eventName, EventTooLarge, ParsedEvents, SseSplitter } from '../../src/providers/sse.js';
import { rng } from '../helpers/fake-clock.js';

/** The reference: the whole stream at once, line ends normalised, split at blank lines. */
function reference(stream: string): string[] {
  const text = stream.replace(/\r\n?/g, '\n');
  const events: string[] = [];
  let start = 0;
  for (let end = text.indexOf('\n\n'); end !== -1; end = text.indexOf('\n\n', start)) {
    events.push(text.slice(start, end + 2));
    start = end + 2;
  }
  return events;
}

describe('SseSplitter', () => {
  test('property: any chunking of a stream gives the events of the whole stream (CR LF pairs and characters split included)', () => {
    const r = rng(42);
    const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
    for (let round = 0; round < 300; round++) {
      const eol = pick(['\n', '\r\n', '\r']);
      let stream = '';
      const n = 1 + Math.floor(r() * 8);
      for (let i = 0; i < n; i++) {
        const data = Array.from({ length: Math.floor(r() * 30) }, () => pick(['a', 'é', '€', '𝄞', ' ', ':', '{', '"'])).join('');
        stream += `event: e${i}${eol}data: ${data}${eol}${r() < 0.3 ? `data: more${eol}` : ''}${eol}`;
      }
      const bytes = Buffer.from(stream);
      const splitter = new SseSplitter();
      const got: string[] = [];
      for (let at = 0; at < bytes.length;) {
        const size = 1 + Math.floor(r() * r() * 40);
        got.push(...splitter.push(bytes.subarray(at, at + size)));
        at += size;
      }
      assert.deepEqual(got, reference(stream), `round ${round}: ${JSON.stringify(stream)}`);
      assert.equal(splitter.rest(), '');
    }
  });

  test('what is left at the end is one last event', () => {
    const s = new SseSplitter();
    assert.deepEqual(s.push(Buffer.from('data: a\n\ndata: b')), ['data: a\n\n']);
    assert.equal(s.rest(), 'data: b\n\n');
  });

  test('bounded: an event longer than the bound throws, however it arrives', () => {
    const s = new SseSplitter(1000);
    assert.deepEqual(s.push(Buffer.from(`data: ${'x'.repeat(900)}\n\n`)), [`data: ${'x'.repeat(900)}\n\n`]);
    s.push(Buffer.from('data: '));
    assert.throws(() => {
      for (let i = 0; i < 100; i++) s.push(Buffer.from('y'.repeat(50)));
    }, EventTooLarge);
  });

  test('linear: an 8 MB event in 4 KB chunks is joined once, not rescanned per chunk', () => {
    const s = new SseSplitter(16 * 1024 * 1024);
    const chunk = Buffer.from('z'.repeat(4096));
    const started = performance.now();
    s.push(Buffer.from('data: '));
    for (let i = 0; i < 2048; i++) s.push(chunk);
    const [event] = s.push(Buffer.from('\n\n'));
    const ms = performance.now() - started;
    assert.equal(event!.length, 6 + 2048 * 4096 + 2);
    assert.ok(ms < 2000, `${Math.round(ms)} ms (rescanning the held text per chunk takes minutes)`);
  });

  test('property: a chunk said to be whole is byte for byte the events it gave; chunks of whole events are', () => {
    const r = rng(7);
    const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
    // Bytes a provider may send: invalid UTF-8 (a lone continuation, a cut-off lead), CR line ends.
    const pieces = [Buffer.from('a'), Buffer.from('é'), Buffer.from('€'), Buffer.from('𝄞'), Buffer.from(' '), Buffer.from('\n'),
      Buffer.from([0x80]), Buffer.from([0xe2, 0x82]), Buffer.from([0xf0, 0x9f, 0x98]), Buffer.from('\r'), Buffer.from('\r\n')];
    let wholeSeen = 0;
    for (let round = 0; round < 2000; round++) {
      const splitter = new SseSplitter();
      const bad = r() < 0.5;
      for (let c = 0; c < 6; c++) {
        // A chunk of whole events, or any bytes at all.
        const parts: Buffer[] = [];
        const events = 1 + Math.floor(r() * 3);
        for (let e = 0; e < events; e++) {
          parts.push(Buffer.from('data: '));
          for (let k = Math.floor(r() * 12); k > 0; k--) parts.push(bad && r() < 0.2 ? pick(pieces) : pick(pieces.slice(0, 5)));
          if (r() < 0.9 || !bad) parts.push(Buffer.from('\n\n'));
        }
        const chunk = Buffer.concat(parts);
        const got = splitter.push(chunk);
        if (splitter.whole) {
          wholeSeen++;
          assert.ok(Buffer.from(got.join('')).equals(chunk), `round ${round}: ${JSON.stringify(chunk.toString('latin1'))}`);
        } else if (!bad) {
          assert.fail(`round ${round}: a chunk of whole events in valid UTF-8 was not whole`);
        }
      }
    }
    assert.ok(wholeSeen > 3000, `${wholeSeen}`);
  });

  test('not whole: an event split across chunks, a character split across chunks, CR line ends, what follows invalid bytes', () => {
    const s = new SseSplitter();
    s.push(Buffer.from('data: a\n\n'));
    assert.equal(s.whole, true);
    s.push(Buffer.from('data: b\n'));
    assert.equal(s.whole, false, 'an event is held');
    s.push(Buffer.from('\ndata: c\n\n'));
    assert.equal(s.whole, false, 'the chunk ends an event begun before it');
    s.push(Buffer.from('data: d\n\n'));
    assert.equal(s.whole, true);
    const euro = Buffer.from('data: €\n\n');
    s.push(euro.subarray(0, 7));
    s.push(euro.subarray(7));
    assert.equal(s.whole, false, 'a character split');
    s.push(Buffer.from('data: d2\n\n'));
    assert.equal(s.whole, false, 'the chunk before was not valid UTF-8 alone');
    s.push(Buffer.from('data: d3\n\n'));
    assert.equal(s.whole, true);
    s.push(Buffer.from('data: e\r\n\r\n'));
    assert.equal(s.whole, false, 'CR LF is normalised: the text differs from the bytes');
    s.push(Buffer.from('data: e2\n\n'));
    assert.equal(s.whole, true);
    // A CR ends a chunk: the LF that starts the next belongs to it, and is not in the text.
    s.push(Buffer.from('data: e3\r\n\r'));
    assert.deepEqual(s.push(Buffer.from('\ndata: e4\n\n')), ['data: e4\n\n']);
    assert.equal(s.whole, false, 'the chunk\'s first byte is not in its events');
    // A byte-order mark is kept as a character and written back as the same bytes.
    const bom = Buffer.from('\ufeffdata: e5\n\n');
    assert.ok(Buffer.from(s.push(bom).join('')).equals(bom));
    assert.equal(s.whole, true);
    s.push(Buffer.from([...Buffer.from('data: f\n\n'), 0xe2]));
    assert.equal(s.whole, false);
    // The cut-off lead waits in the decoder and comes out as U+FFFD before the next chunk's text.
    assert.deepEqual(s.push(Buffer.from('data: g\n\n')), ['\ufffddata: g\n\n']);
    assert.equal(s.whole, false);
    s.push(Buffer.from('data: h\n\n'));
    assert.equal(s.whole, true);
    s.push(Buffer.alloc(0));
    assert.equal(s.whole, false);
  });
});

test('eventName reads the name line wherever it is, with or without the space; eventData joins data lines', () => {
  assert.equal(eventName('event: response.created\ndata: {}\n\n'), 'response.created');
  assert.equal(eventName('event:ping\n\n'), 'ping');
  assert.equal(eventName('id: 7\nevent: message_stop\ndata: {}\n\n'), 'message_stop');
  assert.equal(eventName('event: tail-without-newline'), 'tail-without-newline');
  assert.equal(eventName('data: {"event: no"}\n\n'), null);
  assert.equal(eventName(': comment\n\n'), null);
  assert.equal(eventData('event: x\ndata: a\ndata:b\n\n'), 'a\nb');
  assert.equal(eventData('event: x\n\n'), null);
});

test('eventData reads any text line by line as a split on "\\n" would (random events against the plain reading)', () => {
  const plain = (event: string): string | null => {
    let data: string | null = null;
    for (const line of event.split('\n')) {
      if (!line.startsWith('data:')) continue;
      const value = line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5);
      data = data === null ? value : `${data}\n${value}`;
    }
    return data;
  };
  const pieces = ['data:', 'data: ', ' ', '\n', '\n\n', 'x', ':', 'event: e', 'dat', 'a:', '\r', '{"a":1}', 'é'];
  let seed = 7;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  for (let i = 0; i < 5000; i++) {
    let event = '';
    for (let n = Math.floor(next() * 12); n > 0; n--) event += pieces[Math.floor(next() * pieces.length)];
    assert.equal(eventData(event), plain(event), JSON.stringify(event));
  }
});

test('ParsedEvents: the watcher parses, the translation takes the same parse in order; anything else is parsed again', () => {
  const events = new ParsedEvents();
  const datas = Array.from({ length: 40 }, (_, i) => JSON.stringify({ type: 'content_block_delta', index: i % 3, delta: { type: 'text_delta', text: `t${i}` } }));
  const seen = datas.map((d) => events.parse(d));
  datas.forEach((d, i) => assert.equal(events.take(d), seen[i], `event ${i}: the watcher's parse, not a new one`));
  // Taken: nothing is kept, and the same data again is a new parse, equal to JSON.parse's.
  assert.notEqual(events.take(datas[0]!), seen[0]);
  assert.deepEqual(events.take(datas[0]!), JSON.parse(datas[0]!));
  // An event the translation never gets is passed over; one it gets that was never seen is parsed.
  const [a, b, c] = ['{"n":1}', '{"n":2}', '{"n":3}'].map((d) => ({ d, v: events.parse(d) }));
  assert.equal(events.take(b!.d), b!.v);
  assert.equal(events.take(c!.d), c!.v);
  assert.notEqual(events.take(a!.d), a!.v, 'a passed-over parse is not found later');
  for (const bad of ['', '{', '{"a":1}x']) {
    assert.throws(() => events.parse(bad), SyntaxError, JSON.stringify(bad));
    assert.throws(() => events.take(bad), SyntaxError, JSON.stringify(bad));
  }
  // Parses never taken are dropped past a bound, not kept for ever.
  for (let i = 0; i < 10_000; i++) events.parse(`{"i":${i}}`);
  assert.ok(((events as unknown as { keys: string[] }).keys).length <= 256);
  // Nor large ones: a translation whose answer is over stops taking, while the provider may go
  // on sending events of megabytes (found in review: 180 MB of heap kept per 8 MB event, up to
  // 256 of them). What is held stays under a bound, and what is dropped is let go.
  const held = (p: ParsedEvents) => (p as unknown as { values: unknown[] }).values.filter((v) => v !== undefined).length;
  const huge = new ParsedEvents();
  const big = JSON.stringify({ type: 'ping', p: 'x'.repeat(300 * 1024) });
  const bigValue = huge.parse(big);
  assert.equal(held(huge), 0, 'an event over the bound is not kept');
  assert.notEqual(huge.take(big), bigValue, 'so a translation taking it parses it again');
  const medium = JSON.stringify({ type: 'ping', p: 'y'.repeat(60 * 1024) });
  for (let i = 0; i < 50; i++) huge.parse(medium);
  assert.ok(held(huge) <= 4, `at most 256 KiB of events held: ${held(huge)}`);
  // Kept under the whole event when one is given: found by it, and only by it.
  const keyed = new ParsedEvents();
  const event = `event: x\ndata: ${datas[1]}\n\n`;
  const value = keyed.parse(datas[1]!, JSON.parse, event);
  assert.equal(keyed.take(datas[1]!, JSON.parse, event), value);
  const kept = keyed.parse(datas[3]!, JSON.parse, `event: y\ndata: ${datas[3]}\n\n`);
  const other = keyed.take(datas[3]!, JSON.parse, `event: z\ndata: ${datas[3]}\n\n`);
  assert.notEqual(other, kept, 'another event with the same data: read again');
  assert.deepEqual(other, JSON.parse(datas[3]!));
});
