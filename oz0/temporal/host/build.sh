#!/usr/bin/env bash
# Builds oz0-temporal-host into ./bin (gitignored). Needs Go >= the version in go.mod and
# the Go module proxy (first build downloads and compiles Temporal: several minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/oz0-temporal-host .
echo "built $(pwd)/bin/oz0-temporal-host"
