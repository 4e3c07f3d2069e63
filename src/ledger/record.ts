import { crc32 } from 'node:zlib';
import type { LedgerEntry } from './types.js';

/** Where a record is in the journal: [segment number, byte offset, byte length (newline included)]. */
export type Position = readonly [seq: number, offset: number, length: number];

/**
 * The journal's line format: `<crc32 of the JSON, 8 hex> <JSON>\n`, with short field names
 * (a journal holds millions of lines). The checksum finds a torn or damaged line.
 *
 * A billing record (charge, credit) also carries `p`: the position of its account's previous
 * billing record, or null for its first. Billing history follows these back pointers, a read
 * per entry, whatever the size of the journal. A record without `p` was written before the
 * pointers existed (its older history is found through the segment indexes).
 */
export function encodeRecord(e: LedgerEntry, prev?: Position | null): string {
  const record: Short = {
    i: e.id, t: e.type, a: e.accountId, k: e.keyId, m: e.amountMicro, b: e.balanceAfterMicro, c: e.createdAt,
    r: e.requestId, o: e.model, in: e.inputTokens, out: e.outputTokens, e: e.estimated ? 1 : 0, n: e.note,
  };
  if (e.idempotencyKey !== null) record.x = e.idempotencyKey; // credits only: charges stay as short as before
  if (e.deployment !== null) record.d = e.deployment;
  if (e.balanceUnknown) record.u = 1;
  if (prev !== undefined) record.p = prev;
  const json = JSON.stringify(record);
  return `${crc32(json).toString(16).padStart(8, '0')} ${json}\n`;
}

interface Short {
  i: string; t: LedgerEntry['type']; a: string; k: string | null; m: number; b: number | null; c: number;
  r: string | null; o: string | null; in: number; out: number; e: number; n: string | null; x?: string; d?: string;
  u?: 1; p?: Position | null;
}

export interface Decoded {
  entry: LedgerEntry;
  /** The account's previous billing record; null: none; undefined: written before back pointers. */
  prev: Position | null | undefined;
}

const isPosition = (p: unknown): p is Position =>
  Array.isArray(p) && p.length === 3 && p.every((n) => Number.isSafeInteger(n) && (n as number) >= 0);

/** Decodes one line (without its newline); null when the checksum or the JSON is wrong. */
export function decodeRecord(line: string): Decoded | null {
  if (line.length < 10 || line.charCodeAt(8) !== 32) return null;
  const json = line.slice(9);
  if (parseInt(line.slice(0, 8), 16) !== crc32(json)) return null;
  let s: Short;
  try {
    s = JSON.parse(json) as Short;
  } catch {
    return null;
  }
  if (s.p !== undefined && s.p !== null && !isPosition(s.p)) return null;
  return {
    entry: {
      id: s.i, type: s.t, accountId: s.a, keyId: s.k, amountMicro: s.m, balanceAfterMicro: s.b, balanceUnknown: s.u === 1, createdAt: s.c,
      requestId: s.r, model: s.o, inputTokens: s.in, outputTokens: s.out, estimated: s.e === 1, note: s.n,
      idempotencyKey: s.x ?? null, deployment: s.d ?? null,
    },
    prev: s.p,
  };
}
