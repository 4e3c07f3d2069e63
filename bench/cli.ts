/**
 * What every bench script shares: its command line (declared flags, one parser, one usage
 * text), the paired-rounds runner (targets alternate, the order rotating each round, so slow
 * drift of this shared 2-core VM falls on every target alike), medians and number formats, and
 * how `main` ends.
 *
 *   const flags = parseFlags('redis.ts', {
 *     rounds: int({ default: 5, help: 'rounds per target' }),
 *     durationS: num({ name: 'duration', default: 5, help: 'seconds per timed run' }),
 *   });
 *
 * Accepts `--name value` and `--name=value`; `--help` prints the usage; an unknown flag or a bad
 * value prints it to stderr and exits 2.
 */
import { resolve } from 'node:path';

// ---------------------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------------------

/** One flag as a script declares it (made by the builders below). */
export interface Flag<T> {
  /** Typed name without the dashes; default: the key, camelCase made kebab-case. */
  readonly name?: string;
  readonly help: string;
  readonly default: T;
  /** The value's placeholder in the usage text ('N', 'S', 'DIR'); '' for a switch. */
  readonly arg: string;
  /** What a good value is, for the error message. */
  readonly expect: string;
  /** The value from its text (and the value so far, for repeatable flags); undefined when bad. */
  parse(text: string, sofar: T): T | undefined;
  readonly repeatable?: boolean;
}

type Common = { name?: string; help: string };
export type FlagValues<S> = { -readonly [K in keyof S]: S[K] extends Flag<infer T> ? T : never };

const between = (min: number, max: number) => (max === Infinity ? `>= ${min}` : `from ${min} to ${max}`);

/** An integer, from `min` (default 1) to `max`. */
export function int(o: Common & { default: number; min?: number; max?: number; arg?: string }): Flag<number> {
  const min = o.min ?? 1;
  const max = o.max ?? Infinity;
  return {
    ...o, arg: o.arg ?? 'N', expect: `an integer ${between(min, max)}`,
    parse: (text) => {
      const n = Number(text);
      return text.trim() !== '' && Number.isInteger(n) && n >= min && n <= max ? n : undefined;
    },
  };
}

/** A number: above 0, or from `min` when given (seconds, rates). */
export function num(o: Common & { default: number; min?: number; max?: number; arg?: string }): Flag<number> {
  const max = o.max ?? Infinity;
  const low = (n: number) => (o.min === undefined ? n > 0 : n >= o.min);
  return {
    ...o, arg: o.arg ?? 'S', expect: `a number ${o.min === undefined ? '> 0' : `>= ${o.min}`}${max === Infinity ? '' : ` and <= ${max}`}`,
    parse: (text) => {
      const n = Number(text);
      return text.trim() !== '' && Number.isFinite(n) && low(n) && n <= max ? n : undefined;
    },
  };
}

/** A comma-separated list of integers >= `min` (default 1). */
export function ints(o: Common & { default: number[]; min?: number; arg?: string }): Flag<number[]> {
  const one = int({ ...o, default: 0 });
  return {
    ...o, arg: o.arg ?? 'N,N', expect: `a comma-separated list of ${one.expect.replace('an integer', 'integers')}`,
    parse: (text) => {
      const xs = text.split(',').map((t) => one.parse(t, 0));
      return xs.every((x) => x !== undefined) ? (xs as number[]) : undefined;
    },
  };
}

/** A comma-separated subset of a few words, in the order given. */
export function choices<const C extends string>(o: Common & { choices: readonly C[]; default: C[] }): Flag<C[]> {
  return {
    ...o, arg: o.choices.join(','), expect: `a comma-separated list of ${o.choices.join(', ')}`,
    parse: (text) => {
      const xs = text.split(',').map((t) => o.choices.find((c) => c === t));
      return xs.every((x) => x !== undefined) ? [...new Set(xs as C[])] : undefined;
    },
  };
}

/** A string (matching `pattern` when given); `repeat` collects every occurrence into a list. */
export function str(o: Common & { default: string; arg?: string; pattern?: RegExp }): Flag<string>;
export function str(o: Common & { default: null; arg?: string; pattern?: RegExp }): Flag<string | null>;
export function str(o: Common & { default: string | null; arg?: string; pattern?: RegExp }): Flag<string | null> {
  return { ...o, arg: o.arg ?? 'TEXT', expect: o.pattern === undefined ? 'a value' : `the form ${o.arg ?? 'TEXT'}`, parse: (text) => (o.pattern === undefined || o.pattern.test(text) ? text : undefined) };
}

