package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/oracle"
	"github.com/prefixlb/prefixlb/bench/peers"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// Options configure a comparison.
type Options struct {
	Workload string
	Flags    WorkloadFlags
	// Modes are prefixlb modes, run one after another on fresh replicas.
	Modes    []string
	Replicas int
	// Speedup runs the simulated replicas, think times and arrival gaps this many times faster
	// than real time (sims only; 1 with external backends or target).
	Speedup float64
	// KVTokens is each simulated replica's KV-cache capacity in tokens (0: the sim's default;
	// mooncake: MooncakeKVTokens).
	KVTokens int64
	// Backends: external replicas to put a prefixlb in front of (instead of sims).
	Backends []string
	// Target: an external endpoint (another proxy) to send to directly; Label names its row.
	Target string
	Label  string
	// ProxyConfig is an optional prefixlb YAML whose settings the in-process proxy uses
	// (mode, listen and backends are overridden).
	ProxyConfig string
	Model       string
	IgnoreEOS   bool
	// API, when "messages", sends chat workloads over /v1/messages (loadgen.MessagesAPI).
	API   string
	Out   string
	Quiet bool
	// DumpRequests writes every request's measurements to DIR/requests-<label>.jsonl.
	DumpRequests bool
	// RequestTimeout bounds one request (0: 10 minutes).
	RequestTimeout time.Duration
	// Rates sweeps the load of an open-loop workload: every mode runs at every rate, in the
	// workload's RateUnit (mooncake: multiples of the trace's arrival rate). Nil: one run at
	// the workload's own rate. ResolveRates turns a --rates value (presets included) into it.
	Rates []float64
	// RouterReplicas is how many independent in-process prefixlb replicas (each its own
	// index) run in the mode under test in front of the same replicas; the load generator
	// sends each request to the next one in turn (0 or 1: one). The arm's label is then
	// "MODE×N". Not with Target.
	RouterReplicas int
	// Peering peers the RouterReplicas prefix-mode replicas over 127.0.0.1 (package
	// peering): they share learned prefixes and in-flight loads; the arm's label is then
	// "prefix×N+peer". Other modes run unpeered.
	Peering bool
	// AllowBursts skips the check that flags an arm whose tokens came in bursts (the bench
	// machine short of CPU, BurstITLShare): for tests that run the sims far faster than any
	// machine keeps up with, to check counts and digests, never latencies.
	AllowBursts bool
	// Stdout receives the table; Stderr progress and notes. Nil: os.Stdout / os.Stderr.
	Stdout, Stderr io.Writer
}

// DefaultOptions are `prefixlb bench compare` with no flags.
func DefaultOptions() Options {
	return Options{Workload: "multi-turn", Modes: []string{"round-robin", "least-load", "prefix"},
		Replicas: 4, Speedup: DefaultSpeedup, IgnoreEOS: true, Out: "bench-out", RouterReplicas: 1}
}

