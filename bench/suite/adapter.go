package suite

// ADAPTER (issue 14, items 5 and 7): the fields below are being added to bench.Options and
// report.Mode on other branches. Until they are merged, this file is the only place that
// stands in for them; after the merge each function's body becomes the one-line use of the
// field named in its comment, and nothing else in the package changes.

import (
	"errors"
	"fmt"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/report"
)

// errNoRouterReplicas: this build's bench.Options has no RouterReplicas.
var errNoRouterReplicas = errors.New("needs bench.Options.RouterReplicas (issue 14 item 5), not in this build")

// withRouterReplicas makes o start n prefixlb routers with requests spread across them.
// After the merge: `o.RouterReplicas = n; return nil`.
func withRouterReplicas(o *bench.Options, n int) error {
	_ = o
	return fmt.Errorf("prefix×%d: %w", n, errNoRouterReplicas)
}

// modeFlags are the arm's validity flags as the bench reports them. After the merge:
// `return m.Flags` (errors, digest mismatch, no cache hits, set by bench.Compare). Until then
// they are derived here from the fields report.Mode has: every suite workload reuses prefixes
// (multi-turn histories, shared system prompts, agent contexts, the trace's shared blocks),
// so a run whose replicas reported no cached token at all did not measure caching.
func modeFlags(m report.Mode) []string {
	var f []string
	if m.Errors > 0 {
		f = append(f, fmt.Sprintf("%d errors", m.Errors))
	}
	if m.PromptTokens > 0 && m.CachedTokens == 0 {
		f = append(f, "no cache hits")
	}
	if m.UsageMissing > 0 {
		f = append(f, fmt.Sprintf("usage missing on %d", m.UsageMissing))
	}
	return f
}

// requestsDigest is the digest of the requests the arm sent, in order ("" when the bench
// does not report it). After the merge: `return m.RequestsDigest`.
func requestsDigest(m report.Mode) string {
	_ = m
	return ""
}
