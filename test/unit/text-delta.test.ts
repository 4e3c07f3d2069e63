import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Usage } from '../../src/money.js';
import { messages } from '../../src/protocols/messages/index.js';
import { readEvent, TextDelta, textDelta } from '../../src/protocols/messages/text-delta.js';
import { ParsedEvents } from '../../src/providers/sse.js';
import type { Exchange } from '../../src/providers/types.js';
import { anthropicEvent, eventObject } from '../../src/translate/common.js';
import { rng } from '../helpers/fake-clock.js';

/**
 * Anthropic text deltas read without JSON.parse: whatever the reader accepts, JSON.parse reads
 * the same way (checked on random texts and on random damage to them), and anything off the one
 * compact shape is left to JSON.parse.
 */

const data = (text: string, index = 0) => JSON.stringify({ type: 'content_block_delta', index, delta: { type: 'text_delta', text } });

/** Characters that exercise every escape JSON.stringify writes, and some it does not. */
const ALPHABET = ['a', ' ', '"', '\\', '/', '\n', '\r', '\t', '\b', '\f', '\u0000', '\u001f', '\u007f', 'é', '€', '\u2028', '😀', '\ud800', '\udfff', '{', '}'];

function randomText(next: () => number): string {
  let text = '';
  for (let n = Math.floor(next() * 12); n > 0; n--) text += ALPHABET[Math.floor(next() * ALPHABET.length)];
  return text;
}

/** What JSON.parse makes of data the reader accepted: exactly the shape, the text equal to the reader's. */
function assertSameAsJsonParse(d: string, label: string): void {
  const read = textDelta(d);
  if (read === null) return;
  let parsed: unknown;
  assert.doesNotThrow(() => { parsed = JSON.parse(d); }, `${label}: accepted, so JSON.parse must read it`);
  const text = JSON.parse(read.json) as unknown;
  assert.equal(typeof text, 'string', label);
  assert.deepEqual(parsed, { type: 'content_block_delta', index: read.index, delta: { type: 'text_delta', text } }, label);
  assert.equal(read.chars, (text as string).length, `${label}: chars`);
  assert.equal(read.text, text, `${label}: text`);
  assert.equal(read.plain, !read.json.includes('\\'), `${label}: plain`);
}

test('textDelta reads every text JSON.stringify writes: the literal as sent, its length, the index', () => {
  const next = rng(11);
  for (let i = 0; i < 3000; i++) {
    const text = randomText(next);
    const index = Math.floor(next() * 1000);
    const d = data(text, index);
    const read = textDelta(d);
    assert.ok(read !== null, JSON.stringify(d));
    assert.equal(read.index, index);
    assert.equal(read.json, JSON.stringify(text));
    assert.equal(read.chars, text.length);
    assert.equal(read.text, text);
    assertSameAsJsonParse(d, JSON.stringify(d));
  }
});

test('textDelta on damaged data: whatever it accepts, JSON.parse reads the same (random insertions, deletions, replacements, cuts)', () => {
  const next = rng(23);
  const pieces = ['"', '\\', '\\u', '\\x', '0', '9', 'a', 'G', ' ', '\t', '\u0001', '}', '{', ',', ':', 'u00e9', '\\u00E9', '\\/', '-', '1'];
  let accepted = 0;
  for (let i = 0; i < 20000; i++) {
    let d = data(randomText(next), Math.floor(next() * 20));
    const textStart = d.indexOf('"text":') + 7;
    for (let n = 1 + Math.floor(next() * 3); n > 0; n--) {
      // Mostly inside the text (where a provider's bytes vary), sometimes anywhere.
      const at = next() < 0.7 ? textStart + Math.floor(next() * (d.length - textStart)) : Math.floor(next() * (d.length + 1));
      const piece = pieces[Math.floor(next() * pieces.length)]!;
      const op = next();
      if (op < 0.4) d = d.slice(0, at) + piece + d.slice(at);
      else if (op < 0.7) d = d.slice(0, at) + d.slice(at + 1);
      else if (op < 0.9) d = d.slice(0, at) + piece + d.slice(at + piece.length);
      else d = d.slice(0, at);
    }
    if (textDelta(d) !== null) accepted++;
    assertSameAsJsonParse(d, JSON.stringify(d));
  }
  assert.ok(accepted > 2000, `some damage keeps the shape (${accepted} accepted)`);
});

