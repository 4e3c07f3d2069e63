import { DAY_MS } from '../clock.js';
import { addMicro } from '../money.js';
import type { AccountTotals, GroupBy, LedgerEntry, UsageRow } from './types.js';

/**
 * How long admin credits are remembered: a repeat with the same Idempotency-Key within this
 * time credits once, and a shared limiter store is given each of them again at start (once
 * per entry id), in case an instance died between the durable write and the live credit.
 */
export const CREDIT_KEY_DAYS = 7;

interface Cell {
  requests: number;
  inputTokens: number;
  outputTokens: number;
  costMicro: number;
}

/** Day number as YYYY-MM-DD. */
export function dayString(day: number): string {
  return new Date(day * DAY_MS).toISOString().slice(0, 10);
}

/** Adds an entry to its account's totals: the balance, the latest day's spend, whether it was credited. */
/**
 * Whether an entry moves the prepaid balance: a credit, or a charge made to a prepaid balance
 * (it has a balance after it, or one not known). A postpaid account's spend is invoiced, not
 * taken from a later prepaid balance. The PostgreSQL ledger's balances apply the same rule.
 */
export function countsInBalance(e: LedgerEntry): boolean {
  return e.type === 'credit' || e.balanceAfterMicro !== null || e.balanceUnknown;
}

export function addToTotals(totals: Map<string, AccountTotals>, e: LedgerEntry): void {
  const day = Math.floor(e.createdAt / DAY_MS);
  let t = totals.get(e.accountId);
  if (t === undefined) {
    t = { balanceMicro: 0, day, spentMicro: 0, credited: false };
    totals.set(e.accountId, t);
  }
  // Saturating, as the limiters do: a total past 2^53 would be refused at the next start.
  if (countsInBalance(e)) t.balanceMicro = addMicro(t.balanceMicro, e.amountMicro);
  if (e.type === 'credit') {
    t.credited = true;
    return;
  }
  if (day > t.day) {
    t.day = day;
    t.spentMicro = 0;
  }
  if (day === t.day) t.spentMicro = addMicro(t.spentMicro, -e.amountMicro);
}

/**
 * The aggregates every ledger keeps in memory: balances, each account's spend on its latest
 * day (for the daily cap), and usage per day x model x key. Small, and what snapshots save.
 */
export class LedgerBook {
  readonly totals = new Map<string, AccountTotals>();
  /** account -> "day\tmodel\tkey" -> cell */
  private readonly cells = new Map<string, Map<string, Cell>>();
  private last: { accountId: string; day: number; model: string | null; keyId: string | null; cell: Cell } | null = null;
  /**
   * Admin credits of the last CREDIT_KEY_DAYS, oldest first: by `account \n Idempotency-Key`,
   * or by `account \n \0 entry id` when they have none (a key is visible ASCII, never \0).
   */
  private readonly adminCredits = new Map<string, LedgerEntry>();

  apply(e: LedgerEntry): void {
    addToTotals(this.totals, e);
    if (e.type === 'credit') {
      if (e.requestId !== null) this.rememberCredit(e); // an admin credit (the initial one has no request)
      return;
    }
    const day = Math.floor(e.createdAt / DAY_MS);
    const cell = this.cellOf(e.accountId, day, e.model, e.keyId);
    cell.requests++;
    cell.inputTokens += e.inputTokens;
    cell.outputTokens += e.outputTokens;
    cell.costMicro -= e.amountMicro;
  }

  /**
   * The cell of one account, day, model and key. The last one found is remembered: calls in a
   * row for the same key and model (the usual case under load) then skip building and hashing
   * the cell's map key.
   */
  private cellOf(accountId: string, day: number, model: string | null, keyId: string | null): Cell {
    const last = this.last;
    if (last !== null && last.day === day && last.accountId === accountId && last.model === model && last.keyId === keyId) return last.cell;
    let cells = this.cells.get(accountId);
    if (cells === undefined) {
      cells = new Map();
      this.cells.set(accountId, cells);
    }
    const key = `${day}\t${model ?? ''}\t${keyId ?? ''}`;
    let cell = cells.get(key);
    if (cell === undefined) {
      cell = { requests: 0, inputTokens: 0, outputTokens: 0, costMicro: 0 };
      cells.set(key, cell);
    }
    this.last = { accountId, day, model, keyId, cell };
    return cell;
  }

  creditByKey(accountId: string, idempotencyKey: string): LedgerEntry | undefined {
    return this.adminCredits.get(`${accountId}\n${idempotencyKey}`);
  }

  /** The admin credits of the last CREDIT_KEY_DAYS, oldest first. */
  recentCredits(): IterableIterator<LedgerEntry> {
    return this.adminCredits.values();
  }

  private rememberCredit(e: LedgerEntry): void {
    this.adminCredits.set(creditSlot(e), e);
    const oldest = e.createdAt - CREDIT_KEY_DAYS * DAY_MS;
    for (const [slot, credit] of this.adminCredits) {
      if (credit.createdAt >= oldest) break;
      this.adminCredits.delete(slot);
    }
  }

