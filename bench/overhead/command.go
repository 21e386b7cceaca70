// Package overhead is `prefixlb bench overhead`: what routing through prefixlb costs, measured
// against the same zero-latency backends reached directly and through HAProxy, side by side in
// one run.
//
// Zero-latency replicas (bench/sim, fasthttp) answer every chat completion at once, so all
// time and CPU beyond the direct path is the proxy's. Targets: direct (the load generator
// alternates between the backends), HAProxy 2.x balance roundrobin with option http-no-delay
// (its config is written to a temp dir and the process started and stopped here; skipped
// with a message when haproxy is not installed), HAProxy in mode tcp (haproxy-tcp: it relays
// bytes without parsing HTTP, a backend per client connection: the least one more process on
// the path can cost), and prefixlb in modes round-robin and
// prefix, each a `prefixlb serve` child process, so that its CPU time (/proc/PID/stat) and
// peak RSS (VmHWM) are its own and not the load generator's.
//
// Bodies are chat completions sharing one of a few system prompts (Workload), and from
// Options.AgentFrom up (1 MiB by default) a coding agent's (package agentbody: tools, a
// history of tool calls and results, each request of a session the previous one plus a step).
// For each body size (1, 16 and 128 KiB and 1 MiB by default): warm up, then saturation (closed loop, Conns connections) in rounds
// that interleave the targets (the order rotates each round) so that machine noise hits all
// of them equally, then latency at a fixed moderate rate (open loop, Poisson arrivals with
// the same seed for every target in a round) in the same interleaved rounds. Reported:
// requests/s at saturation, p50/p99 and the latency added over direct, ratios against
// direct and HAProxy, the proxy's CPU seconds per 1,000 requests and peak RSS; then the
// routing decision of mode prefix timed alone, and the prefix index's memory at 1M entries.
package overhead

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prefixlb/prefixlb/bench/overhead/agentbody"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/tracing"
)

// Options configure a run.
type Options struct {
	Sizes          []int         `json:"body_sizes"`
	Backends       int           `json:"backends"`
	Targets        []string      `json:"targets"`
	Conns          int           `json:"conns"`
	Round          time.Duration `json:"round_ns"`
	Rounds         int           `json:"rounds"`
	Warmup         time.Duration `json:"warmup_ns"`
	Rate           float64       `json:"rate"`
	RateFraction   float64       `json:"rate_fraction"`
	StreamFraction float64       `json:"stream_fraction"`
	SystemPrompts  int           `json:"system_prompts"`
	SharedFraction float64       `json:"shared_fraction"`
	Seed           uint64        `json:"seed"`
	LogLevel       string        `json:"prefixlb_log_level"`
	HAProxyBin     string        `json:"haproxy_bin"`
	IndexEntries   int           `json:"index_entries"`
	RoutingN       int           `json:"routing_decisions"`
	// AgentFrom is the smallest body size, in bytes, that gets a coding agent's bodies
	// (tools, tool calls and results, a history that grows per session: agentbody) instead of
	// chat bodies with a shared system prompt; 0: none.
	AgentFrom     int    `json:"agent_from_bytes"`
	Out           string `json:"out"`
	CPUProfileDir string `json:"cpuprofile_dir,omitempty"`
	// InProcessBackends serves the zero-latency backends inside the harness even when a
	// prefixlb binary is at hand (by default they are a `sim --zero-latency` child).
	InProcessBackends bool `json:"in_process_backends,omitempty"`
	// KeepTemp keeps the temp dir with the HAProxy/prefixlb configs and process logs.
	KeepTemp bool `json:"-"`
	// PrefixlbEnv is extra environment for the prefixlb children (e.g. GOMAXPROCS=1).
	PrefixlbEnv []string `json:"prefixlb_env,omitempty"`
	// TraceSampleRatio is the tracing sample ratio of TargetPrefixlbTraced.
	TraceSampleRatio float64 `json:"trace_sample_ratio"`

	// PrefixlbExec is the argv prefix that runs the prefixlb binary (serve is appended);
	// empty: prefixlb runs in-process and its CPU and RSS are not reported.
	PrefixlbExec []string `json:"prefixlb_exec,omitempty"`
}

