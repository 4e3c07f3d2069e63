import type { ServerResponse } from 'node:http';
import type { Credits } from '../admin/credits.js';
import type { AdminState, AdminStore } from '../admin/state.js';
import type { CallHost } from '../billing/call.js';
import type { BodyBudget } from '../http/body.js';
import type { CountsInFlight } from '../http/counts-in-flight.js';
import type { GatewayConfig } from '../config/types.js';
import type { Directory } from '../directory.js';
import type { RequestContext } from '../http/context.js';
import type { Ledger } from '../ledger/types.js';
import type { Rejection } from '../limiter/types.js';
import type { Provider } from '../providers/types.js';
import type { RoutingHost } from '../routing/routed-call.js';
import type { ItemMemory } from '../translate/item-memory.js';

/**
 * What the routes use of the gateway: its state (config, directory, stores, providers), the
 * admission step, and how to answer. Routes depend on this, not on the Gateway class (which
 * implements it), so a request never climbs back up into the gateway's wiring.
 */
export interface RouteHost extends CallHost, RoutingHost {
  readonly config: GatewayConfig;
  readonly directory: Directory;
  readonly ledger: Ledger;
  readonly providers: ReadonlyMap<string, Provider>;
  /** The bytes of request bodies being read, bounded per account and in all. */
  readonly bodies: BodyBudget;
  /** The same for token counts, whose bodies are held until their answer closes (a count holds no slot). */
  readonly countBodies: BodyBudget;
  /** Token counts in flight per account (a count holds no slot). */
  readonly counts: CountsInFlight;
  readonly admin: AdminStore;
  readonly credits: Credits;
  /** Items of translated Responses answers that later calls may refer to. */
  readonly items: ItemMemory;
  /** Runs `then` once the limiter admits (a value or a promise); a denial is answered. */
  admit<T extends { ok: true }>(ctx: RequestContext, res: ServerResponse, answer: T | Rejection | Promise<T | Rejection>, then: (admitted: T) => void): void;
  /** Runs `then` with a value or a promise's; a failure is answered through `fault`. */
  decide<T>(ctx: RequestContext, res: ServerResponse, answer: T | Promise<T>, then: (value: T) => void): void;
  /** Applies an admin change (queued with every other config change); resolves to the problems. */
  changeAdmin(mutate: (state: AdminState) => void): Promise<string[]>;
  ready(): { ready: true } | { ready: false; reason: string };
}
