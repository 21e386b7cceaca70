#!/usr/bin/env bash
# Runs `prefixlb bench compare` in front of 4 llm-d-inference-sim replicas (a vLLM simulator
# written by the llm-d project, not by us), one mode per invocation on fresh replicas, inside
# a loopback-only network namespace (the simulator binds all interfaces; needs root for
# `unshare -n`). Build the simulator first: ../shared/tools/peer-sim.sh (or set SIM).
#
#   bench/scripts/llmd-sim-compare.sh [bench compare flags...]
#
# With OUT=DIR each mode also writes DIR/MODE/report.json, which `go run ./bench/results
# import --claim llm-d-sim ... DIR/*/report.json` turns into bench/RESULTS.md's table.
#
# Default workload: multi-turn, 8 conversations × 30 turns, 1000-token documents, 50-token
# replies. Simulator: per-token prefill (10 ms + 2 ms/token), 20 ms ITL, 1024 blocks of 16
# tokens of KV cache, 5 running sequences.
set -euo pipefail
SIM=${SIM:-/tmp/peers/llm-d-inference-sim}
PREFIXLB=${PREFIXLB:-$(mktemp -d)/prefixlb}
MODES=${MODES:-round-robin least-load prefix}
OUT=${OUT:-}
[ -x "$SIM" ] || { echo "llm-d-inference-sim not found at $SIM: build it with ../shared/tools/peer-sim.sh" >&2; exit 2; }
cd "$(dirname "$0")/../.."
[ -x "$PREFIXLB" ] || go build -o "$PREFIXLB" .
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--conversations 8 --turns 30 --doc-tokens 1000 --output-tokens 50)

inner() { # runs inside the namespace: start 4 sims, run one mode, stop them
  ip link set lo up
  local pids=() i t
  for i in 1 2 3 4; do
    POD_IP=127.0.0.1 "$SIM" --port 1800$i --model m --enable-kvcache --latency-calculator per-token \
      --prefill-overhead 10ms --prefill-time-per-token 2ms --inter-token-latency 20ms \
      --kv-cache-size 1024 --block-size 16 --max-num-seqs 5 --force-dummy-tokenizer \
      --max-model-len 16384 --zmq-endpoint tcp://127.0.0.1:1900$i >/dev/null 2>&1 &
    pids+=($!)
  done
  for i in 1 2 3 4; do
    for t in $(seq 100); do curl -sf http://127.0.0.1:1800$i/v1/models >/dev/null && break; sleep 0.2; done
  done
  "$PREFIXLB" bench compare --model m --backends http://127.0.0.1:18001,http://127.0.0.1:18002,http://127.0.0.1:18003,http://127.0.0.1:18004 "$@" -q --out "$OUTDIR"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
export -f inner
export SIM PREFIXLB OUTDIR
echo "| mode | requests | errors | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | ITL p50 ms | E2E p95 ms | rps | out tok/s | cached-token ratio | max share / mean | routing cost s | saved prefill s |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for m in $MODES; do
  OUTDIR=${OUT:+$OUT/$m}
  unshare -n bash -c 'inner "$@"' _ "${flags[@]}" --modes "$m" 2> >(grep -v "External backends" >&2) | grep "^| $m " || echo "| $m | failed |"
done