// Compare runs the workload once per mode (and per rate of Rates) and writes DIR/report.json
// and DIR/ttft_cdf.png. Each arm is checked for validity (bench/validity.go): failing arms are
// flagged in report.Mode.Flags and marked "!" in the table.
func Compare(ctx context.Context, o Options) (*report.Report, error) {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Replicas < 1 {
		return nil, errors.New("--replicas must be >= 1")
	}
	external := o.Target != "" || len(o.Backends) > 0
	if o.Target != "" && len(o.Backends) > 0 {
		return nil, errors.New("--target and --backends exclude each other")
	}
	if o.Speedup <= 0 || math.IsNaN(o.Speedup) || math.IsInf(o.Speedup, 0) {
		return nil, fmt.Errorf("--speedup must be > 0 (got %g)", o.Speedup)
	}
	if o.KVTokens < 0 {
		return nil, fmt.Errorf("--kv-tokens must be >= 0 (got %d)", o.KVTokens)
	}
	if o.RouterReplicas < 0 {
		return nil, fmt.Errorf("--router-replicas must be >= 1 (got %d)", o.RouterReplicas)
	}
	o.RouterReplicas = max(o.RouterReplicas, 1)
	if o.Peering && o.RouterReplicas < 2 {
		return nil, errors.New("--peering peers the --router-replicas replicas: give --router-replicas 2 or more")
	}
	if o.Target != "" && o.RouterReplicas > 1 {
		return nil, errors.New("--router-replicas starts prefixlb replicas; with --target none is started")
	}
	if err := checkRates(o); err != nil {
		return nil, err
	}
	if external {
		o.Speedup = 1
	}
	if o.Out != "" {
		// Fail before the run, not after minutes of measuring.
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, fmt.Errorf("--out: %w", err)
		}
		probe, err := os.CreateTemp(o.Out, ".write-test-*")
		if err != nil {
			return nil, fmt.Errorf("--out: %s is not writable: %w", o.Out, err)
		}
		probe.Close()
		_ = os.Remove(probe.Name())
	}
	simCfg := sim.DefaultConfig()
	simCfg.Speedup = o.Speedup
	if o.Model != "" {
		simCfg.Model = o.Model
	}
	if o.KVTokens == 0 && o.Workload == "mooncake" {
		o.KVTokens = MooncakeKVTokens
	}
	if o.KVTokens > 0 {
		simCfg.NumGPUBlocks = int((o.KVTokens + int64(simCfg.BlockSize) - 1) / int64(simCfg.BlockSize))
	}
	kvTokens := int64(simCfg.KVCacheTokens())
	replicas := o.Replicas
	if len(o.Backends) > 0 {
		replicas = len(o.Backends)
	}
	maxModelLen := simCfg.MaxModelLen
	if external {
		maxModelLen = 0
	}
	rates := o.Rates
	if len(rates) == 0 {
		rates = []float64{0} // the workload's own rate
	}
	ws := make([]*workload.Workload, len(rates)) // all built first: a bad flag fails before any run
	for i, rate := range rates {
		var err error
		if ws[i], err = BuildWorkload(o.Workload, flagsAtRate(o.Workload, o.Flags, rate), replicas, kvTokens, maxModelLen); err != nil {
			return nil, err
		}
	}
	w := ws[0]
	base, err := baseProxyConfig(o.ProxyConfig)
	if err != nil {
		return nil, err
	}

	rep := &report.Report{Workload: w.Name, Params: w.Params, Replicas: replicas, Speedup: o.Speedup,
		Target: o.Target, Started: time.Now().UTC(), Oracle: w.Oracle}
	if len(o.Rates) > 0 {
		delete(rep.Params, "rate")
		if o.Workload == "mooncake" {
			rep.Params["time_scale"] = or(o.Flags.TimeScale, 1)
		}
		rep.Params["rates"], rep.Params["rate_unit"] = o.Rates, RateUnit(o.Workload)
	}
	reuse, cachedSource := hasReuse(w), "the sims' prefix-cache hit counters"
	if external {
		cachedSource = "the usage chunks' cached_tokens: the external replicas' own counters are not read"
	}
	if o.RouterReplicas > 1 {
		rep.Notes = append(rep.Notes, routerReplicasNote(o.RouterReplicas, o.Peering, o.Modes))
	}
	if len(w.Tenants) > 0 {
		rep.Notes = append(rep.Notes, overloadNote(w, o.Speedup))
	}
	if o.Target == "" {
		if n := fcNote(o.Modes, w.Tenants, ModelTime{o.Speedup}, simCfg.MaxNumSeqs, external); n != "" {
			rep.Notes = append(rep.Notes, n)
		}
	}
	if o.Speedup != 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Latencies are wall-clock at --speedup %g: the simulated GPUs, think times and arrival gaps ran %g× faster than real time (multiply by %g for model time; proxy and HTTP overheads are not scaled).", o.Speedup, o.Speedup, o.Speedup))
	}
	if !external && o.Speedup != 1 {
		rep.Notes = append(rep.Notes, ModelTime{o.Speedup}.Note(configuredHealth(base), o.Peering && slices.Contains(o.Modes, "prefix")))
	}
	type run struct{ label, mode string }
	var runs []run
	if o.Target != "" {
		runs = []run{{label: or(o.Label, o.Target)}}
	} else {
		for _, m := range o.Modes {
			if !slices.Contains(router.ModeNames(), m) && !peers.Is(m) && m != oracle.Name && !slices.Contains(FlowControlArms, m) {
				return nil, fmt.Errorf("--modes: %q is not one of %v or the bench-only %v, %v and %s", m, router.ModeNames(), peers.Names(), FlowControlArms, oracle.Name)
			}
			if m == oracle.Name && external {
				return nil, fmt.Errorf("--modes: %s reads the simulated replicas' state in-process: not with --backends or --target", oracle.Name)
			}
			for _, r := range runs {
				if r.mode == m {
					return nil, fmt.Errorf("--modes: %q given twice", m)
				}
			}
			label := m
			if o.RouterReplicas > 1 {
				label = fmt.Sprintf("%s×%d", m, o.RouterReplicas)
				if o.Peering && m == "prefix" {
					label += "+peer"
				}
			}
			runs = append(runs, run{label: label, mode: m})
		}
		if len(runs) == 0 {
			return nil, errors.New("--modes: none given")
		}
	}

	if len(o.Backends) > 0 {
		warn := "External backends: their KV caches were NOT emptied between modes, so every mode after the first starts warm and the comparison favours the later modes. Restart the replicas between modes (or run one mode per invocation with --modes) for a fair comparison."
		rep.Notes = append(rep.Notes, warn)
		fmt.Fprintf(o.Stderr, "warning: %s\n", warn)
	}

	for i, rate := range rates {
		for _, r := range runs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			m, err := runOne(ctx, o, ws[i], r.mode, r.label, simCfg, base, rate)
			if err != nil {
				return nil, fmt.Errorf("%s%s: %w", r.label, rateSuffix(rate), err)
			}
			rep.Modes = append(rep.Modes, m)
			if !o.Quiet {
				fmt.Fprintf(o.Stderr, "%s%s: %d requests, %d errors in %.1f s\n", r.label, rateSuffix(rate), m.Requests, m.Errors, m.DurationS)
			}
		}
	}
	if line := report.SavingsLine(rep.Modes, o.Speedup); line != "" {
		rep.Notes = append(rep.Notes, line)
	}
	if line := report.FlowLine(rep.Modes); line != "" {
		rep.Notes = append(rep.Notes, line)
	}
	minStep := simMinStep(o, simCfg)
	checkValidity(rep.Modes, reuse, minStep, runtime.NumCPU())
	validity := validityLines(rep.Modes, reuse, cachedSource, minStep)
	rep.Notes = append(rep.Notes, strings.Join(validity, "\n")) // one block under the table

	if o.Target != "" {
		rep.Replicas = 0 // unknown behind an external target
		fmt.Fprintf(o.Stdout, "\nWorkload %s sent to %s, %d requests.\n\n%s", w.Name, o.Target, w.Requests(), report.Table(rep.Modes))
	} else {
		at := ""
		if len(o.Rates) > 0 {
			at = fmt.Sprintf(" at each rate (%s)", RateUnit(o.Workload))
		}
		fmt.Fprintf(o.Stdout, "\nWorkload %s, %d replicas, %d requests per mode%s.\n\n%s", w.Name, replicas, w.Requests(), at, report.Table(rep.Modes))
	}
	if t := report.TenantTable(rep.Modes); t != "" {
		fmt.Fprintf(o.Stdout, "\nPer tenant (TTFT and SLO in wall ms; work = uncached prompt + generated tokens):\n\n%s", t)
	}
	if line := report.OracleLine(w.Oracle); line != "" {
		fmt.Fprintf(o.Stdout, "\n%s\n", line)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(o.Stdout, "\n%s\n", n)
	}
	if o.Out != "" {
		jp, pp := filepath.Join(o.Out, "report.json"), filepath.Join(o.Out, "ttft_cdf.png")
		if err := rep.WriteJSON(jp); err != nil {
			return rep, err
		}
		curves := slices.Clone(rep.Modes)
		for i := range curves {
			curves[i].Mode += rateSuffix(curves[i].Rate)
		}
		if err := report.PlotTTFTCDF(pp, fmt.Sprintf("TTFT CDF, %s", w.Name), curves); err != nil {
			return rep, err
		}
		fmt.Fprintf(o.Stdout, "\nWrote %s and %s.\n", jp, pp)
	}
	for _, m := range rep.Modes {
		if m.Requests > 0 && m.Errors == m.Requests {
			return rep, fmt.Errorf("%s: every request failed (%s); see error_reasons in report.json", m.Mode, firstReasons(m.ErrorReasons))
		}
	}
	return rep, nil
}

