// Builds the tab into one self-contained ES module, plugin/static/index.js, beside the licences of
// the code bundled into it. Deterministic: pinned esbuild, no timestamps, paths relative to this
// folder, so `npm ci && npm run build` reproduces the committed files byte for byte.
//
//   node build.mjs [--outdir DIR]     (default: ../plugin/static)

import { build } from 'esbuild';
import { mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const flag = process.argv.indexOf('--outdir');
const outdir = resolve(flag > 0 ? process.argv[flag + 1] : join(here, '..', 'plugin', 'static'));

/** Bundled packages whose licences must travel with the bundle, and their licence files. */
const LICENSES = [
  ['echarts', ['LICENSE', 'NOTICE']],
  ['zrender', ['LICENSE', 'NOTICE']],
  ['tslib', ['LICENSE.txt']],
];

await mkdir(outdir, { recursive: true });
for (const name of await readdir(outdir)) await rm(join(outdir, name), { recursive: true });

await build({
  absWorkingDir: here,
  entryPoints: ['src/index.ts'],
  outfile: join(outdir, 'index.js'),
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: 'es2020',
  minify: true,
  legalComments: 'none', // the licences are in THIRD_PARTY_NOTICES.txt beside the bundle
  charset: 'utf8',
  loader: { '.css': 'text' },
  define: { 'process.env.NODE_ENV': '"production"' },
  logLevel: 'warning',
});

let notices = 'Third-party code bundled into index.js, with its licence.\n';
for (const [pkg, files] of LICENSES) {
  const { version, license } = JSON.parse(await readFile(join(here, 'node_modules', pkg, 'package.json'), 'utf8'));
  notices += `\n${'='.repeat(78)}\n${pkg} ${version} (${license})\n${'='.repeat(78)}\n`;
  for (const file of files) {
    const text = await readFile(join(here, 'node_modules', pkg, file), 'utf8').catch(() => null);
    if (text !== null) notices += `\n${text.trim()}\n`;
  }
}
await writeFile(join(outdir, 'THIRD_PARTY_NOTICES.txt'), notices);
