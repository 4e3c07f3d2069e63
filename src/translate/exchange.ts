import type { Endpoint } from '../protocols/types.js';
import type { Usage } from '../money.js';
import type { Exchange } from '../providers/types.js';
import { WrappedExchange } from '../providers/wrapped-exchange.js';
import { MAX_PARSED_ANSWER_BYTES } from '../providers/http.js';
import { ParsedEvents } from '../providers/sse.js';
import { StreamEnded } from './common.js';
import type { TranslatedRequest, Translation, Translator } from './types.js';

/**
 * A billed call as a provider of another protocol sees it: the translated request, and answers
 * translated back on their way to the client. Everything that meters, charges and ends the call
 * is the billed call's own: usage is read in the provider's protocol, so metering stays exact.
 */
export class TranslatedCall extends WrappedExchange {
  private readonly translatedBody: Record<string, unknown>;
  private readonly translatedText: string;
  private readonly transduce: ((event: string | null) => string) | null;
  private held: { status: number; extra: string[] } | null = null;
  private readonly dropped: string[];
  /** A stream's events, read once by its watcher for the translation to take. */
  private readonly parsed: ParsedEvents | undefined;

  constructor(inner: Exchange, private readonly translator: Translator, request: TranslatedRequest, private readonly call: Translation) {
    super(inner);
    this.translatedBody = request.body;
    this.translatedText = JSON.stringify(request.body);
    // Visible ASCII only, whatever a translator names: a header value with other bytes throws.
    this.dropped = request.dropped.length > 0 ? ['x-gateway-dropped', request.dropped.join(', ').replace(/[^\x20-\x7e]/g, '?')] : [];
    this.parsed = inner.stream ? new ParsedEvents() : undefined;
    this.transduce = inner.stream ? translator.stream(call, this.parsed) : null;
  }

  override get parsedEvents(): ParsedEvents | undefined { return this.parsed; }
  /** The provider's endpoint, and the request as it takes it. */
  override get endpoint(): Endpoint { return this.translator.provider; }
  override get body(): Record<string, unknown> { return this.translatedBody; }
  override get text(): string { return this.translatedText; }
  /**
   * None of the client's headers: they are of its own protocol, and the provider gets its
   * protocol's defaults (found in review: a Chat client's `anthropic-beta` reached Anthropic,
   * and could switch on long-context prices no model's price covers).
   */
  override header(_name: string): string | undefined { return undefined; }

  override head(status: number, contentType: string, extra: string[] = []): void {
    // A whole answer is sent at `end`, once translated (its length changes): also when a
    // stream was asked for and the provider answered whole (a compatible server that ignores
    // `stream`), which the client then gets whole too, as it would from that provider.
    if (this.transduce === null || !contentType.startsWith('text/event-stream')) this.held = { status, extra };
    else this.inner.head(status, contentType, [...extra, ...this.dropped]);
  }

  /** One provider event in the client's protocol; null when it could not be translated (the call has then ended). */
  override clientEvent(event: string): string | null {
    try {
      // No transducer: a whole answer was asked for and a stream came. Calling it throws.
      return this.transduce!(event);
    } catch (err) {
      this.cutUntranslated(err);
      return null;
    }
  }

  /** A stream's end: the text given (already the client's), then what the client's protocol needs to end. */
  override end(chunk?: string | Buffer): void {
    if (this.transduce !== null && this.held === null) {
      let tail: string;
      try {
        tail = this.transduce(null);
      } catch (err) {
        return this.cutUntranslated(err);
      }
      this.inner.end(`${chunk === undefined ? '' : chunk.toString()}${tail}`);
      return;
    }
    if (chunk !== undefined && chunk.length > MAX_PARSED_ANSWER_BYTES) {
      return this.inner.fail('upstream_error', { message: 'The provider\'s answer is too large to translate.' });
    }
    let body: string;
    try {
      const json = JSON.parse(chunk === undefined ? '' : chunk.toString()) as Record<string, unknown>;
      body = JSON.stringify(this.translator.answer(json, this.call));
    } catch {
      // Not JSON, or JSON too deeply nested to rebuild: the client cannot be given it.
      return this.inner.fail('upstream_error', { message: 'The provider\'s answer could not be translated.' });
    }
    const held = this.held ?? { status: 200, extra: [] };
    const extra: string[] = [];
    for (let i = 0; i + 1 < held.extra.length; i += 2) {
      if (held.extra[i] !== 'content-length') extra.push(held.extra[i]!, held.extra[i + 1]!);
    }
    this.inner.head(held.status, 'application/json', [...extra, 'content-length', String(Buffer.byteLength(body)), ...this.dropped]);
    this.inner.end(body);
  }

  /**
   * The provider's stream broke off. Before anything was sent (a whole answer was asked for
   * and a stream came), the client gets the error rather than a dropped connection; the charge
   * is the same: the usage the stream gave, or the abnormal-end estimate.
   */
  override cut(why: string, finalUsage: Usage | null = null): void {
    if (this.held === null) return this.inner.cut(why, finalUsage);
    const fail = () => this.inner.fail('upstream_error', { message: `The provider's answer was cut off: ${why}.` });
    if (finalUsage === null) return fail();
    this.inner.settle(finalUsage, fail);
  }

  /**
   * A stream that cannot be translated (or ended before its final event) is cut, as a
   * passthrough one breaks off; before anything was sent (a stream where a whole answer was
   * asked for), the client gets the error instead.
   */
  private cutUntranslated(err: unknown): void {
    if (this.held !== null) return this.inner.fail('upstream_error', { message: 'The provider\'s answer could not be translated.' });
    this.inner.cut(err instanceof StreamEnded ? err.message : 'the provider\'s stream could not be translated');
  }
}