test('textDelta leaves anything off the compact shape to JSON.parse', () => {
  const ok = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}';
  assert.deepEqual(textDelta(ok), new TextDelta(0, '"Hi"', 2, true));
  assert.deepEqual(textDelta('{"type":"content_block_delta","index":12,"delta":{"type":"text_delta","text":"\\u00e9\\/"}}'),
    new TextDelta(12, '"\\u00e9\\/"', 2, false));
  assert.ok(readEvent(ok) instanceof TextDelta);
  assert.deepEqual(readEvent('{"type": "ping"}'), { type: 'ping' }, 'anything else: what JSON.parse makes of it');
  assert.throws(() => readEvent('{"type":'), SyntaxError);
  for (const off of [
    '{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}', // spaced, as in the docs
    '{"index":0,"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}', // another order
    '{"type":"content_block_delta","index":01,"delta":{"type":"text_delta","text":"Hi"}}', // a leading zero
    '{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"Hi"}}',
    '{"type":"content_block_delta","index":1.5,"delta":{"type":"text_delta","text":"Hi"}}',
    '{"type":"content_block_delta","index":1234567890,"delta":{"type":"text_delta","text":"Hi"}}', // more digits than a block index has
    '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hi"}}',
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi","extra":1}}',
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"},"extra":1}',
    `${ok} `, // trailing space
    ok.slice(0, -1), // cut
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\tb"}}', // a raw tab
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\\x41"}}', // no such escape
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\\u12G4"}}',
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\\u12\u0011\u0012"}}', // not hex
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi\\"}}', // the quote escaped: no end
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":',
  ]) {
    assert.equal(textDelta(off), null, off);
  }
});

test('Messages watcher: text deltas are counted without JSON.parse, the same as parsed ones; usage still read', () => {
  const noted = { output: 0, usage: [] as Usage[] };
  const ex = { noteOutput: (n: number) => (noted.output += n), noteUsage: (u: Usage) => noted.usage.push(u) } as unknown as Exchange;
  const w = messages.watch(ex);
  const ev = (d: string) => `event: x\ndata: ${d}\n\n`;
  w.see(ev('{"type":"message_start","message":{"usage":{"input_tokens":7,"output_tokens":1}}}'));
  const parse = JSON.parse;
  let parsed = 0;
  JSON.parse = (...args: Parameters<typeof parse>) => (parsed++, parse(...args));
  try {
    for (const text of ['Hello', ' "wörld"\n', '😀']) assert.deepEqual(w.see(ev(data(text))), { forward: true, final: false });
  } finally {
    JSON.parse = parse;
  }
  assert.equal(parsed, 0);
  assert.equal(noted.output, 'Hello'.length + ' "wörld"\n'.length + '😀'.length);
  // Off the shape (spaced): parsed, and counted the same.
  w.see(ev('{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "abc"}}'));
  assert.equal(noted.output, 5 + 9 + 2 + 3);
  w.see(ev('{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":6}}'));
  assert.deepEqual(w.see(ev('{"type":"message_stop"}')), { forward: true, final: true });
  assert.deepEqual(w.usage(), { inputTokens: 7, outputTokens: 6, cacheReadTokens: 0, cacheWriteTokens: 0, cacheWrite1hTokens: 0, webSearches: 0 });
});

test('a translated stream reads each text delta once: the translation takes the watcher\'s reading', () => {
  const parsed = new ParsedEvents();
  const ex = { noteOutput: () => {}, noteUsage: () => {}, parsedEvents: parsed } as unknown as Exchange;
  const w = messages.watch(ex);
  const datas = ['Hi', ' there', '{"type":"ping"}'].map((t, i) => (i < 2 ? data(t) : t));
  const seen: unknown[] = [];
  // The watcher's readings, recorded as it makes them with the reader it chose.
  const parse = parsed.parse.bind(parsed);
  parsed.parse = (d: string, reader?: (d: string) => unknown, key?: string) => { const v = parse(d, reader, key); seen.push(v); return v; };
  // Kept under the whole event, which the relay hands to the watcher and the translation both.
  const events = datas.map((d) => `event: x\ndata: ${d}\n\n`);
  for (const event of events) w.see(event);
  events.forEach((event, i) => assert.equal(anthropicEvent(event, parsed), seen[i], `event ${i}: the watcher's reading, not a new one`));
  assert.ok(seen[0] instanceof TextDelta && seen[1] instanceof TextDelta, 'the watcher reads text deltas as such');
  // A reader of plain objects handed a TextDelta gets the object all the same.
  const other = new ParsedEvents();
  other.parse(datas[0]!, readEvent);
  assert.deepEqual(eventObject(datas[0]!, other), JSON.parse(datas[0]!));
});
