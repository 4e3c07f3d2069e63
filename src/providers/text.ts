/**
 * Reading text out of OpenAI and Anthropic request bodies: message content is a string or
 * an array of parts, of which text parts count. The mock meters with it (CONTRACT section 2);
 * the gateway's own estimates count more (estimate.ts).
 */

function partsText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  let text = '';
  for (const part of content) {
    if (part !== null && typeof part === 'object' && typeof (part as { text?: unknown }).text === 'string') {
      text += (part as { text: string }).text;
    }
  }
  return text;
}

function partsLength(content: unknown): number {
  if (typeof content === 'string') return content.length;
  if (!Array.isArray(content)) return 0;
  let n = 0;
  for (const part of content) {
    if (part !== null && typeof part === 'object' && typeof (part as { text?: unknown }).text === 'string') {
      n += (part as { text: string }).text.length;
    }
  }
  return n;
}

/** Characters of all message text, the system prompt included. */
export function inputChars(body: Record<string, unknown>): number {
  let n = partsLength(body.system);
  const messages = body.messages;
  if (Array.isArray(messages)) {
    for (const m of messages) {
      if (m !== null && typeof m === 'object') n += partsLength((m as { content?: unknown }).content);
    }
  }
  const input = body.input; // embeddings
  if (typeof input === 'string') n += input.length;
  else if (Array.isArray(input)) for (const s of input) if (typeof s === 'string') n += s.length;
  return n;
}

/** The text of the last user message ('' when there is none). */
export function lastUserText(body: Record<string, unknown>): string {
  const messages = body.messages;
  if (!Array.isArray(messages)) return '';
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as { role?: unknown; content?: unknown } | null;
    if (m !== null && typeof m === 'object' && m.role === 'user') return partsText(m.content);
  }
  return '';
}

/** The mock's token count, and the basis of every estimate: 1 token per 4 characters. */
export function tokensOf(chars: number): number {
  return Math.ceil(chars / 4);
}
