#!/usr/bin/env bash
# The test command from README.md: the race-enabled unit and end-to-end tests, the tests that
# skip under -race run once without it, then each fuzz target for a bounded number of runs. Real sockets
# on 127.0.0.1 only. Tests that read ../shared skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="/usr/local/go/bin:$PATH"
go test -race -count=1 ./...
# Tests guarded by raceEnabled (a measurement the detector distorts: heap bytes per index
# entry, allocations per key build) skip above; run each of them here without -race. They are
# found by name: every Test function whose body mentions raceEnabled.
for dir in $(grep -rl --include='*_test.go' 'raceEnabled' . | xargs -n1 dirname | sort -u); do
  tests=$(awk '/^func Test/ { name = $2; sub(/\(.*/, "", name) } /^}/ { name = "" } /raceEnabled/ && name != "" { print name }' "$dir"/*_test.go | sort -u | paste -sd '|')
  if [ -n "$tests" ]; then
    echo "no race: $dir ($tests)"
    go test -count=1 -run "^(${tests})\$" "$dir"
  fi
done
# Fuzz targets, a few seconds each (seed corpora are committed under testdata/fuzz). The
# budget is a count of executions, not a duration: with a duration, Go 1.26's fuzz coordinator
# can report its own end-of-fuzztime deadline as a failure ("context deadline exceeded", no
# crasher written; golang/go#75804, fixed in Go 1.27) when a busy machine stalls a worker.
# 50000 runs take ≈5–10 s per target here.
fuzztime="${PREFIXLB_FUZZTIME:-50000x}"
for pkg in $(go list ./...); do
  for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "fuzz $pkg $f ($fuzztime)"
    go test -run '^$' -fuzz "^${f}\$" -fuzztime "$fuzztime" -timeout 5m "$pkg"
  done
done
