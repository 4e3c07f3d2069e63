import { StringDecoder } from 'node:string_decoder';

/**
 * Splits a server-sent-events byte stream into whole events (each ending in a blank line),
 * so a relay can look at an event before passing it on. Multi-byte characters split across
 * chunks are kept whole; CRLF line ends are normalised to LF.
 */
export class SseSplitter {
  private readonly decoder = new StringDecoder('utf8');
  private buffer = '';

  /** The complete events in `chunk` (plus what was buffered), each with its trailing "\n\n". */
  push(chunk: Buffer): string[] {
    let text = this.decoder.write(chunk);
    if (text.includes('\r')) text = text.replace(/\r\n?/g, '\n');
    this.buffer += text;
    const events: string[] = [];
    let start = 0;
    for (let end = this.buffer.indexOf('\n\n'); end !== -1; end = this.buffer.indexOf('\n\n', start)) {
      events.push(this.buffer.slice(start, end + 2));
      start = end + 2;
    }
    if (start > 0) this.buffer = this.buffer.slice(start);
    return events;
  }

  /** Whatever is left when the stream ends (an event without its blank line), or ''. */
  rest(): string {
    const rest = this.buffer + this.decoder.end();
    this.buffer = '';
    return rest.trim() === '' ? '' : `${rest.replace(/\n*$/, '')}\n\n`;
  }
}

/** The `data:` payload of an event (multi-line data joined with "\n"), or null when it has none. */
export function eventData(event: string): string | null {
  let data: string | null = null;
  for (const line of event.split('\n')) {
    if (!line.startsWith('data:')) continue;
    const value = line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5);
    data = data === null ? value : `${data}\n${value}`;
  }
  return data;
}