// firstReasons lists up to three error reasons with their counts.
func firstReasons(rs map[string]int) string {
	var out []string
	for r, n := range rs {
		out = append(out, fmt.Sprintf("%d× %s", n, r))
	}
	sort.Strings(out)
	if len(out) > 3 {
		out = out[:3]
	}
	return strings.Join(out, "; ")
}

// runOne starts what the run needs (fresh sims and a prefixlb in mode, or nothing for an
// external target), sends the workload, and shuts everything down.
func runOne(ctx context.Context, o Options, w *workload.Workload, mode, label string, simCfg sim.Config, base *configs.Config, rate float64) (report.Mode, error) {
	target := o.Target
	backends := o.Backends
	var proxies []*proxy.Serving // the in-process prefixlb replicas (none with Target)
	var cluster *sim.Cluster
	routers := []string{target} // the URLs requests go to, round-robin per request
	var nodes []*peering.Node   // the routers' peering nodes (Options.Peering)
	if target == "" {
		if len(backends) == 0 {
			var err error
			if slices.ContainsFunc(o.Modes, peers.NeedsKVEvents) {
				// Every arm's replicas publish KV events when an arm reads them, so that all
				// arms run on replicas doing the same work.
				simCfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
			}
			cluster, err = sim.StartCluster(simCfg, o.Replicas, "127.0.0.1", 0)
			if err != nil {
				return report.Mode{}, fmt.Errorf("start sims: %w", err)
			}
			defer cluster.Close()
			backends = cluster.URLs()
		}
		routers = routers[:0]
		var orc *oracle.Oracle // one for all routers: each sees every request routed, not only its own
		if mode == oracle.Name && cluster != nil {
			orc = oracle.New(cluster)
		}
		if o.Peering && mode == "prefix" && o.RouterReplicas > 1 {
			svs, ns, stop, err := startPeeredProxies(base, backends, int64(simCfg.KVCacheTokens()), cluster != nil, o.RouterReplicas, ModelTime{o.Speedup})
			if err != nil {
				return report.Mode{}, err
			}
			defer stop()
			proxies, nodes = svs, ns
		}
		for range max(o.RouterReplicas, 1) * btoi(nodes == nil) { // each replica its own prefixlb with its own index
			fc := fcSetup{tenants: w.Tenants}
			if cluster != nil {
				fc.maxNumSeqs = simCfg.MaxNumSeqs
			}
			sv, stop, err := startProxyFC(base, mode, backends, int64(simCfg.KVCacheTokens()), cluster, orc, ModelTime{o.Speedup}, fc)
			if err != nil {
				return report.Mode{}, err
			}
			defer stop()
			proxies = append(proxies, sv)
		}
		for _, sv := range proxies {
			routers = append(routers, sv.URL())
		}
		target = routers[0]
	}
	model := o.Model
	if model == "" {
		if cluster != nil {
			model = simCfg.Model
		} else {
			model = discoverModel(ctx, target)
		}
	}
	conc := w.Users
	if w.Loop == workload.Open {
		conc = 256
	}
	client := &loadgen.Client{Base: target, Model: model, IgnoreEOS: o.IgnoreEOS, API: o.API, HTTP: loadgen.NewHTTPClient(conc)}
	if len(routers) > 1 {
		client.Bases = routers
	}
	defer client.HTTP.CloseIdleConnections()
	bar, visible := newBar(o, label+rateSuffix(rate), w.Requests())
	cpu0, load0 := processCPU(), readMachineLoad()
	out, err := loadgen.Run(ctx, w, loadgen.Options{Client: client, Speedup: o.Speedup,
		RequestTimeout: o.RequestTimeout, OnResult: func(loadgen.Result) { _ = bar.Add(1) }})
	cpu, load1 := processCPU()-cpu0, readMachineLoad()
	if visible {
		_ = bar.Finish()
		fmt.Fprintln(o.Stderr)
	}
	if err != nil {
		return report.Mode{}, err
	}
	if nodes != nil {
		reportPeerTraffic(o.Stderr, label, nodes, len(out.Results))
	}
	var names []string
	if o.Target == "" {
		names = backends
	}
	if o.DumpRequests && o.Out != "" {
		name := label
		if rate != 0 {
			name += fmt.Sprintf("-rate-%g", rate)
		}
		if err := report.WriteRequests(filepath.Join(o.Out, "requests-"+safeName(name)+".jsonl"), out); err != nil {
			return report.Mode{}, err
		}
	}
	m := report.Summarize(label, out, names)
	m.Rate = rate
	if d := out.Duration(); d > 0 && cpu > 0 {
		m.BenchCores = cpu.Seconds() / d.Seconds()
		if other, steal, ok := load0.others(load1, cpu); ok {
			m.OtherCores, m.StealCores = other, steal
		}
	}
	if len(w.Tenants) > 0 {
		m.Tenants, m.Fairness = report.SummarizeTenants(out, w.Tenants, o.Speedup)
		m.RequestsDigest = FirstTurnsDigest(out)
	} else {
		m.RequestsDigest = RequestsDigest(out)
	}
	if cluster != nil {
		var stalled time.Duration
		for _, r := range cluster.Replicas() {
			stalled += r.Stalled()
			st := r.Stats()
			m.ReplicaCachedTokens += int64(st.PrefixHits)
			m.Preemptions += int64(st.Preemptions)
			m.ReplicaPrefillTokens += int64(st.BatchedPrefillTokens)
			m.ReplicaAborted += int64(st.RequestsAborted)
		}
		if d := out.Duration().Seconds() * o.Speedup * float64(len(cluster.Replicas())); d > 0 {
			m.ReplicaStallShare = stalled.Seconds() / d
		}
	} else {
		m.ReplicaCachedTokens = m.CachedTokens // external replicas: what their usage chunks said
	}
	if len(routers) > 1 {
		m.RouterRequests = routerRequests(out, len(routers))
	}
	if len(proxies) > 0 {
		if m.Savings, err = routerSavings(proxies); err != nil {
			return report.Mode{}, err
		}
	}
	return m, nil
}

