#!/usr/bin/env node
// Canonical contract artifacts for the Rust side (alloy `sol!` reads them).
//
//   node tools/artifacts.js export <forge-out-dir> <artifacts-dir>   write/refresh the committed files
//   node tools/artifacts.js check  <forge-out-dir> <artifacts-dir>   exit 1 if any committed file is stale
//
// A canonical artifact keeps only what is a pure function of the sources and compiler settings:
// { abi, bytecode: { object }, deployedBytecode: { object }, methodIdentifiers }. forge's own
// artifacts also carry the source-unit id, source maps and metadata, which change whenever the set
// of compiled files changes, so they are not committed (contracts/out stays ignored).
'use strict';

const fs = require('fs');
const path = require('path');

// <File>.sol/<Contract>.json, relative to both directories.
const CONTRACTS = [
  'Registry.sol/Registry.json',
  'TestUSDC.sol/TestUSDC.json',
  'X402Receiver.sol/X402Receiver.json',
  'StructRegistry.sol/StructRegistry.json',
];

function canonical(forgeArtifactPath) {
  const a = JSON.parse(fs.readFileSync(forgeArtifactPath, 'utf8'));
  const obj = (x) => (typeof x === 'string' ? x : x && x.object);
  const out = {
    abi: a.abi,
    bytecode: { object: obj(a.bytecode) },
    deployedBytecode: { object: obj(a.deployedBytecode) },
    methodIdentifiers: a.methodIdentifiers || {},
  };
  if (!Array.isArray(out.abi) || !/^0x[0-9a-f]+$/.test(out.bytecode.object || '') ||
      !/^0x[0-9a-f]+$/.test(out.deployedBytecode.object || '')) {
    throw new Error(forgeArtifactPath + ': missing abi or bytecode (unlinked libraries are not supported)');
  }
  return JSON.stringify(out, null, 2) + '\n';
}

function main() {
  const [mode, outDir, destDir] = process.argv.slice(2);
  if (!['export', 'check'].includes(mode) || !outDir || !destDir) {
    process.stderr.write('usage: artifacts.js export|check <forge-out-dir> <artifacts-dir>\n');
    process.exit(2);
  }
  let stale = 0;
  for (const rel of CONTRACTS) {
    const src = path.join(outDir, rel);
    const dest = path.join(destDir, rel);
    if (!fs.existsSync(src)) {
      process.stderr.write('missing forge artifact ' + src + '\n');
      process.exit(1);
    }
    const want = canonical(src);
    const have = fs.existsSync(dest) ? fs.readFileSync(dest, 'utf8') : null;
    if (have === want) {
      console.log('  up to date  ' + dest);
      continue;
    }
    if (mode === 'export') {
      fs.mkdirSync(path.dirname(dest), { recursive: true });
      fs.writeFileSync(dest, want);
      console.log('  written     ' + dest + (have === null ? ' (new)' : ' (changed: commit it)'));
    } else {
      stale++;
      console.log('  STALE       ' + dest + (have === null ? ' (missing)' : ' (differs from a fresh build)'));
    }
  }
  if (stale) {
    process.stderr.write(stale + ' committed artifact(s) are stale: run scripts/setup-contracts and commit ' +
      destDir + '\n');
    process.exit(1);
  }
}

main();
