import { newEntryId } from '../ledger/entry-id.js';
import type { LedgerEntry } from '../ledger/types.js';
import type { Usage } from '../money.js';

/**
 * The one place ledger entries are built: every entry has the same fields in the same order
 * (one shape for V8), whichever path records it.
 */

/** A model call: a `charge` of a priced model, or a `usage` entry of a free one. */
export function callEntry(call: {
  accountId: string; keyId: string; requestId: string; model: string; deployment: string; billable: boolean; costMicro: number;
  balanceAfterMicro: number | null; balanceUnknown: boolean; usage: Usage; estimated: boolean; at: number;
}): LedgerEntry {
  const u = call.usage;
  return {
    id: newEntryId(), type: call.billable ? 'charge' : 'usage', accountId: call.accountId, keyId: call.keyId, amountMicro: -call.costMicro,
    balanceAfterMicro: call.balanceAfterMicro, balanceUnknown: call.balanceUnknown, createdAt: call.at, requestId: call.requestId, model: call.model,
    inputTokens: u.inputTokens + u.cacheReadTokens + u.cacheWriteTokens, outputTokens: u.outputTokens, estimated: call.estimated,
    note: null, idempotencyKey: null, deployment: call.deployment,
  };
}

/** Prepaid credit: the initial one from the config (no request), or an admin credit. */
export function creditEntry(credit: {
  accountId: string; amountMicro: number; balanceAfterMicro: number; at: number; requestId: string | null; note: string | null;
  idempotencyKey: string | null;
}): LedgerEntry {
  return {
    id: newEntryId(), type: 'credit', accountId: credit.accountId, keyId: null, amountMicro: credit.amountMicro,
    balanceAfterMicro: credit.balanceAfterMicro, balanceUnknown: false, createdAt: credit.at, requestId: credit.requestId, model: null,
    inputTokens: 0, outputTokens: 0, estimated: false, note: credit.note, idempotencyKey: credit.idempotencyKey, deployment: null,
  };
}

/**
 * The name a shared limiter store applies an admin credit under: its Idempotency-Key when it
 * has one, else its entry id.
 */
export function creditMarker(entry: Pick<LedgerEntry, 'id' | 'idempotencyKey'>): string {
  return entry.idempotencyKey !== null ? `k:${entry.idempotencyKey}` : `e:${entry.id}`;
}