// routerRequests counts, per router, the requests it answered with an x-prefixlb-backend
// header (a prefixlb routed them), from the loadgen's record of where each request went.
func routerRequests(out *loadgen.Outcome, routers int) []int {
	n := make([]int, routers)
	for _, r := range out.Results {
		if r.Backend != "" && r.Router >= 0 && r.Router < routers {
			n[r.Router]++
		}
	}
	return n
}

// startProxy runs a prefixlb in mode in-process on an ephemeral 127.0.0.1 port (its admin
// handler read in-process, routerSavings); mode is one of
// router.ModeNames, a bench-only policy of bench/peers, or the oracle (which needs cluster, the
// simulated replicas behind backends; nil with external backends). orc is the oracle mode's
// policy, shared by all of an arm's routers (nil: a new one over cluster). mt puts the
// proxy's load signals on the run's clock (ModelTime).
func startProxy(base *configs.Config, mode string, backends []string, kvTokens int64, cluster *sim.Cluster, orc *oracle.Oracle, mt ModelTime) (*proxy.Serving, func(), error) {
	return startProxyFC(base, mode, backends, kvTokens, cluster, orc, mt, fcSetup{})
}

// fcSetup is what a flow-control arm's prefixlb needs beyond startProxy's arguments: the
// workload's tenants (its rules) and the replicas' max_num_seqs (0: unknown).
type fcSetup struct {
	tenants    []*workload.Tenant
	maxNumSeqs int
}

