/**
 * The one error table: every error the gateway can answer with, by code.
 * Only this file knows HTTP statuses, error types and retry hints; everything else names a code.
 * CONTRACT.md section 3 is the source; test/unit/errors.test.ts keeps the two in sync.
 */

export interface ErrorSpec {
  readonly status: number;
  readonly type: string;
  /** `x-should-retry` value, or null to send none. */
  readonly retry: boolean | null;
  readonly message: string;
}

export const ERRORS = {
  invalid_request: { status: 400, type: 'invalid_request_error', retry: false, message: 'The request is invalid.' },
  invalid_json: { status: 400, type: 'invalid_request_error', retry: false, message: 'The request body is not valid JSON.' },
  invalid_idempotency_key: {
    status: 400, type: 'invalid_request_error', retry: false,
    message: 'Idempotency-Key must be one value of 1 to 255 visible ASCII characters.',
  },
  missing_api_key: {
    status: 401, type: 'authentication_error', retry: false,
    message: 'No API key: send it as "x-api-key: KEY" or "Authorization: Bearer KEY".',
  },
  invalid_api_key: { status: 401, type: 'authentication_error', retry: false, message: 'The API key is not valid.' },
  daily_cap_exceeded: {
    status: 402, type: 'billing_error', retry: false,
    message: 'The daily spend cap of this account is reached; it resets at 00:00 UTC.',
  },
  insufficient_balance: {
    status: 402, type: 'billing_error', retry: false, message: 'The prepaid balance of this account is exhausted.',
  },
  permission_denied: { status: 403, type: 'permission_error', retry: false, message: 'This key may not do that.' },
  not_found: { status: 404, type: 'not_found_error', retry: false, message: 'No such endpoint.' },
  model_not_found: {
    status: 404, type: 'not_found_error', retry: false,
    message: 'The model does not exist or this key may not use it.',
  },
  method_not_allowed: {
    status: 405, type: 'invalid_request_error', retry: false, message: 'This method is not allowed on this path.',
  },
  idempotency_conflict: {
    status: 409, type: 'idempotency_error', retry: false,
    message: 'A request with this Idempotency-Key is still executing; wait for it instead of resending.',
  },
  expectation_failed: {
    status: 417, type: 'invalid_request_error', retry: null, message: 'Only "Expect: 100-continue" is supported.',
  },
  request_timeout: {
    status: 408, type: 'invalid_request_error', retry: null, message: 'The request was not received in time.',
  },
  payload_too_large: { status: 413, type: 'request_too_large', retry: false, message: 'The request body is too large.' },
  headers_too_large: { status: 431, type: 'invalid_request_error', retry: null, message: 'The request headers are too large.' },
  rate_limit_exceeded: {
    status: 429, type: 'rate_limit_error', retry: true, message: 'Request rate limit reached; retry after the stated delay.',
  },
  concurrency_limit_exceeded: {
    status: 429, type: 'rate_limit_error', retry: true, message: 'Too many requests in flight for this plan; retry shortly.',
  },
  upstream_rate_limited: {
    status: 429, type: 'rate_limit_error', retry: true, message: 'The provider is rate limiting the gateway.',
  },
  internal_error: { status: 500, type: 'api_error', retry: null, message: 'Internal error.' },
  upstream_error: { status: 502, type: 'api_error', retry: true, message: 'The provider failed to answer properly.' },
  limiter_unavailable: {
    status: 503, type: 'overloaded_error', retry: true,
    message: 'The rate limiter is unavailable; requests are refused until it returns.',
  },
  draining: { status: 503, type: 'overloaded_error', retry: true, message: 'The gateway is shutting down.' },
  ledger_unavailable: {
    status: 503, type: 'overloaded_error', retry: true,
    message: 'The ledger cannot record charges; requests are refused until it can.',
  },
  upstream_overloaded: { status: 503, type: 'overloaded_error', retry: true, message: 'The provider is overloaded.' },
  upstream_timeout: { status: 504, type: 'timeout_error', retry: true, message: 'The provider did not answer in time.' },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERRORS;

/** Statuses that `x-should-retry` marks retryable or not (CONTRACT section 3). */
const RETRY_BY_STATUS: Record<number, boolean> = {
  400: false, 401: false, 402: false, 403: false, 404: false, 405: false, 409: false, 413: false, 422: false,
  429: true, 502: true, 503: true, 504: true, 529: true,
};

/** The spec of a provider's 4xx relayed as `upstream_<status>` (CONTRACT section 3). */
export function upstreamStatusSpec(status: number): ErrorSpec {
  return {
    status, type: status === 429 ? 'rate_limit_error' : 'invalid_request_error',
    retry: RETRY_BY_STATUS[status] ?? null, message: 'The provider rejected the request.',
  };
}

/** Extra fields of an error answer beyond the table's. */
export interface ErrorDetails {
  message?: string;
  /** Whole seconds for `Retry-After` (at least 1 is sent). */
  retryAfterS?: number;
  /** Extra members of `error` (e.g. `resets_at`, `param`). */
  fields?: Record<string, string | number | null>;
}

/**
 * A fault that maps to a contract error. Thrown only for faults; limit denials are values
 * (see limiter/types.ts), never exceptions.
 */
export class GatewayError extends Error {
  readonly code: string;
  readonly spec: ErrorSpec;
  readonly details: ErrorDetails;
  constructor(code: ErrorCode, details: ErrorDetails = {}) {
    super(details.message ?? ERRORS[code].message);
    this.name = 'GatewayError';
    this.code = code;
    this.spec = ERRORS[code];
    this.details = details;
  }
}

/** The JSON body of an error answer: the contract's envelope. */
export function errorBody(code: string, spec: ErrorSpec, requestId: string, details: ErrorDetails): string {
  const error: Record<string, unknown> = {
    type: spec.type, code, message: details.message ?? spec.message, request_id: requestId,
  };
  if (details.fields !== undefined) Object.assign(error, details.fields);
  return JSON.stringify({ type: 'error', error });
}