// DefaultOptions is a run of about four and a half minutes on a 2-core machine: per body
// size, 5 targets × 5 rounds × (0.2 s warmup + 1 s) at saturation and again at the moderate
// rate, plus the routing decisions and the index fill.
func DefaultOptions() Options {
	return Options{
		Sizes:          []int{1 << 10, 16 << 10, 128 << 10, 1 << 20},
		Backends:       2,
		Targets:        append([]string(nil), AllTargets...),
		Conns:          32,
		Round:          time.Second,
		Rounds:         5,
		Warmup:         200 * time.Millisecond,
		RateFraction:   0.1,
		StreamFraction: 0.5,
		SystemPrompts:  4,
		SharedFraction: 0.75,
		Seed:           1,
		LogLevel:       "warn",
		HAProxyBin:     "haproxy",
		IndexEntries:   1_000_000,
		RoutingN:       1000,
		AgentFrom:      1 << 20,
		Out:            "bench-out",

		TraceSampleRatio: tracing.DefaultSampleRatio,
	}
}

func (o *Options) validate() error {
	switch {
	case len(o.Sizes) == 0:
		return errors.New("--sizes: at least one body size")
	case o.Backends < 1:
		return errors.New("--backends must be >= 1")
	case o.Conns < 1:
		return errors.New("--conns must be >= 1")
	case o.Rounds < 1 || o.Round <= 0:
		return errors.New("--rounds and --round must be positive")
	case o.Rate < 0 || o.RateFraction <= 0 && o.Rate == 0:
		return errors.New("--rate must be >= 0, and --rate-fraction > 0 when --rate is 0")
	case !(o.TraceSampleRatio >= 0 && o.TraceSampleRatio <= 1):
		return errors.New("--trace-sample-ratio must be within 0..1")
	}
	if o.AgentFrom < 0 {
		return errors.New("--agent-from must be >= 0")
	}
	for _, s := range o.Sizes {
		if s < 256 {
			return fmt.Errorf("--sizes: %d is below 256 bytes", s)
		}
		if o.agent(s) && s < agentbody.MinSize {
			return fmt.Errorf("--sizes: %d gets agent bodies (--agent-from %d) but is below their minimum, %d bytes", s, o.AgentFrom, agentbody.MinSize)
		}
	}
	for _, t := range o.Targets {
		if !contains(KnownTargets, t) {
			return fmt.Errorf("--targets: unknown target %q (want %s)", t, strings.Join(KnownTargets, ","))
		}
	}
	return nil
}

// agent reports whether bodies of size bytes are a coding agent's (AgentFrom).
func (o *Options) agent(size int) bool { return o.AgentFrom > 0 && size >= o.AgentFrom }

