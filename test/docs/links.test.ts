// The README and the manuals in docs/ point at things that exist: every relative link names a
// file (and a heading, with #anchor), every repository path in `code` exists, and every
// `npm run <script>` is a script of package.json. External links are not fetched.
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

const ROOT = join(import.meta.dirname, '../..');
const DOCS = ['README.md', ...readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];
const SCRIPTS = Object.keys((JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts);

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes. */
const slug = (heading: string) =>
  heading
    .trim()
    .toLowerCase()
    .replace(/[`*_]/g, '')
    .replace(/[^\p{L}\p{N} -]/gu, '')
    .replace(/ /g, '-');

function headings(file: string): Set<string> {
  const text = readFileSync(file, 'utf8').replace(/```[\s\S]*?```/g, '');
  return new Set([...text.matchAll(/^#{1,6} (.+)$/gm)].map((m) => slug(m[1]!)));
}

/** Text outside fenced code blocks, where links and code spans are prose. */
const prose = (text: string) => text.replace(/```[\s\S]*?```/g, '');

describe.each(DOCS)('%s', (doc) => {
  const file = join(ROOT, doc);
  const text = readFileSync(file, 'utf8');

  test('relative links name files and headings that exist', () => {
    const broken: string[] = [];
    for (const [, target] of prose(text).matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue; // http(s), mailto: not fetched
      const [path, anchor] = target!.split('#');
      const resolved = path ? join(dirname(file), path) : file;
      if (!existsSync(resolved)) broken.push(`${target} (no ${relative(ROOT, resolved)})`);
      else if (anchor && resolved.endsWith('.md') && !headings(resolved).has(anchor)) broken.push(`${target} (no heading #${anchor})`);
    }
    expect(broken).toEqual([]);
  });

  test('repository paths in code spans exist', () => {
    const missing = [...prose(text).matchAll(/`((?:bridge|operator|client|common|boxd|charts|manifests|test|bench|docs|scripts|\.ci)\/[\w./-]*)`/g)]
      .map((m) => m[1]!)
      .filter((path) => !path.includes('<') && !existsSync(join(ROOT, path)));
    expect(missing).toEqual([]);
  });

  test('npm run names scripts of package.json', () => {
    const unknown = [...text.matchAll(/npm run ([\w:-]+)/g)].map((m) => m[1]!).filter((name) => !SCRIPTS.includes(name));
    expect(unknown).toEqual([]);
  });
});
