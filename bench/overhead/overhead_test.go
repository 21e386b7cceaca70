package overhead

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/overhead/agentbody"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router/key"
)

// sink keeps the busy loop of TestProcParsing from being optimised away.
var sink uint64

func approx(p *float64, want float64) bool { return p != nil && math.Abs(*p-want) < 1e-9 }

func TestDerive(t *testing.T) {
	rows := []Row{
		{Target: TargetDirect, BodyBytes: 1024, RPS: 40000, LatRequests: 10, P50us: 100, P99MedUs: 300},
		{Target: TargetHAProxy, BodyBytes: 1024, RPS: 20000, LatRequests: 10, P50us: 200, P99MedUs: 700},
		{Target: TargetPrefixlbPfx, BodyBytes: 1024, RPS: 16000, LatRequests: 10, P50us: 250, P99MedUs: 900},
		// Another size without haproxy: ratios against it stay nil.
		{Target: TargetDirect, BodyBytes: 2048, RPS: 1000, LatRequests: 10, P50us: 100, P99MedUs: 200},
		{Target: TargetPrefixlbRR, BodyBytes: 2048, RPS: 500, LatRequests: 10, P50us: 160, P99MedUs: 260},
	}
	Derive(rows)
	d, h, p, rr := &rows[0], &rows[1], &rows[2], &rows[4]
	if !approx(d.RPSvsDirect, 1) || !approx(d.AddedP50us, 0) || !approx(d.RPSvsHAProxy, 2) {
		t.Errorf("direct: %+v", d)
	}
	if !approx(h.RPSvsHAProxy, 1) || !approx(h.AddedP50us, 100) || !approx(h.AddedP99us, 400) || !approx(h.AddedP50vsHAProxy, 1) {
		t.Errorf("haproxy: %+v", h)
	}
	if !approx(p.RPSvsDirect, 0.4) || !approx(p.RPSvsHAProxy, 0.8) || !approx(p.AddedP50us, 150) || !approx(p.AddedP99us, 600) ||
		!approx(p.AddedP50vsHAProxy, 1.5) || !approx(p.AddedP99vsHAProxy, 1.5) || !approx(p.P50vsHAProxy, 1.25) {
		t.Errorf("prefix: %+v", p)
	}
	if !approx(rr.RPSvsDirect, 0.5) || !approx(rr.AddedP50us, 60) || rr.RPSvsHAProxy != nil || rr.AddedP50vsHAProxy != nil {
		t.Errorf("rr without haproxy: %+v", rr)
	}

	// A reference with no successful requests gives no ratios.
	rows = []Row{{Target: TargetDirect, BodyBytes: 1, RPS: 0}, {Target: TargetPrefixlbRR, BodyBytes: 1, RPS: 5, LatRequests: 1}}
	Derive(rows)
	if rows[1].RPSvsDirect != nil || rows[1].AddedP50us != nil {
		t.Errorf("ratios against an empty reference: %+v", rows[1])
	}
}

