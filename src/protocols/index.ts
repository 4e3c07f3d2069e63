import { chat } from './chat/index.js';
import { embeddings } from './embeddings/index.js';
import { messages } from './messages/index.js';
import { responses } from './responses/index.js';
import type { Endpoint, WireProtocol } from './types.js';

/** Every wire protocol clients can call, by endpoint. */
export const WIRES: Readonly<Record<Endpoint, WireProtocol>> = { chat, messages, responses, embeddings };

export type { CallRequest, Checked, Endpoint, StreamWatcher, WireProtocol } from './types.js';