// startProxyFC is startProxy for any arm, the flow-control arms (FlowControlArms) included:
// mode is then the arm, which places requests by its mode (fcArmMode) with flow control
// configured by flowControlConfig and fcTuning.
func startProxyFC(base *configs.Config, mode string, backends []string, kvTokens int64, cluster *sim.Cluster, orc *oracle.Oracle, mt ModelTime, fc fcSetup) (*proxy.Serving, func(), error) {
	arm := mode
	mode, isFC := fcArmMode(arm)
	sims := cluster != nil
	cfg := *base
	cfg.Mode = mode
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	if base.Log.Level == "" || base.Log.Level == "info" || base.Log.Level == "debug" {
		cfg.Log.Level = "warn"
		if isFC {
			cfg.Log.Level = "error" // a refusal's request line is a warning; the tenant table counts them
		}
	}
	cfg.Log.Format = "console"
	cfg.Backends = nil
	for _, u := range backends {
		b := configs.Backend{URL: u}
		if sims {
			b.KVCacheTokens = kvTokens // the proxy's index sized like the sims' caches
		}
		cfg.Backends = append(cfg.Backends, b)
	}
	if isFC {
		flowControlConfig(&cfg, arm, fc.tenants, fc.maxNumSeqs)
	}
	log, err := app.NewLogger(cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		return nil, nil, err
	}
	var sv *proxy.Serving
	closePolicy := func() {} // a peer's resources, released after the proxy stops
	if mode == oracle.Name {
		if cluster == nil {
			return nil, nil, fmt.Errorf("%s needs the simulated replicas", oracle.Name)
		}
		cfg.Mode = router.DefaultMode
		cfg.ApplyDefaults()
		if orc == nil {
			orc = oracle.New(cluster)
		}
		sv, err = app.StartTuned(context.Background(), &cfg, log, mt.Tuning(mode, orc))
	} else if peers.Is(mode) {
		// A bench-only policy: the proxy is prefix mode's in every other respect, and its
		// prefix section (chunk size, index capacity) sizes the peer's index too.
		cfg.Mode = router.DefaultMode
		cfg.ApplyDefaults()
		po := peers.Options{Prefix: cfg.PrefixOptions(), Speedup: mt.Speedup}
		if peers.NeedsKVEvents(mode) {
			if po.KVEvents, err = kvEventsOptions(cluster); err != nil {
				return nil, nil, err
			}
		}
		pol, perr := peers.New(mode, po)
		if perr != nil {
			return nil, nil, perr
		}
		if po.KVEvents != nil {
			if err := waitKVSubscribed(cluster); err != nil {
				_ = pol.(io.Closer).Close()
				return nil, nil, err
			}
		}
		if c, ok := pol.(io.Closer); ok {
			closePolicy = func() {
				if kv, ok := pol.(*peers.DynamoKV); ok {
					reportKVEvents(os.Stderr, mode, kv, cluster)
				}
				_ = c.Close()
			}
		}
		sv, err = app.StartTuned(context.Background(), &cfg, log, fcTuning(arm, mt, mt.Tuning(mode, pol)))
	} else {
		sv, err = app.StartTuned(context.Background(), &cfg, log, fcTuning(arm, mt, mt.Tuning("", nil)))
	}
	if err != nil {
		closePolicy()
		return nil, nil, fmt.Errorf("proxy: %w", err)
	}
	stop := func() {
		defer closePolicy()
		sctx, cancel := context.WithTimeout(context.Background(), proxyStopGrace)
		defer cancel()
		if err := sv.Stop(sctx); err != nil {
			log.Warn("proxy stop", zap.Error(err))
		}
		if err := sv.Err(); err != nil {
			log.Warn("proxy serve", zap.Error(err))
		}
		_ = log.Sync()
	}
	return sv, stop, nil
}

// proxyStopGrace bounds the in-process proxy's shutdown after a mode's run: the load is
// over, so only streams cut by a request timeout can still be draining.
const proxyStopGrace = 5 * time.Second

func baseProxyConfig(path string) (*configs.Config, error) {
	if path == "" {
		return &configs.Config{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// Parse validates, which needs a backend; the bench replaces them anyway.
	c := &configs.Config{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// discoverModel asks the target's /v1/models for the first model id ("" if that fails; the
// replicas then use their default).
func discoverModel(ctx context.Context, base string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v) != nil || len(v.Data) == 0 {
		return ""
	}
	return v.Data[0].ID
}

// newBar returns a progress bar on stderr, invisible when stderr is not a terminal or quiet.
func newBar(o Options, label string, total int) (*progressbar.ProgressBar, bool) {
	visible := !o.Quiet && isTerminal(o.Stderr)
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(o.Stderr),
		progressbar.OptionSetVisibility(visible),
		progressbar.OptionSetDescription(fmt.Sprintf("%-12s", label)),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
	), visible
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// safeName keeps letters, digits, '-' and '_' of a label for a file name.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}