func TestChecksAndMarkdown(t *testing.T) {
	rep := &Report{
		Rows: []Row{
			{Target: TargetDirect, BodyBytes: 16 << 10, RPS: 30000, LatRequests: 5, P50us: 100, P99MedUs: 400},
			{Target: TargetPrefixlbPfx, BodyBytes: 16 << 10, RPS: 10000, LatRequests: 5, P50us: 180, P99MedUs: 900},
			{Target: TargetHAProxyTCP, BodyBytes: 16 << 10, RPS: 25000, LatRequests: 5, P50us: 170, P99MedUs: 500},
			{Target: TargetHAProxy, BodyBytes: 16 << 10, RPS: 20000, LatRequests: 5, P50us: 200, P99MedUs: 600},
			{Target: TargetHAProxy, BodyBytes: 1 << 10, RPS: 20000, LatRequests: 5, P50us: 150},
			{Target: TargetPrefixlbPfx, BodyBytes: 1 << 10, RPS: 15000, LatRequests: 5, P50us: 160},
		},
		Routing: []RoutingResult{{BodyBytes: 128 << 10, Chunks: 511, P50us: 120, P99us: 200}},
		Index:   &IndexMemory{Entries: 1_000_000, BytesPerEntry: 64.5},
	}
	Derive(rep.Rows)
	rep.Checks = Checks(rep)
	// p50 +80 ≤ 100, p99 +500 ≤ 1000, floor +70 (context: no verdict), +80 vs HAProxy's
	// +100 = 0.80× ≤ 1, 0.75× ≥ 0.7, 120 ≤ 300, 1 MB not measured, 64.5 ≤ 100
	want := []*bool{met(true), met(true), nil, met(true), met(true), met(true), nil, met(true), nil}
	if len(rep.Checks) != len(want) {
		t.Fatalf("%d checks, want %d", len(rep.Checks), len(want))
	}
	for i, c := range rep.Checks {
		if (c.Met == nil) != (want[i] == nil) || (c.Met != nil && *c.Met != *want[i]) {
			t.Errorf("check %q: met %v, want %v (got %s)", c.Name, c.Met, want[i], c.Got)
		}
	}
	if c := rep.Checks[2]; c.Got != "+70 µs" {
		t.Errorf("floor check got %q, want +70 µs", c.Got)
	}
	rep.Rows[1].P50us = 260 // +160 µs: not met
	Derive(rep.Rows)
	if c := Checks(rep)[0]; c.Met == nil || *c.Met {
		t.Errorf("p50 +160 µs counted as met: %+v", c)
	}

	rep.Checks = Checks(rep)
	md := Markdown(rep)
	for _, s := range []string{"| body | target | req/s (sat)", "| 16 KB | prefixlb-prefix | 10000 |", "| 128 KB | 511 |", "64.5 heap bytes/entry", "**no**"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}

	// Nothing measured: every check says so, none claims a result.
	for _, c := range Checks(&Report{}) {
		if c.Met != nil || c.Got != "not measured" {
			t.Errorf("empty report: %+v", c)
		}
	}
}

// TestHAProxyConfig checks the generated configurations' text; TestHAProxyConfigValid has
// haproxy itself validate them.
func TestHAProxyConfig(t *testing.T) {
	for _, tt := range []struct {
		tcp       bool
		want, not []string
	}{
		{false, []string{"mode http", "option http-no-delay"}, []string{"mode tcp"}},
		{true, []string{"mode tcp"}, []string{"mode http", "http-no-delay"}},
	} {
		cfg := HAProxyConfig(19001, []string{"http://127.0.0.1:8001", "http://127.0.0.1:8002"}, tt.tcp)
		for _, s := range append(tt.want, "bind 127.0.0.1:19001", "balance roundrobin", "server s0 127.0.0.1:8001", "server s1 127.0.0.1:8002") {
			if !strings.Contains(cfg, s) {
				t.Errorf("tcp=%v: config lacks %q:\n%s", tt.tcp, s, cfg)
			}
		}
		for _, s := range tt.not {
			if strings.Contains(cfg, s) {
				t.Errorf("tcp=%v: config has %q:\n%s", tt.tcp, s, cfg)
			}
		}
	}
}

// TestHAProxyConfigValid: haproxy -c accepts both generated configurations.
func TestHAProxyConfigValid(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed: the generated configurations are not validated by haproxy -c (TestHAProxyConfig checks their text)")
	}
	for _, tcp := range []bool{false, true} {
		cfg := HAProxyConfig(19001, []string{"http://127.0.0.1:8001", "http://127.0.0.1:8002"}, tcp)
		p := filepath.Join(t.TempDir(), "haproxy.cfg")
		if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "-c", "-q", "-f", p).CombinedOutput(); err != nil {
			t.Errorf("tcp=%v: haproxy -c: %v: %s", tcp, err, out)
		}
	}
}

