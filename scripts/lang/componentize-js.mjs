// Builds one JavaScript (or TypeScript) handler into a WebAssembly component:
//   1. rolldown bundles the handler with carteiro-sdk into one ES module, resolving the
//      SDK's `#host` import with the `carteiro-wasm` condition (the real WIT imports) and
//      leaving the `carteiro:handler/*` imports to the component;
//   2. ComponentizeJS turns that module into a component of the carteiro:handler world
//      (`batch-handler` when the module exports `handleBatch`).
//
// Usage: node scripts/lang/componentize-js.mjs ENTRY.js|ENTRY.ts OUT.wasm WIT_DIR
// (run by scripts/build-lang-plugins.sh, which installs the pinned toolchain first; and,
// embedded in the binary, by `carteiro plugin build`, which runs it from a temporary folder
// whose node_modules links to the project's toolchain: keep it free of relative imports).
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';

import { componentize } from '@bytecodealliance/componentize-js';
import { rolldown } from 'rolldown';

const [entry, out, wit] = process.argv.slice(2);
if (!entry || !out || !wit) {
  console.error('usage: componentize-js.mjs ENTRY OUT.wasm WIT_DIR');
  process.exit(2);
}

const work = await mkdtemp(join(tmpdir(), 'carteiro-js-'));
try {
  // Named after the plugin so stack traces in trap reasons read `handler@enrollment-js.js:..`.
  const bundlePath = join(work, `${basename(dirname(dirname(resolve(entry))))}.js`);
  const bundle = await rolldown({
    input: resolve(entry),
    platform: 'neutral',
    external: (id) => id.startsWith('carteiro:handler/'),
    resolve: { conditionNames: ['carteiro-wasm', 'import', 'default'] },
    logLevel: 'warn',
  });
  const { output } = await bundle.write({ file: bundlePath, format: 'esm', sourcemap: false });
  await bundle.close();
  // A bundle exporting `handleBatch` (made with `batchHandler()`) is a batch handler.
  const exportsBatch = output.some((chunk) => chunk.type === 'chunk' && chunk.exports?.includes('handleBatch'));

  const { component } = await componentize({
    sourcePath: bundlePath,
    witPath: resolve(wit),
    worldName: exportsBatch ? 'batch-handler' : 'handler',
    // No fetch/HTTP in the sandbox; stdio stays for console output and the trap report.
    disableFeatures: ['http', 'fetch-event'],
  });
  await mkdir(dirname(resolve(out)), { recursive: true });
  await writeFile(out, component);
} finally {
  await rm(work, { recursive: true, force: true });
}
