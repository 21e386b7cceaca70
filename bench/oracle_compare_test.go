package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/oracle"
)

// TestCompareOracleWithBackendsRefusedFirst: --modes oracle with --backends is refused before
// anything is printed, in particular before the warning about external KV caches, which
// would suggest the run went ahead.
func TestCompareOracleWithBackendsRefusedFirst(t *testing.T) {
	o := DefaultOptions()
	o.Modes, o.Quiet, o.Out = []string{oracle.Name}, true, ""
	o.Backends = []string{"http://127.0.0.1:1"}
	var stdout, stderr bytes.Buffer
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Conversations: 1, Turns: 1, Users: 1}
	_, err := Compare(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), oracle.Name) {
		t.Fatalf("err %v, want the oracle refused with --backends", err)
	}
	if strings.Contains(stderr.String(), "NOT emptied") {
		t.Errorf("warned about external KV caches before refusing:\n%s", stderr.String())
	}
}

// TestCompareOracleSeveralRouters: the oracle arm behind 2 routers (one oracle shared by both)
// serves every request without error, and both routers routed some.
func TestCompareOracleSeveralRouters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Out, o.Speedup, o.Quiet = "", 50, true
	o.AllowBursts = true // 50×: counts, not latencies
	o.Modes, o.RouterReplicas = []string{oracle.Name}, 2
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Conversations: 4, Turns: 3, DocTokens: 300, OutputTokens: 8, Users: 2,
		ThinkMin: time.Millisecond, ThinkMax: 5 * time.Millisecond, thinkSet: true}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	m := rep.Modes[0]
	if m.Requests != 12 || m.Errors != 0 || len(m.RouterRequests) != 2 || m.RouterRequests[0] == 0 || m.RouterRequests[1] == 0 {
		t.Fatalf("%d requests, %d errors %v, per router %v; want 12, 0, both routers used", m.Requests, m.Errors, m.ErrorReasons, m.RouterRequests)
	}
}