func TestProcParsing(t *testing.T) {
	stat := []byte("4242 (prefix lb) (x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0 100 0 0")
	d, err := parseStatCPU(stat)
	if err != nil || d != 3250*time.Millisecond {
		t.Errorf("parseStatCPU = %v, %v; want 3.25s", d, err)
	}
	if _, err := parseStatCPU([]byte("garbage")); err == nil {
		t.Error("parseStatCPU accepted garbage")
	}
	status := []byte("Name:\tprefixlb\nVmPeak:\t  900 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n")
	if n, err := parseStatusKB(status, "VmHWM"); err != nil || n != 20480<<10 {
		t.Errorf("VmHWM = %d, %v", n, err)
	}
	if _, err := parseStatusKB(status, "VmSwap"); err == nil {
		t.Error("missing field found")
	}
	// This process: CPU time moves forward under a busy loop (in clock ticks, so spin until it
	// does; bounded), peak RSS is there.
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	after, spins := before, 0
	for end := time.Now().Add(30 * time.Second); after <= before && time.Now().Before(end); spins++ {
		x := uint64(spins)
		for i := range 1 << 20 {
			x = x*6364136223846793005 + uint64(i)
		}
		sink = x
		if after, err = procCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after <= before {
		t.Errorf("procCPU stayed at %v over %d busy loops", before, spins)
	}
	// A target with a peer process counts both: here this process twice, each reading at
	// least the one before and at most the one after.
	both, err := (&target{pid: os.Getpid(), peerPid: os.Getpid()}).cpu()()
	if err != nil {
		t.Fatal(err)
	}
	last, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if both < 2*after || both > 2*last {
		t.Errorf("a target and its peer read %v of CPU; want both processes' (2 × %v to 2 × %v)", both, after, last)
	}
	if _, err := (&target{pid: os.Getpid(), peerPid: -1}).cpu()(); err == nil {
		t.Error("a peer that cannot be read: no error")
	}
	if n, err := peakRSS(os.Getpid()); err != nil || n <= 0 {
		t.Errorf("peakRSS = %d, %v", n, err)
	}
}

func TestParseSizesAndMedian(t *testing.T) {
	got, err := parseSizes("1k, 16384,128K,1m,2M")
	if want := []int{1024, 16384, 128 << 10, 1 << 20, 2 << 20}; err != nil || !slices.Equal(got, want) {
		t.Errorf("parseSizes = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"1x", "0", "-1k", "m", "2048m", "1.5m"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes accepted %q", bad)
		}
	}
	if m := report.Median([]float64{5, 1, 3}); m != 3 {
		t.Errorf("median = %v", m)
	}
	if m := report.Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median = %v", m)
	}
}

// The command's defaults take 1 MB, with agent bodies from there on; a size that would get
// agent bodies below their minimum is refused before anything starts.
func TestOptionsSizes(t *testing.T) {
	o := DefaultOptions()
	if !slices.Contains(o.Sizes, 1<<20) || !o.agent(1<<20) || o.agent(128<<10) {
		t.Fatalf("defaults: sizes %v, agent from %d", o.Sizes, o.AgentFrom)
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	for _, size := range o.Sizes {
		wl, err := o.workload(size)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: ShapeAgent, false: ShapeChat}[size >= 1<<20]; wl.Shape() != want {
			t.Errorf("size %d: shape %s, want %s", size, wl.Shape(), want)
		}
	}
	o.Sizes, o.AgentFrom = []int{4 << 10}, 1<<10
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "agent") {
		t.Errorf("4 KiB agent bodies accepted: %v", err)
	}
	o.AgentFrom = 0
	if err := o.validate(); err != nil {
		t.Errorf("4 KiB chat bodies refused: %v", err)
	}

	// The flags: a bad size is an error before anything starts.
	for _, tt := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--sizes", "1m", "--agent-from", "2x"}, "--agent-from"},
		{[]string{"--sizes", "1q"}, "--sizes"},
		{[]string{"--sizes", "4k", "--agent-from", "1k"}, "agent"},
	} {
		c := Command()
		c.SetArgs(append(tt.args, "--targets", "none")) // should validation let one pass: no run, an error
		c.SetContext(context.Background())
		c.SetOut(io.Discard)
		c.SetErr(io.Discard)
		if err := c.Execute(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one about %s", tt.args, err, tt.want)
		}
	}
}

