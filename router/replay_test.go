package router

// The replay test: the prefix policy's decisions for recorded states, so that a refactor of
// the cost model, of the backend state it reads or of the learning lifecycle is shown to
// decide as the code did when the states were recorded.
//
// testdata/replay/cost.jsonl.gz holds candidate snapshots as the cost model sees them (loads,
// queued prefill, KV usage, learned and pooled rates, matches, caps, near-tie options, the
// ring) and what estimate and pickCost made of each; testdata/replay/policy.jsonl.gz holds whole
// scenarios played on a Prefix policy through its public API: backends' configured and
// reported state, in-flight requests, learned rates, then a sequence of prompts (chained
// chunk hashes of conversations, shared openings, short prompts) picked, learned, unlearned
// and explained, with every Decision. Both are written by the generators (genCostCases in
// replay_cost_test.go, genScenarios in replay_policy_test.go) with
// -update-replay and must then be committed: regenerating them on changed code defeats them.
//
// Decisions, reasons, matches and token counts must be equal; estimates equal within a
// relative 1e-12 (a refactor may reorder a sum).

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"
)

var updateReplay = flag.Bool("update-replay", false, "rewrite testdata/replay/*.jsonl.gz from the generators (only on the code they are to guard)")

const replayDir = "testdata/replay"

func writeJSONL[T any](t *testing.T, name string, xs []T) {
	t.Helper()
	if err := os.MkdirAll(replayDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(replayDir, name))
	if err != nil {
		t.Fatal(err)
	}
	w := gzip.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range xs {
		if err := enc.Encode(&xs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readJSONL[T any](t *testing.T, name string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join(replayDir, name))
	if err != nil {
		t.Fatalf("%v (the recorded states are part of the repository; -update-replay writes them)", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var xs []T
	dec := json.NewDecoder(z)
	for dec.More() {
		var x T
		if err := dec.Decode(&x); err != nil {
			t.Fatalf("%s record %d: %v", name, len(xs), err)
		}
		xs = append(xs, x)
	}
	return xs
}

// sameJSON compares two JSON encodings, numbers within a relative 1e-12.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	return sameValue(x, y)
}

func sameValue(x, y any) bool {
	switch x := x.(type) {
	case float64:
		y, ok := y.(float64)
		return ok && sameFloat(x, y)
	case []any:
		y, ok := y.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := y.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if !sameValue(v, y[k]) {
				return false
			}
		}
		return true
	}
	return x == y
}

func sameFloat(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b))
}

func sameInt(a, b int64) bool { return sameFloat(float64(a), float64(b)) }