/** A file or directory, made absolute against the working directory; null when not given. */
export function path(o: Common & { arg?: string }): Flag<string | null> {
  return { ...o, default: null, arg: o.arg ?? 'DIR', expect: 'a path', parse: (text) => (text === '' ? undefined : resolve(text)) };
}

/** A repeatable string: `--gateway a=x --gateway b=y` gives both, in order. */
export function strs(o: Common & { arg?: string; pattern?: RegExp }): Flag<string[]> {
  const one = str({ ...o, default: '' });
  return { ...o, default: [], arg: one.arg, expect: one.expect, repeatable: true, parse: (text, sofar) => (one.parse(text, '') === undefined ? undefined : [...sofar, text]) };
}

/** A switch: present or not; takes no value. */
export function bool(o: Common): Flag<boolean> {
  return { ...o, default: false, arg: '', expect: 'no value', parse: () => undefined };
}

/** One of a few words. */
export function choice<const C extends string>(o: Common & { choices: readonly C[]; default: C }): Flag<C> {
  return { ...o, arg: o.choices.join('|'), expect: `one of ${o.choices.join(', ')}`, parse: (text) => o.choices.find((c) => c === text) };
}

const kebab = (key: string) => key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
const flagName = (key: string, f: Flag<unknown>) => `--${f.name ?? kebab(key)}`;

export function usage(script: string, specs: Record<string, Flag<unknown>>): string {
  const rows = Object.entries(specs).map(([key, f]) => {
    const left = `${flagName(key, f)}${f.arg === '' ? '' : ` ${f.arg}`}`;
    const dflt = f.arg === '' || f.default === null || f.default === '' || (Array.isArray(f.default) && f.default.length === 0) ? '' : ` (default ${String(f.default)})`;
    return [left, `${f.help}${f.repeatable ? ', repeatable' : ''}${dflt}`];
  });
  rows.push(['--help', 'this text']);
  const width = Math.max(...rows.map(([left]) => left!.length)) + 2;
  return `usage: node --import tsx bench/${script} [flags]\n${rows.map(([left, right]) => `  ${left!.padEnd(width)}${right}`).join('\n')}\n`;
}

/**
 * Parses `argv` (default: this process's arguments) against `specs`. `check` may refuse a
 * combination of values with a message. Exits 0 after `--help`, 2 on anything it refuses.
 */