// workload returns the run's workload for bodies of size bytes.
func (o *Options) workload(size int) (*Workload, error) {
	return NewWorkload(size, WorkloadOptions{SystemPrompts: o.SystemPrompts, SharedFraction: o.SharedFraction,
		StreamFraction: o.StreamFraction, Seed: o.Seed, Agent: o.agent(size)})
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// Command returns the `overhead` command (mounted as `prefixlb bench overhead`).
func Command() *cobra.Command {
	o := DefaultOptions()
	var sizes, targets, bin, agentFrom string
	var inProc bool
	c := &cobra.Command{
		Use:   "overhead",
		Short: "Measure what prefixlb costs against direct and HAProxy on zero-latency backends",
		Long: `overhead starts zero-latency simulated replicas (fasthttp; they answer at once) and sends load
to them directly, through HAProxy (balance roundrobin, option http-no-delay; skipped if not
installed), through HAProxy in mode tcp (haproxy-tcp: relays bytes, the floor of one more
process on the path) and through prefixlb in modes round-robin and prefix (each a "prefixlb serve" child
process, so that its CPU and peak RSS are its own), in interleaved rounds. It prints requests/s
at saturation, p50/p99 and the latency added over direct at a moderate open-loop rate, ratios
against direct and HAProxy, the proxy's CPU seconds per 1,000 requests and peak RSS, the routing
decision alone, and the prefix index's memory at 1M entries; it writes DIR/overhead.json.`,
		Example: `  prefixlb bench overhead
  prefixlb bench overhead --sizes 1m --rounds 1 --round 1s --targets direct,haproxy,prefixlb-prefix
  prefixlb bench overhead --sizes 16384 --rounds 5 --round 2s --targets direct,haproxy,prefixlb-prefix`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Sizes, err = parseSizes(sizes); err != nil {
				return err
			}
			o.AgentFrom = 0
			if agentFrom != "0" {
				if o.AgentFrom, err = parseSize(agentFrom); err != nil {
					return fmt.Errorf("--agent-from: %w", err)
				}
			}
			o.Targets = splitList(targets)
			switch {
			case inProc:
				o.PrefixlbExec = nil
			case bin != "":
				o.PrefixlbExec = []string{bin}
			default:
				o.PrefixlbExec = selfExec(cmd)
			}
			rep, err := Run(cmd.Context(), o, cmd.ErrOrStderr())
			if rep == nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), Markdown(rep))
			for _, n := range rep.Notes {
				fmt.Fprintln(cmd.OutOrStdout(), "note:", n)
			}
			if p, werr := WriteJSON(rep, o.Out); werr != nil {
				err = errors.Join(err, werr)
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), "wrote", p)
			}
			return err
		},
	}
	fs := c.Flags()
	fs.StringVar(&sizes, "sizes", "1k,16k,128k,1m", "request body sizes in bytes (suffixes k and m: 1k = 1024, 1m = 1048576)")
	fs.StringVar(&agentFrom, "agent-from", "1m", "body sizes from this one up are a coding agent's (tools, tool calls and results, a history growing per session; each body at most the size); 0: none")
	fs.StringVar(&targets, "targets", strings.Join(AllTargets, ","), "targets to compare")
	fs.IntVar(&o.Backends, "backends", o.Backends, "zero-latency backends behind every proxy")
	fs.IntVar(&o.Conns, "conns", o.Conns, "closed-loop connections at saturation")
	fs.DurationVar(&o.Round, "round", o.Round, "measured time per target per round")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds per phase and body size")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured load before each measured round")
	fs.Float64Var(&o.Rate, "rate", 0, "open-loop rate in requests/s (0: --rate-fraction × the slowest target's saturation rate at that size)")
	fs.Float64Var(&o.RateFraction, "rate-fraction", o.RateFraction, "open-loop rate as a fraction of the slowest saturation rate")
	fs.Float64Var(&o.StreamFraction, "stream-fraction", o.StreamFraction, "share of requests with stream: true (SSE)")
	fs.IntVar(&o.SystemPrompts, "system-prompts", o.SystemPrompts, "system prompts shared among the requests")
	fs.Float64Var(&o.SharedFraction, "shared-fraction", o.SharedFraction, "share of each body that is the shared system prompt")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of bodies and arrivals")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "prefixlb's log level (info logs one line per request; HAProxy here logs nothing)")
	fs.StringVar(&o.HAProxyBin, "haproxy", o.HAProxyBin, "haproxy binary")
	fs.StringVar(&bin, "prefixlb", "", "prefixlb binary to run as \"serve\" (default: this executable when it has a serve command)")
	fs.BoolVar(&inProc, "in-process", false, "serve prefixlb and the backends inside the harness (no CPU/RSS attribution)")
	fs.BoolVar(&o.InProcessBackends, "in-process-backends", false, "serve the zero-latency backends inside the harness (default: a \"sim --zero-latency\" child of the prefixlb binary)")
	fs.IntVar(&o.IndexEntries, "index-entries", o.IndexEntries, "fill a prefix index with this many entries and report its memory (0: skip)")
	fs.IntVar(&o.RoutingN, "routing-decisions", o.RoutingN, "routing decisions timed per body size (0: skip)")
	fs.StringVar(&o.Out, "out", o.Out, "directory for overhead.json")
	fs.BoolVar(&o.KeepTemp, "keep", false, "keep the temp dir with configs and process logs")
	fs.StringArrayVar(&o.PrefixlbEnv, "prefixlb-env", nil, "extra KEY=VALUE environment for the prefixlb children (repeatable), e.g. GOMAXPROCS=1")
	fs.StringVar(&o.CPUProfileDir, "cpuprofile-dir", "", "ask each prefixlb child for a CPU profile DIR/<target>.prof (the prefixlb binary honours PREFIXLB_CPUPROFILE)")
	fs.Float64Var(&o.TraceSampleRatio, "trace-sample-ratio", o.TraceSampleRatio, "sample ratio of target "+TargetPrefixlbTraced+" (mode prefix with OpenTelemetry tracing on, spans exported to an OTLP/HTTP sink in the harness)")
	return c
}

