import { existsSync, readFileSync } from 'node:fs';
import { writeFile, rename, open } from 'node:fs/promises';
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
 * operator's, and a reload never undoes an admin change.
 */
export interface AdminState {
  version: 1;
  plans: Record<string, PlanConfig>;
  accounts: Record<string, AccountConfig>;
  keys: Record<string, AdminKey>;
  keyPatches: Record<string, KeyPatch>;
  deletedKeys: string[];
}

export function emptyAdminState(): AdminState {
  return { version: 1, plans: {}, accounts: {}, keys: {}, keyPatches: {}, deletedKeys: [] };
}

/** The file config with the admin changes laid over it, or the problems that prevent it. */
export function overlay(file: GatewayConfig, state: AdminState): { config: GatewayConfig } | { errors: string[] } {
  const plans = new Map(file.plans);
  for (const [name, plan] of Object.entries(state.plans)) plans.set(name, plan);
  const accounts = new Map(file.accounts);
  for (const [id, account] of Object.entries(state.accounts)) accounts.set(id, account);
  const keys = new Map<string, KeyConfig>();
  for (const [id, key] of file.keys) {
    if (state.deletedKeys.includes(id)) continue;
    keys.set(id, { ...key, ...(state.keyPatches[id] ?? {}) });
  }
  for (const [id, key] of Object.entries(state.keys)) keys.set(id, key);

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

/** Where admin changes are kept: a JSON file beside the ledger (or nowhere, in memory). */
export class AdminStore {
  state: AdminState;

  constructor(readonly path: string | null) {
    this.state = path !== null && existsSync(path) ? (JSON.parse(readFileSync(path, 'utf8')) as AdminState) : emptyAdminState();
  }

  /** Writes the state atomically (temp file, fsync, rename) before the change is acknowledged. */
  async save(): Promise<void> {
    if (this.path === null) return;
    const tmp = `${this.path}.tmp`;
    await writeFile(tmp, JSON.stringify(this.state, null, 2));
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