export function parseFlags<S extends Record<string, Flag<unknown>>>(
  script: string, specs: S, options: { argv?: string[]; check?: (values: FlagValues<S>) => string | null } = {},
): FlagValues<S> {
  const fail = (message: string): never => {
    process.stderr.write(`${script}: ${message}\n${usage(script, specs)}`);
    process.exit(2);
  };
  const byName = new Map(Object.entries(specs).map(([key, f]) => [flagName(key, f), key]));
  const values = Object.fromEntries(Object.entries(specs).map(([key, f]) => [key, f.default])) as Record<string, unknown>;
  const argv = options.argv ?? process.argv.slice(2);
  const seen = new Set<string>();
  for (let i = 0; i < argv.length; i++) {
    const word = argv[i]!;
    if (word === '--help' || word === '-h') {
      process.stdout.write(usage(script, specs));
      process.exit(0);
    }
    const eq = word.indexOf('=');
    const name = eq === -1 ? word : word.slice(0, eq);
    const key = byName.get(name);
    if (key === undefined) fail(word.startsWith('--') ? `unknown flag ${name}` : `unexpected argument ${JSON.stringify(word)}`);
    const f = specs[key!]!;
    if (seen.has(key!) && !f.repeatable) fail(`${name} given twice`);
    seen.add(key!);
    if (f.arg === '') {
      if (eq !== -1) fail(`${name} takes no value`);
      values[key!] = true;
      continue;
    }
    const text = eq === -1 ? argv[++i] : word.slice(eq + 1);
    if (text === undefined) fail(`${name} needs a value (${f.expect})`);
    const value = f.parse(text!, values[key!]);
    if (value === undefined) fail(`bad value for ${name}: ${JSON.stringify(text)} (want ${f.expect})`);
    values[key!] = value;
  }
  const result = values as FlagValues<S>;
  const problem = options.check?.(result) ?? null;
  if (problem !== null) fail(problem);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Statistics and formats
// ---------------------------------------------------------------------------------------------

export function median(values: number[]): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

/** The mean of `pick` over `items` (a round of a target run as several processes). */
export function mean<T>(items: readonly T[], pick: (item: T) => number): number {
  return items.reduce((sum, item) => sum + pick(item), 0) / items.length;
}

export const round3 = (x: number): number => Math.round(x * 1000) / 1000;
export const fmtInt = (n: number): string => Math.round(n).toLocaleString('en-US');
/** Microseconds as milliseconds. */
export const fmtMs = (us: number, digits = 3): string => (us / 1000).toFixed(digits);
/** Microseconds (CPU per request), '?' when unknown. */
export const fmtUs = (us: number | null | undefined, digits = 1): string => (us === null || us === undefined || !Number.isFinite(us) ? '?' : us.toFixed(digits));
export const fmtRatio = (x: number, digits = 3): string => `${x.toFixed(digits)}x`;
export const fmtMB = (bytes: number | null): string => (bytes === null ? '?' : (bytes / 1048576).toFixed(1));
export const pct = (share: number | null): string => (share === null ? '?' : `${Math.round(share * 100)}%`);
/** A target's verdict; a missed target is reported, never an error. */
export const metText = (ok: boolean): string => (ok ? 'met' : 'NOT met');

/** Answers by status, then what went wrong: `200:1234 errors:2 bad:1 queued:5`. */
export function statusText(r: { statuses: Record<string, number>; errors: number; badBodies: number; queued?: number }): string {
  const parts = Object.entries(r.statuses).map(([s, n]) => `${s}:${n}`);
  if (r.errors > 0) parts.push(`errors:${r.errors}`);
  if (r.badBodies > 0) parts.push(`bad:${r.badBodies}`);
  if ((r.queued ?? 0) > 0) parts.push(`queued:${r.queued}`);
  return parts.join(' ');
}

// ---------------------------------------------------------------------------------------------
// Paired rounds
// ---------------------------------------------------------------------------------------------

/** Each target's results, one per round, in round order. */
export class Rounds<T extends string, R> {
  constructor(readonly results: Record<T, R[]>) {}

  /** Rounds completed. */
  get count(): number {
    return Math.min(...Object.values<R[]>(this.results).map((rs) => rs.length));
  }

  median(target: T, pick: (r: R) => number): number {
    return median(this.results[target].map(pick));
  }

  /** The median of each round's own `a / b`: runs seconds apart, so slow drift cancels out. */
  paired(a: T, b: T, pick: (r: R) => number): number {
    return median(this.results[a].map((r, i) => pick(r) / pick(this.results[b][i]!)));
  }
}

export interface RoundsOptions<T extends string, R> {
  targets: readonly T[];
  rounds: number;
  /** Rotate the order each round (default); false keeps `targets`' order every round. */
  rotate?: boolean;
  /** Run once per target before the first round, not counted. */
  warmup?: (target: T) => Promise<unknown>;
  /** One timed run. */
  run: (target: T, round: number) => Promise<R>;
  /** After each run (a table row). */
  onRun?: (target: T, round: number, result: R) => void;
  /** After each round, with its results and order. */
  onRound?: (round: number, got: Record<T, R>, order: T[]) => void;
  /** Checked before each round: true ends the rounds early (a failure seen). */
  stop?: () => boolean;
}

/** Loads every target once per round, alternating, and keeps each target's results. */
export async function runRounds<T extends string, R>(o: RoundsOptions<T, R>): Promise<Rounds<T, R>> {
  const results = Object.fromEntries(o.targets.map((t) => [t, [] as R[]])) as Record<T, R[]>;
  if (o.warmup !== undefined) for (const t of o.targets) await o.warmup(t);
  for (let round = 0; round < o.rounds && !(o.stop?.() ?? false); round++) {
    const order = o.rotate === false ? [...o.targets] : o.targets.map((_, i) => o.targets[(i + round) % o.targets.length]!);
    const got = {} as Record<T, R>;
    for (const t of order) {
      const r = await o.run(t, round);
      got[t] = r;
      results[t].push(r);
      o.onRun?.(t, round, r);
    }
    o.onRound?.(round, got, order);
  }
  return new Rounds(results);
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

/** Runs a script's `main` and sets the exit code: its own (0 when none), 1 on a throw. */
export function runMain(label: string, main: () => Promise<number | void>): void {
  main().then((code) => {
    process.exitCode = code ?? 0;
  }, (err: unknown) => {
    process.stderr.write(`${label} failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
    process.exitCode = 1;
  });
}
