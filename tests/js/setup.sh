#!/usr/bin/env bash
# Installs the pinned x402 reference packages (@x402/fetch, @x402/evm, @x402/express, …)
# used by mindxtrain's x402 tests and benchmark, and playwright-core for the Coach UI test. Needs Node >= 20 and the npm registry once.
set -euo pipefail
cd "$(dirname "$0")"
# npm ci wipes node_modules: skip it when the pinned versions are already there.
if [[ -f node_modules/@x402/fetch/package.json && -f node_modules/@x402/express/package.json ]] &&
  grep -q '"version": "2.27.0"' node_modules/@x402/fetch/package.json &&
  grep -q '"version": "1.64.1"' node_modules/playwright-core/package.json 2>/dev/null; then
  exit 0
fi
npm ci --ignore-scripts --no-audit --no-fund