// At 1 MB the harness's bodies are an agent's: valid JSON with tools, at most 1 MiB, each
// extending the previous request of its session (agentbody's tests check the shape in
// detail).
func TestWorkloadAgentBodies(t *testing.T) {
	wl, err := NewWorkload(1<<20, WorkloadOptions{Agent: true, StreamFraction: 0.5, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var prev, cur []byte
	kb := key.NewBuilder(0)
	var k key.Key
	for i := uint64(100); i < 140; i++ {
		cur, _ = wl.Body(cur, i)
		if len(cur) > 1<<20 || len(cur) < 900<<10 {
			t.Fatalf("body %d: %d bytes", i, len(cur))
		}
		var v struct {
			Tools    []json.RawMessage `json:"tools"`
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(cur, &v); err != nil || len(v.Tools) == 0 || len(v.Messages) < 10 || v.Messages[len(v.Messages)-1].Role != "tool" {
			t.Fatalf("body %d: %v, %d tools, %d messages", i, err, len(v.Tools), len(v.Messages))
		}
		kb.Build([]byte(chatPath), cur, &k)
		if !k.OK || len(k.Chunks) < key.ChunkCount(768<<10, key.DefaultChunkTokens*key.BytesPerToken) {
			t.Fatalf("body %d: key OK %v, %d chunks", i, k.OK, len(k.Chunks))
		}
		prev, _ = wl.Body(prev, i-agentbody.DefaultSessions)
		if !bytes.HasPrefix(cur, prev[:len(prev)-len("]}")]) {
			t.Fatalf("body %d does not extend body %d, the previous request of its session", i, i-agentbody.DefaultSessions)
		}
	}
}

// Bodies come out near the requested size, are valid chat requests, and share their system
// prompt's chunks while the user turn makes each one unique.
func TestWorkloadBodies(t *testing.T) {
	for _, size := range []int{1 << 10, 16 << 10, 128 << 10} {
		wl, err := NewWorkload(size, WorkloadOptions{SystemPrompts: 2, StreamFraction: 0.5, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		kb := key.NewBuilder(0)
		var k0, k1 key.Key
		var buf []byte
		streams, shared := 0, 0
		for i := range uint64(40) {
			var stream bool
			buf, stream = wl.Body(buf, i)
			if n := len(buf); n < size*9/10 || n > size*11/10 {
				t.Fatalf("size %d: body %d is %d bytes", size, i, n)
			}
			var v struct {
				Model    string `json:"model"`
				Stream   bool   `json:"stream"`
				Messages []struct{ Role, Content string }
			}
			if err := json.Unmarshal(buf, &v); err != nil || len(v.Messages) != 2 || v.Stream != stream {
				t.Fatalf("size %d: body %d: %v %+v", size, i, err, v)
			}
			if stream {
				streams++
			}
			if i == 0 {
				kb.Build([]byte(chatPath), buf, &k0)
				continue
			}
			kb.Build([]byte(chatPath), buf, &k1)
			if !k1.OK || len(k1.Chunks) == 0 {
				t.Fatalf("size %d: no routing key", size)
			}
			if k1.Chunks[len(k1.Chunks)-1] == k0.Chunks[len(k0.Chunks)-1] {
				t.Fatalf("size %d: bodies 0 and %d end alike", size, i)
			}
			// Chunk 1: the first, 4 tokens, is the role and a word that both system prompts
			// open with.
			if len(k1.Chunks) > 1 && len(k0.Chunks) > 1 && k1.Chunks[1] == k0.Chunks[1] {
				shared++
			}
		}
		if streams == 0 || streams == 40 {
			t.Errorf("size %d: %d of 40 streamed, want a mix", size, streams)
		}
		if shared == 0 || shared == 39 {
			t.Errorf("size %d: %d of 39 share body 0's system prompt, want some (2 prompts)", size, shared)
		}
		b1, _ := wl.Body(nil, 12345)
		b2, _ := wl.Body(nil, 12345)
		if !bytes.Equal(b1, b2) {
			t.Errorf("size %d: body 12345 not reproducible", size)
		}
	}
}

// keyFixture is a body of this benchmark's workload, committed for router/key's tests and
// benchmarks (which cannot import this package): they check that the key's fast path takes
// what the overhead benchmark sends.
const keyFixture = "../../router/key/testdata/overhead_chat_16k.json"

// TestKeyFixtureIsWorkloadBody: the committed fixture is byte for byte what Workload makes
// now. PREFIXLB_UPDATE_FIXTURES=1 rewrites it after a deliberate change to the workload.
func TestKeyFixtureIsWorkloadBody(t *testing.T) {
	wl, err := NewWorkload(16<<10, WorkloadOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := wl.Body(nil, 42)
	if os.Getenv("PREFIXLB_UPDATE_FIXTURES") != "" {
		if err := os.WriteFile(keyFixture, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(keyFixture)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("%s (%d bytes) is not what Workload makes now (%d bytes); rerun with PREFIXLB_UPDATE_FIXTURES=1 to regenerate it", keyFixture, len(got), len(body))
	}
}

// Every round runs each target once, and over as many rounds as targets each target runs
// once in every position, at every body size.
func TestRoundOrder(t *testing.T) {
	for _, n := range []int{1, 3, 5} {
		for si := range 4 {
			seen := make([][]bool, n) // seen[target][position]
			for i := range seen {
				seen[i] = make([]bool, n)
			}
			for r := range n {
				inRound := make([]bool, n)
				for j := range n {
					k := roundOrder(j, r, si, n)
					if inRound[k] {
						t.Fatalf("n %d size %d round %d: target %d runs twice", n, si, r, k)
					}
					inRound[k], seen[k][j] = true, true
				}
			}
			for k := range seen {
				if slices.Contains(seen[k], false) {
					t.Errorf("n %d size %d: target %d missed a position over %d rounds: %v", n, si, k, n, seen[k])
				}
			}
		}
	}
}

// The whole command, tiny, at 1 MB: coding-agent bodies go through the zero-latency backends,
// prefixlb in mode prefix (in-process) and, when installed, HAProxy, without an error, and
// the prefix policy finds each session's previous request. Counts and structure, never timings.
func TestSmokeRunAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers and sends 1 MB requests for a few seconds")
	}
	o := DefaultOptions()
	o.Sizes = []int{1 << 20}
	o.Targets = []string{TargetDirect, TargetPrefixlbPfx}
	if _, err := exec.LookPath("haproxy"); err == nil {
		o.Targets = append(o.Targets, TargetHAProxy)
	}
	o.Conns = 2
	o.Rounds = 1
	o.Round = 300 * time.Millisecond
	o.Warmup = 50 * time.Millisecond
	o.Rate = 50
	o.IndexEntries = 0
	o.RoutingN = 100
	o.Out = t.TempDir()
	var log bytes.Buffer
	rep, err := Run(context.Background(), o, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(rep.Rows) != len(o.Targets) {
		t.Fatalf("%d rows, want %d", len(rep.Rows), len(o.Targets))
	}
	for _, r := range rep.Rows {
		if r.Shape != ShapeAgent || r.SatRequests <= 0 || r.LatRequests <= 0 || r.SatErrors+r.LatErrors != 0 {
			t.Errorf("%s: row %+v", r.Target, r)
		}
		if r.Target == TargetPrefixlbPfx && r.Routes["match"] == 0 {
			t.Errorf("prefixlb-prefix routes = %v: no request matched its session's previous one", r.Routes)
		}
	}
	if len(rep.Routing) != 1 || rep.Routing[0].Shape != ShapeAgent || rep.Routing[0].Chunks < key.ChunkCount(768<<10, key.DefaultChunkTokens*key.BytesPerToken) || rep.Routing[0].Reasons["match"] == 0 {
		t.Errorf("routing = %+v", rep.Routing)
	}
	if md := Markdown(rep); !strings.Contains(md, "| 1 MB agent | direct |") {
		t.Errorf("markdown lacks the 1 MB agent rows:\n%s", md)
	}
}

// The whole command, tiny: direct and prefixlb (in-process, both modes, and mode prefix
// traced at ratio 1), no HAProxy. It checks counts and structure, never timings.
func TestSmokeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers and sends load for a few seconds")
	}
	o := DefaultOptions()
	o.Sizes = []int{1 << 10}
	o.Targets = []string{TargetDirect, TargetPrefixlbRR, TargetPrefixlbPfx, TargetPrefixlbTraced}
	o.TraceSampleRatio = 1
	// The in-process tracer's batches go out every 50 ms instead of 5 s (the SDK reads the
	// standard variable), so that spans reach the sink within this short run.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	o.Conns = 4
	o.Rounds = 1
	o.Round = 150 * time.Millisecond
	o.Warmup = 50 * time.Millisecond
	o.Rate = 200
	o.IndexEntries = 20_000
	o.RoutingN = 50
	o.Out = t.TempDir()
	var log bytes.Buffer
	rep, err := Run(context.Background(), o, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(rep.Rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rep.Rows))
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool {
		return strings.HasPrefix(n, TargetPrefixlbTraced+": tracing at sample ratio 1 exported ") && !strings.Contains(n, "exported 0 batches")
	}) {
		t.Errorf("no span reached the harness's OTLP sink: notes %q", rep.Notes)
	}
	for _, r := range rep.Rows {
		if r.SatRequests <= 0 || r.RPS <= 0 || r.LatRequests <= 0 || r.SatErrors+r.LatErrors != 0 || r.P50us <= 0 || r.P99us < r.P50us {
			t.Errorf("%s: implausible row %+v", r.Target, r)
		}
		if r.Target != TargetDirect && (r.RPSvsDirect == nil || r.AddedP50us == nil) {
			t.Errorf("%s: no ratio against direct", r.Target)
		}
		if r.RPSvsHAProxy != nil {
			t.Errorf("%s: ratio against HAProxy without HAProxy", r.Target)
		}
		if r.SatCPUPer1k != nil || r.PeakRSSBytes != 0 {
			t.Errorf("%s: CPU/RSS reported for an in-process target", r.Target)
		}
	}
	if rr := rep.Rows[1].Routes; rr["round-robin"] == 0 {
		t.Errorf("prefixlb-rr routes = %v", rr)
	}
	if pr := rep.Rows[2].Routes; pr["match"]+pr["cold"]+pr["overload-fallback"] == 0 {
		t.Errorf("prefixlb-prefix routes = %v, want prefix reasons", pr)
	}
	if len(rep.Routing) != 1 || rep.Routing[0].Chunks == 0 || rep.Routing[0].P50us <= 0 {
		t.Errorf("routing = %+v", rep.Routing)
	}
	if rep.Index == nil || rep.Index.Entries < 20_000 || rep.Index.BytesPerEntry <= 0 {
		t.Errorf("index = %+v", rep.Index)
	}
	if len(rep.Checks) != 9 {
		t.Errorf("%d checks", len(rep.Checks))
	}
	p, err := WriteJSON(rep, o.Out)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var back Report
	if err := json.NewDecoder(f).Decode(&back); err != nil || len(back.Rows) != 4 {
		t.Errorf("overhead.json: %v, %d rows", err, len(back.Rows))
	}
	_, _ = io.Copy(io.Discard, f)
}

// TestPrefixlbConfigPeering: the benchmarked prefixlb's YAML, with and without a peering
// section (and with a tracing section), parses and validates as prefixlb would load it, and
// the section lands.
func TestPrefixlbConfigPeering(t *testing.T) {
	dir := t.TempDir()
	sf := filepath.Join(dir, "secret")
	if err := os.WriteFile(sf, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	backends := []string{"http://127.0.0.1:8001", "http://127.0.0.1:8002"}
	for _, tc := range []struct {
		name, peering string
		join          []string
	}{
		{"unpeered", "", nil},
		{"peered", fmt.Sprintf("peering:\n  listen: \"127.0.0.1:17946\"\n  join: [\"127.0.0.1:17947\"]\n  secret_file: %q\n", sf), []string{"127.0.0.1:17947"}},
		{"traced", tracingSection("http://127.0.0.1:14318", 0.01), nil},
	} {
		c, err := configs.Parse([]byte(prefixlbConfig("127.0.0.1:18080", "prefix", "warn", backends, tc.peering)))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(c.Backends) != 2 || c.Mode != "prefix" {
			t.Errorf("%s: backends %v mode %q", tc.name, c.Backends, c.Mode)
		}
		if traced := tc.name == "traced"; c.Tracing.Enabled != traced ||
			traced && (c.Tracing.Endpoint != "http://127.0.0.1:14318" || *c.Tracing.SampleRatio != 0.01) {
			t.Errorf("%s: tracing %+v", tc.name, c.Tracing)
		}
		switch {
		case tc.join == nil && c.Peering != nil:
			t.Errorf("%s: peering %+v, want none", tc.name, c.Peering)
		case tc.join != nil && (c.Peering == nil || !slices.Equal(c.Peering.Join, tc.join) || c.Peering.SecretFile != sf):
			t.Errorf("%s: peering %+v, want join %v, secret %s", tc.name, c.Peering, tc.join, sf)
		}
	}
}

// The median's order-statistic interval: its coverage from the binomial, the widest rank
// that keeps 95%.
func TestMedianInterval(t *testing.T) {
	for _, tc := range []struct {
		n, j int
		cov  float64
	}{
		{1, 0, 0}, {5, 0, 0.9375}, {6, 0, 0.96875}, {8, 0, 0.9921875}, {9, 1, 0.9609375}, {12, 2, 0.9614258}, {24, 6, 0.9773},
	} {
		j, cov := medianInterval(tc.n)
		if j != tc.j || math.Abs(cov-tc.cov) > 1e-4 {
			t.Errorf("n=%d: j=%d coverage %.7f, want %d %.7f", tc.n, j, cov, tc.j, tc.cov)
		}
	}
}

// The tracing check pairs the traced and untraced rounds at 16 KB and judges their median.
func TestTracedCheck(t *testing.T) {
	rep := &Report{Options: Options{TraceSampleRatio: 0.01}, Rows: []Row{
		{Target: TargetPrefixlbPfx, BodyBytes: 16 << 10, RPS: 1000, RPSRounds: []float64{1000, 900, 1100, 1000, 1000, 950}},
		{Target: TargetPrefixlbTraced, BodyBytes: 16 << 10, RPS: 980, RPSRounds: []float64{990, 880, 1050, 980, 990, 960}},
	}}
	c := Checks(rep)[len(Checks(rep))-1]
	// ratios 0.99 0.978 0.955 0.98 0.99 1.011: median 0.985, interval min–max at 6 rounds
	if c.Met == nil || !*c.Met || !strings.HasPrefix(c.Got, "0.985× (6 rounds; 97% interval 0.955–1.011; summed rates 0.980×") {
		t.Errorf("check %+v", c)
	}
	rep.Rows[1].RPSRounds = []float64{900, 850, 1000, 940, 950, 900}
	if c := Checks(rep)[len(Checks(rep))-1]; c.Met == nil || *c.Met {
		t.Errorf("a 0.94× median met the 0.97× target: %+v", c)
	}
}
