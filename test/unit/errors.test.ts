import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { ERRORS, upstreamStatusSpec } from '../../src/errors.js';

const root = join(__dirname, '..', '..');

/** Rows of a markdown error table: status | type | codes (backticked, `/`-separated). */
function tableRows(markdown: string): Array<{ status: number; type: string; codes: string[] }> {
  const rows = [];
  for (const line of markdown.split('\n')) {
    const m = /^\|\s*(\d{3})\s*\|\s*([a-z_]+)\s*\|([^|]*)\|/.exec(line);
    if (m === null) continue;
    const codes = [...m[3]!.matchAll(/`([a-z_]+)`/g)].map((c) => c[1]!);
    if (codes.length > 0) rows.push({ status: Number(m[1]), type: m[2]!, codes });
  }
  return rows;
}

function assertTableMatches(markdown: string, source: string, { complete }: { complete: boolean }) {
  const rows = tableRows(markdown);
  assert.ok(rows.length > 0, `${source} has an error table`);
  const seen = new Map<string, number>();
  for (const row of rows) {
    for (const code of row.codes) {
      seen.set(code, (seen.get(code) ?? 0) + 1);
      const spec = (ERRORS as Record<string, { status: number; type: string }>)[code];
      assert.ok(spec !== undefined, `${source}: code ${code} is missing from src/errors.ts`);
      assert.equal(spec.status, row.status, `${source}: status of ${code}`);
      assert.equal(spec.type, row.type, `${source}: error.type of ${code}`);
    }
  }
  for (const [code, n] of seen) assert.equal(n, 1, `${source}: ${code} appears ${n} times`);
  if (complete) {
    for (const code of Object.keys(ERRORS)) assert.ok(seen.has(code), `${source} does not document ${code}`);
  }
}

describe('the error table', () => {
  test('README.md documents every code of src/errors.ts exactly once, with its status and type', () => {
    assertTableMatches(readFileSync(join(root, 'README.md'), 'utf8'), 'README.md', { complete: true });
  });

  test('CONTRACT.md rows are all in the table (when shared/ sits beside the repo)', (t) => {
    const contract = join(root, '..', 'shared', 'CONTRACT.md');
    if (!existsSync(contract)) return t.skip('../shared/CONTRACT.md not present');
    assertTableMatches(readFileSync(contract, 'utf8'), 'CONTRACT.md', { complete: false });
  });

  test('x-should-retry follows SPEC section 7: false on permanent codes, true on transient, absent on 500', () => {
    for (const [code, spec] of Object.entries(ERRORS)) {
      if ([400, 401, 402, 403, 404, 405, 409, 413, 422].includes(spec.status)) assert.equal(spec.retry, false, code);
      else if ([429, 502, 503, 504, 529].includes(spec.status)) assert.equal(spec.retry, true, code);
      else assert.equal(spec.retry, null, code);
    }
    assert.equal(upstreamStatusSpec(422).retry, false);
    assert.equal(upstreamStatusSpec(429).type, 'rate_limit_error');
    assert.equal(upstreamStatusSpec(418).retry, null);
  });
});
