import type { ModelEntry } from '../directory.js';
import type { ErrorCode, ErrorDetails, ErrorSpec } from '../errors.js';
import type { Usage } from '../money.js';
import type { ParsedEvents } from './sse.js';
import type { Endpoint, Exchange } from './types.js';

/**
 * An exchange that passes everything to the one it wraps: the base of the layers between a
 * billed call and its provider (a routed call, a translated one), which override what they change.
 */
export class WrappedExchange implements Exchange {
  constructor(protected readonly inner: Exchange) {}

  get endpoint(): Endpoint { return this.inner.endpoint; }
  get body(): Record<string, unknown> { return this.inner.body; }
  get text(): string { return this.inner.text; }
  get model(): ModelEntry { return this.inner.model; }
  get stream(): boolean { return this.inner.stream; }
  get requestId(): string { return this.inner.requestId; }
  get tenant(): string { return this.inner.tenant; }
  get res() { return this.inner.res; }
  get inputTokens(): number { return this.inner.inputTokens; }
  get maxOutputTokens(): number { return this.inner.maxOutputTokens; }
  get maxAttempts(): number { return this.inner.maxAttempts; }
  get parsedEvents(): ParsedEvents | undefined { return this.inner.parsedEvents; }
  get aborted(): boolean { return this.inner.aborted; }

  onAbort(stop: () => void): void { this.inner.onAbort(stop); }
  head(status: number, contentType: string, extra?: string[]): void { this.inner.head(status, contentType, extra); }
  clientEvent(event: string): string | null { return this.inner.clientEvent(event); }
  write(chunk: string, raw?: Buffer): boolean { return this.inner.write(chunk, raw); }
  whenDrained(resume: () => void): void { this.inner.whenDrained(resume); }
  end(chunk?: string | Buffer): void { this.inner.end(chunk); }
  noteOutput(chars: number): void { this.inner.noteOutput(chars); }
  noteUsage(usage: Usage): void { this.inner.noteUsage(usage); }
  noteInputCount(tokens: number, then: () => void): void { this.inner.noteInputCount(tokens, then); }
  noteUnreportedInput(tokens: number): void { this.inner.noteUnreportedInput(tokens); }
  noteDelivered(delivered: boolean): void { this.inner.noteDelivered(delivered); }
  noteSent(sent: boolean): void { this.inner.noteSent(sent); }
  observeUpstream(seconds: number): void { this.inner.observeUpstream(seconds); }
  upstreamFailed(kind: string, retryAfterMs?: number | null): void { this.inner.upstreamFailed(kind, retryAfterMs); }
  header(name: string): string | undefined { return this.inner.header(name); }
  settle(usage: Usage | null, then: () => void): void { this.inner.settle(usage, then); }
  fail(code: ErrorCode, details?: ErrorDetails): void { this.inner.fail(code, details); }
  failWith(code: string, spec: ErrorSpec, message: string): void { this.inner.failWith(code, spec, message); }
  cut(why: string, finalUsage?: Usage | null): void { this.inner.cut(why, finalUsage); }
  crash(err: unknown): void { this.inner.crash(err); }
}
