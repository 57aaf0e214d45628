#!/usr/bin/env bash
# Builds the load generator oz0-loadgen into ./bin (gitignored), for the benchmarks and
# tests only (not part of an install). Needs Go >= the version in go.mod; Go's build cache
# makes it quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/oz0-loadgen .
echo "built $(pwd)/bin/oz0-loadgen"
