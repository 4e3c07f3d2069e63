import { crc32 } from 'node:zlib';
import type { LedgerEntry } from './types.js';

/**
 * The journal's line format: `<crc32 of the JSON, 8 hex> <JSON>\n`, with short field names
 * (a journal holds millions of lines). The checksum finds a torn or damaged line.
 */
export function encodeRecord(e: LedgerEntry): string {
  const record: Short = {
    i: e.id, t: e.type, a: e.accountId, k: e.keyId, m: e.amountMicro, b: e.balanceAfterMicro, c: e.createdAt,
    r: e.requestId, o: e.model, in: e.inputTokens, out: e.outputTokens, e: e.estimated ? 1 : 0, n: e.note,
  };
  if (e.idempotencyKey !== null) record.x = e.idempotencyKey; // credits only: charges stay as short as before
  const json = JSON.stringify(record);
  return `${crc32(json).toString(16).padStart(8, '0')} ${json}\n`;
}

interface Short {
  i: string; t: LedgerEntry['type']; a: string; k: string | null; m: number; b: number | null; c: number;
  r: string | null; o: string | null; in: number; out: number; e: number; n: string | null; x?: string;
}

/** Decodes one line (without its newline); null when the checksum or the JSON is wrong. */
export function decodeRecord(line: string): LedgerEntry | null {
  if (line.length < 10 || line.charCodeAt(8) !== 32) return null;
  const json = line.slice(9);
  if (parseInt(line.slice(0, 8), 16) !== crc32(json)) return null;
  let s: Short;
  try {
    s = JSON.parse(json) as Short;
  } catch {
    return null;
  }
  return {
    id: s.i, type: s.t, accountId: s.a, keyId: s.k, amountMicro: s.m, balanceAfterMicro: s.b, createdAt: s.c,
    requestId: s.r, model: s.o, inputTokens: s.in, outputTokens: s.out, estimated: s.e === 1, note: s.n,
    idempotencyKey: s.x ?? null,
  };
}
