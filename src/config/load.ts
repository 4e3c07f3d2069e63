import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { validateConfig, type ValidateResult } from './validate.js';

/**
 * Reads and validates a config file. Never throws: an unreadable or unparsable file is
 * reported like any other problem, so the CLI can print it and exit 1.
 */
export function loadConfigFile(file: string, env: Record<string, string | undefined> = process.env): ValidateResult {
  const path = resolve(file);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    return { ok: false, errors: [`${file}: cannot read: ${(err as Error).message}`] };
  }
  let raw: unknown;
  try {
    // A byte order mark (some editors on Windows write one) is not part of the JSON.
    raw = JSON.parse(text.charCodeAt(0) === 0xfeff ? text.slice(1) : text);
  } catch (err) {
    return { ok: false, errors: [`${file}: not valid JSON: ${(err as Error).message}`] };
  }
  return validateConfig(raw, { baseDir: dirname(path), env });
}
