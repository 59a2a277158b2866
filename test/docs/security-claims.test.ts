// docs/security.md names, for each claim, the test that proves it: a test file, then the names of
// its tests in double quotes (Go tests as `TestName`). Every file it names exists and holds every
// test name quoted after it, so a renamed or deleted test cannot leave a claim unproven unnoticed.
// Scope of a file reference: the rest of its paragraph or table cell, up to the next reference; in
// a table whose "proven by" header names a file "unless noted", quotes before any reference in a
// row's last cell belong to that file.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const ROOT = join(import.meta.dirname, '../..');
const DOC = readFileSync(join(ROOT, 'docs/security.md'), 'utf8').replace(/```[\s\S]*?```/g, '');
const TEST_FILE = /`((?:[\w.-]+\/)*[\w.-]+(?:\.test\.ts|_test\.go|\/smoke\.sh))`/g;

/** A test file named in the doc, found where the doc's short names point. */
function resolve(ref: string): string | undefined {
  const candidates = [ref, `test/integration/${ref}`, `test/cluster/${ref}`];
  return candidates.map((c) => join(ROOT, c)).find((path) => existsSync(path));
}

/** The file's text with string escapes undone, so a name quoted as 'boxd\'s' matches "boxd's". */
function source(path: string): string {
  return readFileSync(path, 'utf8').replace(/\\(['"`])/g, '$1');
}

interface Claim {
  file: string;
  names: string[];
}

/** Quoted test names ("...", wrapped lines joined) and Go test names (`TestX`) in a stretch of text. */
function namesIn(text: string): string[] {
  return [...[...text.matchAll(/"([^"]+)"/g)].map((m) => m[1]!.replace(/\s+/g, ' ')), ...[...text.matchAll(/`(Test\w+)`/g)].map((m) => m[1]!)];
}

/** Each reference to a test file with the names that follow it (paragraph by paragraph, cell by cell). */
function claims(): Claim[] {
  const out: Claim[] = [];
  let tableDefault: string | undefined;
  for (const block of DOC.split(/\n\s*\n/)) {
    const lines = block.split('\n');
    const isTable = lines.every((l) => l.trim().startsWith('|'));
    const pieces: Array<{ text: string; fallback?: string }> = [];
    if (isTable) {
      tableDefault = /`([\w./-]+\.test\.ts)` unless noted/.exec(lines[0]!)?.[1];
      for (const row of lines.slice(2)) {
        const cells = row.split(/(?<!\\)\|/).slice(1, -1);
        pieces.push({ text: cells[cells.length - 1] ?? '', ...(tableDefault ? { fallback: tableDefault } : {}) });
      }
    } else {
      pieces.push({ text: block });
    }
    for (const { text, fallback } of pieces) {
      const refs = [...text.matchAll(TEST_FILE)];
      const before = text.slice(0, refs[0]?.index ?? text.length);
      if (fallback && namesIn(before).length) out.push({ file: fallback, names: namesIn(before) });
      refs.forEach((m, i) => {
        const end = refs[i + 1]?.index ?? text.length;
        out.push({ file: m[1]!, names: namesIn(text.slice(m.index! + m[0].length, end)) });
      });
    }
  }
  return out;
}

const found = claims();

test('the manual names tests for its claims', () => {
  expect(found.length).toBeGreaterThan(30);
  expect(found.flatMap((c) => c.names).length).toBeGreaterThan(40);
});

test.each(found.map((c) => [c.file, c] as const))('%s exists and holds the tests the manual quotes', (_file, claim) => {
  const path = resolve(claim.file);
  expect({ file: claim.file, exists: Boolean(path) }).toEqual({ file: claim.file, exists: true });
  const text = source(path!);
  const missing = claim.names.filter((name) => (name.startsWith('Test') && !name.includes(' ') ? !text.includes(`func ${name}(`) : !text.includes(name)));
  expect({ file: claim.file, missing }).toEqual({ file: claim.file, missing: [] });
});
