// Writes a bench's results to bench/results/<name>.md and .json. A hand-written "## Notes"
// section at the end of the existing .md (history, caveats) is carried over, so a new run only
// replaces the generated part.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const NOTES = '\n## Notes';

export function writeResults(root: string, name: string, markdown: string, json: unknown): void {
  const dir = join(root, 'bench/results');
  mkdirSync(dir, { recursive: true });
  const mdPath = join(dir, `${name}.md`);
  const previous = existsSync(mdPath) ? readFileSync(mdPath, 'utf8') : '';
  const at = previous.indexOf(NOTES);
  const notes = at >= 0 ? previous.slice(at) : '';
  writeFileSync(mdPath, `${markdown.trimEnd()}\n${notes}`);
  writeFileSync(join(dir, `${name}.json`), `${JSON.stringify(json, null, 2)}\n`);
}
