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
 * routes have a single parameter, a `*` in the path given to `add`: last (the models route:
 * it may hold a `/`, as model ids do) or followed by a suffix (an account's credits: then it
 * holds no `/`). Routes are checked when registered; `find` never throws.
 */
export class Router<G> {
  private readonly statics = new Map<string, Route<G>>();
  /** Pattern routes, those with a suffix first (the plain one of the same prefix would take their paths too). */
  private readonly prefixes: Array<{ prefix: string; suffix: string; route: Route<G> }> = [];

  add(path: string, spec: RouteSpec<G>): this {
    const star = path.indexOf('/*');
    if (star >= 0) {
      const prefix = path.slice(0, star + 1);
      const suffix = path.slice(star + 2);
      if ((suffix !== '' && !/^\/[a-z_-]+$/.test(suffix)) || this.prefixes.some((p) => p.prefix === prefix && p.suffix === suffix)) {
        throw new Error(`bad or duplicate route ${path}`);
      }
      const entry = { prefix, suffix, route: build(`${prefix}{id}${suffix}`, spec) };
      if (suffix === '') this.prefixes.push(entry);
      else this.prefixes.unshift(entry);
    } else {
      const route = build(path, spec);
      if (!path.startsWith('/') || this.statics.has(path)) throw new Error(`bad or duplicate route ${path}`);
      this.statics.set(path, route);
    }
    return this;
  }

  /** The route for a path, setting `ctx.param` for a pattern route; undefined when none. */
  find(ctx: RequestContext): Route<G> | undefined {
    const route = this.statics.get(ctx.path);
    if (route !== undefined) return route;
    for (const { prefix, suffix, route: candidate } of this.prefixes) {
      const path = ctx.path;
      if (path.length > prefix.length + suffix.length && path.startsWith(prefix) && (suffix === '' || path.endsWith(suffix))) {
        const raw = path.slice(prefix.length, path.length - suffix.length);
        if (suffix !== '' && raw.includes('/')) continue;
        let param: string;
        try {
          param = decodeURIComponent(raw);
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
