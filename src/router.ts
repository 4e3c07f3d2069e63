import type { IncomingMessage, ServerResponse } from 'node:http';
import type { RequestContext } from './http/context.js';

export type Handler<G> = (gateway: G, ctx: RequestContext, req: IncomingMessage, res: ServerResponse) => void;

export interface Route<G> {
  /** The path pattern, for metrics (`/v1/models/{id}`). */
  readonly label: string;
  /** Whether the route needs an API key (everything under /v1/). */
  readonly auth: boolean;
  /** Whether the route needs the admin key. */
  readonly admin: boolean;
  /** Answers also carry `request-id` (Anthropic's header). */
  readonly anthropic: boolean;
  readonly methods: Readonly<Record<string, Handler<G>>>;
  /** The `Allow` header for 405s. */
  readonly allow: string;
}

export interface RouteSpec<G> {
  auth?: boolean;
  admin?: boolean;
  anthropic?: boolean;
  methods: Record<string, Handler<G>>;
}

/**
 * method + path -> handler. Static paths come from a map (one lookup); the few pattern
 * routes are prefixes with a single trailing parameter. Routes are checked when registered;
 * `find` never throws.
 */
export class Router<G> {
  private readonly statics = new Map<string, Route<G>>();
  private readonly prefixes: Array<{ prefix: string; route: Route<G> }> = [];

  add(path: string, spec: RouteSpec<G>): this {
    const route = build(path.endsWith('/*') ? `${path.slice(0, -2)}/{id}` : path, spec);
    if (path.endsWith('/*')) {
      const prefix = path.slice(0, -1);
      if (this.prefixes.some((p) => p.prefix === prefix)) throw new Error(`duplicate route ${path}`);
      this.prefixes.push({ prefix, route });
    } else {
      if (!path.startsWith('/') || this.statics.has(path)) throw new Error(`bad or duplicate route ${path}`);
      this.statics.set(path, route);
    }
    return this;
  }

  /** The route for a path, setting `ctx.param` for a pattern route; undefined when none. */
  find(ctx: RequestContext): Route<G> | undefined {
    const route = this.statics.get(ctx.path);
    if (route !== undefined) return route;
    for (const { prefix, route: candidate } of this.prefixes) {
      if (ctx.path.length > prefix.length && ctx.path.startsWith(prefix)) {
        let param: string;
        try {
          param = decodeURIComponent(ctx.path.slice(prefix.length));
        } catch {
          return undefined; // malformed percent-encoding names nothing that exists
        }
        ctx.param = param;
        return candidate;
      }
    }
    return undefined;
  }
}

function build<G>(label: string, spec: RouteSpec<G>): Route<G> {
  const methods = Object.assign(Object.create(null) as Record<string, Handler<G>>, spec.methods);
  if (methods.GET !== undefined && methods.HEAD === undefined && !spec.auth && !spec.admin) methods.HEAD = methods.GET;
  for (const method of Object.keys(methods)) {
    if (!/^[A-Z]+$/.test(method)) throw new Error(`bad method ${method}`);
  }
  return { label, auth: spec.auth ?? false, admin: spec.admin ?? false, anthropic: spec.anthropic ?? false, methods, allow: Object.keys(methods).join(', ') };
}