// selfExec returns this executable's argv prefix for `serve` when the command tree it is
// mounted in has a top-level serve command (the prefixlb binary); nil otherwise.
func selfExec(cmd *cobra.Command) []string {
	root := cmd.Root()
	if sc, _, err := root.Find([]string{"serve"}); err != nil || sc == nil || sc.Name() != "serve" || sc == root {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	return []string{exe}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := parseSize(f)
		if err != nil {
			return nil, fmt.Errorf("--sizes: %w", err)
		}
		out = append(out, n)
	}
	return out, nil
}

// maxSize bounds a body size (1 GiB), far above any request a proxy takes.
const maxSize = 1 << 30

// parseSize reads a positive size in bytes, with an optional suffix k (KiB) or m (MiB).
func parseSize(f string) (int, error) {
	num, mul := f, 1
	switch l := strings.ToLower(f); {
	case strings.HasSuffix(l, "k"):
		num, mul = f[:len(f)-1], 1<<10
	case strings.HasSuffix(l, "m"):
		num, mul = f[:len(f)-1], 1<<20
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 || n > maxSize/mul {
		return 0, fmt.Errorf("bad size %q (want a positive number of bytes up to 1 GiB, suffix k or m allowed)", f)
	}
	return n * mul, nil
}

// agg sums one target's rounds at one body size.
type agg struct {
	sat, lat       loadResult
	satCPU, latCPU cpuUse
	satNoProxyCPU  bool // some round had no reading of the proxy's CPU
	latNoProxyCPU  bool
	noBackendCPU   bool
	p50s, p99s     []float64 // per open-loop round
	rates          []float64 // requests/s per saturation round
	routes         routeCounts
	lastErr        error
}

func (a *agg) addSat(r loadResult) {
	if r.seconds > 0 {
		a.rates = append(a.rates, float64(r.requests)/r.seconds)
	}
	a.sat.requests += r.requests
	a.sat.errors += r.errors
	a.sat.seconds += r.seconds
	a.satCPU.proxy += r.cpu.proxy
	a.satCPU.backend += r.cpu.backend
	a.satCPU.self += r.cpu.self
	a.satNoProxyCPU = a.satNoProxyCPU || !r.cpu.proxyOK
	a.noBackendCPU = a.noBackendCPU || !r.cpu.backendOK
	a.routes.add(&r.routes)
	if r.lastErr != nil {
		a.lastErr = r.lastErr
	}
}

func (a *agg) addLat(r loadResult) {
	if a.lat.service == nil {
		a.lat.service, a.lat.co = newHist(), newHist()
	}
	a.lat.requests += r.requests
	a.lat.errors += r.errors
	a.lat.late += r.late
	a.lat.seconds += r.seconds
	a.lat.service.Merge(r.service)
	a.lat.co.Merge(r.co)
	if r.requests > 0 {
		a.p50s = append(a.p50s, quantileUs(r.service, 50))
		a.p99s = append(a.p99s, quantileUs(r.service, 99))
	}
	a.latCPU.proxy += r.cpu.proxy
	a.latNoProxyCPU = a.latNoProxyCPU || !r.cpu.proxyOK
	a.routes.add(&r.routes)
	if r.lastErr != nil {
		a.lastErr = r.lastErr
	}
}

func per1k(cpu time.Duration, n int64, ok bool) *float64 {
	if !ok || n == 0 {
		return nil
	}
	return ptr(cpu.Seconds() / float64(n) * 1000)
}

// Run performs the whole measurement; progress goes to log. On error it may still return
// the partial report.
func Run(ctx context.Context, o Options, log io.Writer) (*Report, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	rep := &Report{Started: time.Now().UTC(), CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Options: o, Targets: map[string]string{}}
	dir, err := os.MkdirTemp("", "prefixlb-overhead-")
	if err != nil {
		return nil, err
	}
	if o.KeepTemp {
		fmt.Fprintln(log, "overhead: keeping configs and process logs in", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	var urls []string
	var backendPID int
	if len(o.PrefixlbExec) > 0 && !o.InProcessBackends {
		var p *proc
		urls, p, err = backendsProcess(o.PrefixlbExec, dir, o.Backends)
		if err != nil {
			return nil, err
		}
		defer p.stop()
		backendPID = p.cmd.Process.Pid
		rep.Backends = "child process: " + strings.Join(p.cmd.Args[1:], " ")
	} else {
		z, err := sim.StartZero(o.Backends, "127.0.0.1", 0, sim.ZeroOptions{})
		if err != nil {
			return nil, err
		}
		defer z.Close()
		urls = z.URLs()
		rep.Backends = "in the harness process (sim.StartZero)"
	}
	backendCPU := func() cpuMeter {
		if backendPID == 0 {
			return nil
		}
		return func() (time.Duration, error) { return procCPU(backendPID) }
	}()

	var ts []*target
	var sink *otlpSink // TargetPrefixlbTraced's
	defer func() {
		for i := len(ts) - 1; i >= 0; i-- {
			if err := ts[i].close(); err != nil {
				fmt.Fprintf(log, "overhead: stopping %s: %v\n", ts[i].name, err)
			}
		}
	}()
	for _, name := range o.Targets {
		var t *target
		var err error
		switch name {
		case TargetDirect:
			t = directTarget(urls)
		case TargetHAProxy, TargetHAProxyTCP:
			t, err = haproxyTarget(o.HAProxyBin, dir, urls, name == TargetHAProxyTCP)
			if errors.Is(err, errNoHAProxy) {
				msg := name + " skipped: " + err.Error() + "; ratios against HAProxy are not reported"
				fmt.Fprintln(log, "overhead:", msg)
				rep.Notes = append(rep.Notes, msg)
				continue
			}
			rep.HAProxy = HAProxyVersion(o.HAProxyBin)
		case TargetPrefixlbRR, TargetPrefixlbPfx:
			mode := "round-robin"
			if name == TargetPrefixlbPfx {
				mode = "prefix"
			}
			if len(o.PrefixlbExec) > 0 {
				t, err = prefixlbTarget(name, o.PrefixlbExec, dir, mode, o.LogLevel, urls, o.CPUProfileDir, o.PrefixlbEnv)
			} else {
				t, err = prefixlbInProcess(name, mode, urls, configs.Tracing{})
			}
		case TargetPrefixlbPeer:
			if len(o.PrefixlbExec) == 0 {
				return nil, fmt.Errorf("%s needs the prefixlb binary (--prefixlb, or run the built binary): peering runs between processes", name)
			}
			t, err = peeredPrefixlbTargets(o.PrefixlbExec, dir, o.LogLevel, urls, o.CPUProfileDir, o.PrefixlbEnv)
		case TargetPrefixlbTraced:
			t, sink, err = tracedPrefixlbTarget(o.PrefixlbExec, dir, o.LogLevel, urls, o.CPUProfileDir, o.PrefixlbEnv, o.TraceSampleRatio)
		}
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		t.cli = newClient(t.addrs, max(o.Conns, openLoopWorkers))
		ts = append(ts, t)
		rep.Targets[name] = t.note
	}
	if len(o.PrefixlbExec) == 0 && (contains(o.Targets, TargetPrefixlbRR) || contains(o.Targets, TargetPrefixlbPfx)) {
		rep.Notes = append(rep.Notes, "prefixlb ran in-process: its CPU time and peak RSS are not reported (run the prefixlb binary, or pass --prefixlb)")
	}
	fmt.Fprintf(log, "overhead: %d zero-latency backends %v; targets %s; %d CPUs\n", len(urls), urls, strings.Join(names(ts), ", "), runtime.NumCPU())

	for si, size := range o.Sizes {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		wl, err := o.workload(size)
		if err != nil {
			return rep, err
		}
		for _, t := range ts {
			if t.pid != 0 {
				_ = resetPeakRSS(t.pid)
			}
			closedLoop(t.cli, wl, o.Conns, 0, o.Warmup, meters{}) // connections, pools, index
		}
		aggs := make([]agg, len(ts))
		for r := range o.Rounds {
			for j := range ts {
				k := roundOrder(j, r, si, len(ts))
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				res := closedLoop(ts[k].cli, wl, o.Conns, o.Warmup, o.Round, meters{ts[k].cpu(), backendCPU})
				aggs[k].addSat(res)
				fmt.Fprintf(log, "overhead: %s saturation round %d/%d %-16s %8.0f req/s  errors %d\n",
					sizeName(size), r+1, o.Rounds, ts[k].name, float64(res.requests)/res.seconds, res.errors)
			}
		}
		rate := o.Rate
		if rate == 0 {
			slowest := math.Inf(1)
			for k := range ts {
				if aggs[k].sat.seconds > 0 {
					slowest = min(slowest, float64(aggs[k].sat.requests)/aggs[k].sat.seconds)
				}
			}
			rate = max(1, math.Round(o.RateFraction*slowest))
		}
		for r := range o.Rounds {
			for j := range ts {
				k := roundOrder(j, r, si, len(ts))
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				res := openLoop(ts[k].cli, wl, rate, o.Warmup, o.Round, o.Seed^uint64(size)^uint64(r)<<32, meters{ts[k].cpu(), backendCPU})
				aggs[k].addLat(res)
				fmt.Fprintf(log, "overhead: %s latency round %d/%d %-16s @%.0f/s p50 %6.0f µs p99 %6.0f µs errors %d\n",
					sizeName(size), r+1, o.Rounds, ts[k].name, rate, quantileUs(res.service, 50), quantileUs(res.service, 99), res.errors)
			}
		}
		for k, t := range ts {
			a := &aggs[k]
			row := Row{
				Target: t.name, BodyBytes: size, Shape: wl.Shape(),
				SatRequests: a.sat.requests, SatErrors: a.sat.errors, SatSeconds: a.sat.seconds,
				SatCPUPer1k:     per1k(a.satCPU.proxy, a.sat.requests, !a.satNoProxyCPU),
				BackendCPUPer1k: per1k(a.satCPU.backend, a.sat.requests, !a.noBackendCPU),
				HarnessCPUPer1k: per1k(a.satCPU.self, a.sat.requests, true),
				Rate:            rate, LatRequests: a.lat.requests, LatErrors: a.lat.errors, Late: a.lat.late,
				LatCPUPer1k: per1k(a.latCPU.proxy, a.lat.requests, !a.latNoProxyCPU),
				RPSRounds:   a.rates,
				P50RoundsUs: a.p50s,
				P99RoundsUs: a.p99s,
				Routes:      a.routes.toMap(),
			}
			if a.sat.seconds > 0 {
				row.RPS = float64(a.sat.requests) / a.sat.seconds
			}
			if a.lat.requests > 0 {
				row.P50us, row.P90us, row.P99us = quantileUs(a.lat.service, 50), quantileUs(a.lat.service, 90), quantileUs(a.lat.service, 99)
				row.P999us, row.MaxUs = quantileUs(a.lat.service, 99.9), float64(a.lat.service.Max())/1e3
				row.CoP50us, row.CoP99us = quantileUs(a.lat.co, 50), quantileUs(a.lat.co, 99)
				if len(a.p99s) > 0 {
					row.P99MedUs = report.Median(a.p99s)
				}
			}
			if t.pid != 0 {
				if p, err := peakRSS(t.pid); err == nil {
					row.PeakRSSBytes = p
				}
			}
			if a.sat.errors+a.lat.errors > 0 {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s at %s: %d errors, last: %v", t.name, sizeName(size), a.sat.errors+a.lat.errors, a.lastErr))
			}
			if a.lat.late > a.lat.requests/100 {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s at %s: %d of %d open-loop sends left > 1 ms after schedule (the machine was busy; latency is measured from the actual send)", t.name, sizeName(size), a.lat.late, a.lat.requests))
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	Derive(rep.Rows)
	if sink != nil {
		rep.Notes = append(rep.Notes, sink.note(o.TraceSampleRatio))
	}
	for _, r := range rep.Rows {
		if r.Target == TargetPrefixlbPfx && r.Routes["least-load"] > 0 && r.Routes["match"] == 0 && r.Routes["cold"] == 0 {
			rep.Notes = append(rep.Notes, "prefixlb mode prefix answered with reason least-load only: the prefix policy (router.Prefix) is not what mode prefix runs in this binary")
			break
		}
	}

	if o.RoutingN > 0 {
		for _, size := range o.Sizes {
			wl, err := o.workload(size)
			if err != nil {
				return rep, err
			}
			rr, err := measureRouting(wl, o.Backends, o.RoutingN, o.Conns)
			if err != nil {
				return rep, err
			}
			rep.Routing = append(rep.Routing, rr)
		}
	}
	if o.IndexEntries > 0 {
		fmt.Fprintf(log, "overhead: filling a prefix index with %d entries\n", o.IndexEntries)
		m, err := measureIndex(o.IndexEntries)
		if err != nil {
			return rep, err
		}
		rep.Index = &m
	}
	rep.Checks = Checks(rep)
	return rep, nil
}

// roundOrder is the target that runs j-th in round r at the si-th body size, of n: the order
// rotates by one each round (and each size), so that over n rounds every target runs once in
// every position and machine noise that drifts over a phase hits all of them alike.
func roundOrder(j, r, si, n int) int { return (j + r + si) % n }

func names(ts []*target) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.name
	}
	return out
}
