import { existsSync, readFileSync } from 'node:fs';
import { open, rename, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { AccountConfig, GatewayConfig, KeyConfig, Limit, PlanConfig } from '../config/types.js';
import { syncFile } from '../ledger/journal-fs.js';

/** A key created through the admin API (only its hash is kept). */
export interface AdminKey extends KeyConfig {
  createdAt: number;
}

/** A change to a key of the config file. */
export interface KeyPatch {
  disabled?: boolean;
  models?: string[] | null;
  rpm?: Limit;
  concurrency?: Limit;
}

/**
 * Everything changed through the admin API, kept apart from the config file and laid over it
 * whenever a config is built (at start, on SIGHUP, after each admin call): the file stays the
 * operator's, and a reload never undoes an admin change. Ids are keys of Maps, never of plain
 * objects: an id such as `__proto__` or `constructor` is an id like any other.
 */
export interface AdminState {
  plans: Map<string, PlanConfig>;
  accounts: Map<string, AccountConfig>;
  keys: Map<string, AdminKey>;
  keyPatches: Map<string, KeyPatch>;
  deletedKeys: Set<string>;
}

export function emptyAdminState(): AdminState {
  return { plans: new Map(), accounts: new Map(), keys: new Map(), keyPatches: new Map(), deletedKeys: new Set() };
}

/** A deep copy, changed by an admin call before it is kept (and only then made live). */
export function cloneAdminState(state: AdminState): AdminState {
  return structuredClone(state);
}

/** The file config with the admin changes laid over it, or the problems that prevent it. */
export function overlay(file: GatewayConfig, state: AdminState): { config: GatewayConfig } | { errors: string[] } {
  const plans = new Map(file.plans);
  for (const [name, plan] of state.plans) plans.set(name, plan);
  const accounts = new Map(file.accounts);
  for (const [id, account] of state.accounts) accounts.set(id, account);
  const keys = new Map<string, KeyConfig>();
  for (const [id, key] of file.keys) {
    if (state.deletedKeys.has(id)) continue;
    keys.set(id, { ...key, ...(state.keyPatches.get(id) ?? {}) });
  }
  for (const [id, key] of state.keys) keys.set(id, key);

  const errors: string[] = [];
  for (const account of accounts.values()) {
    if (!plans.has(account.plan)) errors.push(`accounts.${account.id}.plan: unknown plan "${account.plan}"`);
  }
  const hashes = new Set<string>();
  for (const key of keys.values()) {
    if (!accounts.has(key.account)) errors.push(`keys.${key.id}.account: unknown account "${key.account}"`);
    for (const m of key.models ?? []) if (!file.models.has(m)) errors.push(`keys.${key.id}.models: unknown model "${m}"`);
    if (hashes.has(key.sha256)) errors.push(`keys.${key.id}: the same key as another key`);
    hashes.add(key.sha256);
  }
  if (errors.length > 0) return { errors };
  return { config: { ...file, plans, accounts, keys } };
}

/** The file's form: version 2, each collection as [id, value] pairs (version 1 used objects keyed by id). */
interface Stored {
  version: 1 | 2;
  plans: unknown;
  accounts: unknown;
  keys: unknown;
  keyPatches: unknown;
  deletedKeys: string[];
}

export function toJson(state: AdminState): string {
  return JSON.stringify({
    version: 2, plans: [...state.plans], accounts: [...state.accounts], keys: [...state.keys], keyPatches: [...state.keyPatches],
    deletedKeys: [...state.deletedKeys],
  }, null, 2);
}

/** Pairs from version 2, or the own properties of a version 1 object (never anything inherited). */
function entries<T>(value: unknown, version: 1 | 2): Array<[string, T]> {
  if (version === 2) return value as Array<[string, T]>;
  return Object.entries(value as Record<string, T>);
}

export function fromJson(text: string): AdminState {
  const s = JSON.parse(text) as Stored;
  return {
    plans: new Map(entries<PlanConfig>(s.plans, s.version)),
    accounts: new Map(entries<AccountConfig>(s.accounts, s.version)),
    keys: new Map(entries<AdminKey>(s.keys, s.version)),
    keyPatches: new Map(entries<KeyPatch>(s.keyPatches, s.version)),
    deletedKeys: new Set(s.deletedKeys),
  };
}

/** Another instance changed the shared admin state first: read it again and redo the change. */
export class AdminConflict extends Error {
  constructor() {
    super('the admin state was changed by another instance');
    this.name = 'AdminConflict';
  }
}

/**
 * Where admin changes are kept: a JSON file beside the ledger, nowhere (in memory), or, for a
 * fleet, the database (admin/postgres-state.ts), which can also say when another instance
 * changed them.
 */
export class AdminStore {
  /** The state as kept: what the running config is built from. */
  state: AdminState;
  /** Where it is kept, for the start-up log line. */
  readonly where: string;

  constructor(readonly path: string | null, where?: string) {
    this.state = path !== null && existsSync(path) ? fromJson(readFileSync(path, 'utf8')) : emptyAdminState();
    this.where = where ?? path ?? 'memory';
  }

  /** Runs `changed` each time another instance changes the state (shared stores only); `reload` reads it. */
  watch(_changed: () => void): void {}

  /** The state as kept now (after an AdminConflict). */
  async reload(): Promise<AdminState> {
    return this.state;
  }

  async close(): Promise<void> {}

  /**
   * Writes `state` atomically (temp file, fsync, rename, fsync of the folder) before the change
   * is acknowledged. A shared store throws AdminConflict when another instance saved first.
   */
  async save(state: AdminState): Promise<void> {
    if (this.path === null) return;
    const tmp = `${this.path}.tmp`;
    await writeFile(tmp, toJson(state));
    const handle = await open(tmp, 'r+');
    try {
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(tmp, this.path);
    await syncFile(dirname(this.path)); // the rename is durable only once the folder is
  }
}
