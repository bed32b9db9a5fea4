// The SDK's modules import each other without a circle (docs/architecture.md,
// "The map"), like the Rust crates' check in host/src/module_graph.rs. Read from the source:
// every `import ... from`, `export ... from`, `import '...'` and `import('...')` of a file
// under src/ is an arrow; `#host` (package.json "imports") points at both backends, and the
// package's own name at its "exports".

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SRC = join(ROOT, 'src');

/** Every .js file under `dir`, as a path relative to src/ with `/` separators. */
function files(dir = SRC) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return files(path);
    return entry.name.endsWith('.js') ? [relative(SRC, path).split(sep).join('/')] : [];
  });
}

/** Every string target of a package.json "imports"/"exports" entry (conditions included). */
function targets(entry) {
  if (typeof entry === 'string') return [entry];
  if (entry && typeof entry === 'object') return Object.values(entry).flatMap(targets);
  return [];
}

/** The src/ files the specifier `spec`, written in src/`from`, may load. */
function resolveSpec(spec, from, pkg) {
  let found = [];
  if (spec.startsWith('./') || spec.startsWith('../')) {
    found = [join(dirname(join(SRC, from)), spec)];
  } else if (spec.startsWith('#')) {
    found = targets(pkg.imports?.[spec]).map((t) => join(ROOT, t));
  } else if (spec === pkg.name || spec.startsWith(`${pkg.name}/`)) {
    found = targets(pkg.exports?.[`.${spec.slice(pkg.name.length)}`]).map((t) => join(ROOT, t));
  }
  return found
    .map((path) => relative(SRC, path).split(sep).join('/'))
    .filter((path) => !path.startsWith('..'));
}

/** The specifiers `source` imports, outside comments. */
function specifiers(source) {
  const code = source
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .split('\n')
    .filter((line) => !line.trimStart().startsWith('//'))
    .join('\n');
  const patterns = [
    /\bfrom\s*['"]([^'"]+)['"]/g,
    /\bimport\s*['"]([^'"]+)['"]/g,
    /\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
  ];
  return patterns.flatMap((re) => [...code.matchAll(re)].map((m) => m[1]));
}

/** file -> the src/ files it imports. */
function graphOf(sources, pkg) {
  const graph = new Map();
  for (const [file, source] of sources) {
    const to = new Set(specifiers(source).flatMap((spec) => resolveSpec(spec, file, pkg)));
    to.delete(file);
    graph.set(file, to);
  }
  return graph;
}

/** One circle of `graph`, if it has any (depth-first search). */
function aCircle(graph) {
  const done = new Set();
  const visit = (node, path) => {
    const at = path.indexOf(node);
    if (at >= 0) return [...path.slice(at), node];
    if (done.has(node)) return undefined;
    for (const next of [...(graph.get(node) ?? [])].sort()) {
      const circle = visit(next, [...path, node]);
      if (circle) return circle;
    }
    done.add(node);
    return undefined;
  };
  for (const node of [...graph.keys()].sort()) {
    const circle = visit(node, []);
    if (circle) return circle;
  }
  return undefined;
}

const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));

test('the SDK modules import each other without a circle', () => {
  const sources = new Map(files().map((f) => [f, readFileSync(join(SRC, f), 'utf8')]));
  const graph = graphOf(sources, pkg);
  assert.ok(graph.get('kv.js').has('host/mock.js') && graph.get('kv.js').has('host/wasm.js'));
  assert.ok(graph.get('testing.js').has('host/mock.js'));
  const circle = aCircle(graph);
  assert.equal(circle, undefined, `import circle: ${circle?.join(' -> ')}; move what both need below them`);
});

test('the check finds a circle and ignores comments', () => {
  const sources = new Map([
    ['testing.js', "import {\n  MockHost,\n} from './host/mock.js';\n"],
    ['host/mock.js', "// import { run } from '../handler.js';\nimport { Limits } from '../testing.js';\n"],
    ['handler.js', "/* import * as t from './testing.js'; */\nconst m = await import('#host');\n"],
  ]);
  const graph = graphOf(sources, pkg);
  assert.deepEqual([...graph.get('handler.js')].sort(), ['host/mock.js', 'host/wasm.js']);
  assert.deepEqual(aCircle(graph), ['host/mock.js', 'testing.js', 'host/mock.js']);
  graph.get('host/mock.js').delete('testing.js');
  assert.equal(aCircle(graph), undefined);
});