  usage(accountId: string, startDay: number, endDay: number, groupBy: GroupBy): UsageRow[] {
    const rows: UsageCell[] = [];
    for (const [key, cell] of this.cells.get(accountId) ?? []) {
      const [dayText, model, keyId] = key.split('\t') as [string, string, string];
      const day = Number(dayText);
      if (day >= startDay && day <= endDay) rows.push({ day, model, keyId, ...cell });
    }
    return groupUsage(rows, groupBy);
  }

  /** A plain-JSON copy, as snapshots before version 3 held it (saveLines replaced it; load reads it). */
  save(): unknown {
    return {
      totals: [...this.totals],
      cells: [...this.cells].map(([account, cells]) => [account, [...cells]]),
      credits: [...this.adminCredits.values()],
    };
  }

  static load(saved: unknown): LedgerBook {
    const book = new LedgerBook();
    const s = saved as { totals: Array<[string, AccountTotals]>; cells: Array<[string, Array<[string, Cell]>]>; credits?: LedgerEntry[] };
    book.loadTotals(s.totals);
    book.loadCredits(s.credits ?? []);
    for (const [account, cells] of s.cells) book.loadCells(account, cells);
    return book;
  }

  /**
   * The book as lines of JSON (snapshots), each a group of at most LINE_ITEMS: `["t", totals]`,
   * `["c", account, cells]`, `["r", credits]`. No line, and no string, grows with the whole
   * book: one JSON text of it could not be written past some 5 million cells (V8's longest
   * string), nor read back.
   */
  *saveLines(): Generator<string> {
    yield* lines(this.totals, (group) => ['t', group]);
    for (const [account, cells] of this.cells) yield* lines(cells, (group) => ['c', account, group]);
    yield* lines(this.adminCredits.values(), (group) => ['r', group]);
  }

  /** Takes one line of saveLines (parsed); false if it is not one. */
  loadLine(line: unknown): boolean {
    if (!Array.isArray(line)) return false;
    const [tag, a, b] = line as [unknown, unknown, unknown];
    if (tag === 't' && Array.isArray(a)) this.loadTotals(a as Array<[string, AccountTotals]>);
    else if (tag === 'c' && typeof a === 'string' && Array.isArray(b)) this.loadCells(a, b as Array<[string, Cell]>);
    else if (tag === 'r' && Array.isArray(a)) this.loadCredits(a as LedgerEntry[]);
    else return false;
    return true;
  }

  private loadTotals(totals: Array<[string, AccountTotals]>): void {
    // Snapshots written before `credited` existed counted every account with entries as credited.
    for (const [account, t] of totals) this.totals.set(account, { ...t, credited: t.credited ?? true });
  }

  private loadCredits(credits: LedgerEntry[]): void {
    for (const credit of credits) this.adminCredits.set(creditSlot(credit), credit);
  }

  private loadCells(account: string, cells: Array<[string, Cell]>): void {
    let map = this.cells.get(account);
    if (map === undefined) {
      map = new Map();
      this.cells.set(account, map);
    }
    for (const [k, c] of cells) map.set(k, { ...c });
  }
}

/** Items per snapshot line: lines of some 100 KB at most. */
const LINE_ITEMS = 1000;

/** `items` as lines of JSON, LINE_ITEMS of them a line, each line `wrap(group)`. */
export function* lines<T>(items: Iterable<T>, wrap: (group: T[]) => unknown[]): Generator<string> {
  let group: T[] = [];
  for (const item of items) {
    group.push(item);
    if (group.length === LINE_ITEMS) {
      yield `${JSON.stringify(wrap(group))}\n`;
      group = [];
    }
  }
  if (group.length > 0) yield `${JSON.stringify(wrap(group))}\n`;
}

/** One account's usage of one day, model and key ('' for none). */
export interface UsageCell extends Cell {
  day: number;
  model: string;
  keyId: string;
}

/** Usage cells summed by day, model or key, in that group's order (one shape for every ledger). */
export function groupUsage(cells: Iterable<UsageCell>, groupBy: GroupBy): UsageRow[] {
  const groups = new Map<string, UsageRow>();
  for (const cell of cells) {
    const group = groupBy === 'day' ? String(cell.day) : groupBy === 'model' ? cell.model : cell.keyId;
    let row = groups.get(group);
    if (row === undefined) {
      row = {
        date: groupBy === 'day' ? dayString(cell.day) : null,
        model: groupBy === 'model' ? cell.model || null : null,
        keyId: groupBy === 'key' ? cell.keyId || null : null,
        requests: 0, inputTokens: 0, outputTokens: 0, costMicro: 0,
      };
      groups.set(group, row);
    }
    row.requests += cell.requests;
    row.inputTokens += cell.inputTokens;
    row.outputTokens += cell.outputTokens;
    row.costMicro += cell.costMicro;
  }
  return [...groups.values()].sort((a, b) =>
    (a.date ?? a.model ?? a.keyId ?? '').localeCompare(b.date ?? b.model ?? b.keyId ?? ''));
}

function creditSlot(e: LedgerEntry): string {
  return e.idempotencyKey !== null ? `${e.accountId}\n${e.idempotencyKey}` : `${e.accountId}\n\0${e.id}`;
}
