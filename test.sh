#!/usr/bin/env bash
# The test command from README.md: the race-enabled unit and end-to-end tests, then each fuzz
# target for a bounded time. Real sockets on 127.0.0.1 only. Tests that read ../shared skip
# with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="/usr/local/go/bin:$PATH"
go test -race -count=1 ./...
# Fuzz targets, a few seconds each (seed corpora are committed under testdata/fuzz).
fuzztime="${PREFIXLB_FUZZTIME:-10s}"
for pkg in $(go list ./...); do
  for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "fuzz $pkg $f ($fuzztime)"
    go test -run '^$' -fuzz "^${f}\$" -fuzztime "$fuzztime" "$pkg"
  done
done
