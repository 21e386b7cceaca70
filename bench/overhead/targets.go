package overhead

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/configs"
)

// Target names.
const (
	TargetDirect  = "direct"
	TargetHAProxy = "haproxy"
	// TargetHAProxyTCP is HAProxy relaying bytes (mode tcp, no HTTP parsing, a backend per
	// client connection): what one more process on the path costs at the least.
	TargetHAProxyTCP  = "haproxy-tcp"
	TargetPrefixlbRR  = "prefixlb-rr"
	TargetPrefixlbPfx = "prefixlb-prefix"
	// TargetPrefixlbPeer is mode prefix with peering on (package peering): the measured
	// replica is peered with a second prefixlb that takes no traffic, so every request it
	// routes is also sent to a peer; its CPU is both processes'. Not in AllTargets: ask for
	// it with --targets.
	TargetPrefixlbPeer = "prefixlb-prefix-peer"
	// TargetPrefixlbTraced is mode prefix with OpenTelemetry tracing on at
	// Options.TraceSampleRatio, exporting to an OTLP/HTTP sink in the harness (which reads and
	// drops the spans): what tracing costs, against TargetPrefixlbPfx in the same rounds. Not
	// in AllTargets: ask for it with --targets.
	TargetPrefixlbTraced = "prefixlb-prefix-traced"
)

// AllTargets are the targets in report order; KnownTargets adds the opt-in ones.
var (
	AllTargets   = []string{TargetDirect, TargetHAProxyTCP, TargetHAProxy, TargetPrefixlbRR, TargetPrefixlbPfx}
	KnownTargets = append(append([]string(nil), AllTargets...), TargetPrefixlbPeer, TargetPrefixlbTraced)
)

// target is one way to reach the backends: directly, or through a proxy.
type target struct {
	name  string
	addrs []string // what the load generator dials
	pid   int      // the proxy's own process, measured for CPU and RSS (0: none)
	// peerPid is a process whose CPU counts with pid's (0: none): the idle peer of
	// TargetPrefixlbPeer, whose receiving is the other half of what peering costs.
	peerPid int
	note    string // how it runs, for the report
	cli     *client
	stop    func() error
}

func (t *target) cpu() cpuMeter {
	if t.pid == 0 {
		return nil
	}
	return func() (time.Duration, error) {
		own, err := procCPU(t.pid)
		if err != nil || t.peerPid == 0 {
			return own, err
		}
		peer, err := procCPU(t.peerPid)
		return own + peer, err
	}
}

func (t *target) close() error {
	if t.cli != nil {
		t.cli.close()
	}
	if t.stop != nil {
		return t.stop()
	}
	return nil
}

// hostPorts turns "http://host:port" URLs into "host:port".
func hostPorts(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")
	}
	return out
}

func directTarget(backends []string) *target {
	return &target{name: TargetDirect, addrs: hostPorts(backends), note: "client alternates between the backends"}
}

// freePort reserves an ephemeral 127.0.0.1 port by listening on it and closing it.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// proc is a child process whose output goes to a file.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startProc(dir, name string, argv []string, env ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the harness
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", argv[0], err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the end of the process's output, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// stop sends SIGTERM and waits up to 10 s, then kills.
func (p *proc) stop() error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within 10s after SIGTERM; killed", p.cmd.Path)
	}
}

// waitReady polls addr with GET /v1/models (passed through to a backend) until it answers
// 200, the process exits, or 15 s pass.
func waitReady(addr string, p *proc) error {
	deadline := time.Now().Add(15 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if p != nil && p.exited() {
			return fmt.Errorf("exited early (%v): %s", p.err, p.tail())
		}
		code, _, err := fasthttp.GetTimeout(nil, "http://"+addr+"/v1/models", time.Second)
		if err == nil && code == fasthttp.StatusOK {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("status %d", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if p != nil {
		return fmt.Errorf("not ready after 15s (%v): %s", last, p.tail())
	}
	return fmt.Errorf("not ready after 15s: %v", last)
}

// ---- backends ----

// backendsProcess runs `<argv...> sim --zero-latency --replicas n --base-port 0` as a child
// process (backends are separate processes in front of which a proxy is put, and their CPU is
// then their own) and returns its URLs once it prints them.
func backendsProcess(argv []string, dir string, n int) (urls []string, p *proc, err error) {
	args := append(append([]string(nil), argv...), "sim", "--zero-latency", "--replicas", strconv.Itoa(n),
		"--base-port", "0", "--host", "127.0.0.1")
	p, err = startProc(dir, "backends", args)
	if err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return nil, nil, fmt.Errorf("zero-latency backends exited early (%v): %s", p.err, p.tail())
		}
		b, _ := os.ReadFile(p.log)
		urls = urls[:0]
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "http://") {
				urls = append(urls, strings.TrimSpace(line))
			}
		}
		if len(urls) == n {
			for _, u := range urls {
				if err := waitReady(strings.TrimPrefix(u, "http://"), p); err != nil {
					_ = p.stop()
					return nil, nil, fmt.Errorf("zero-latency backend %s: %w", u, err)
				}
			}
			return urls, p, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = p.stop()
	return nil, nil, fmt.Errorf("zero-latency backends did not print %d URLs within 15s: %s", n, p.tail())
}

// ---- HAProxy ----

// errNoHAProxy means the haproxy binary is not installed.
var errNoHAProxy = errors.New("haproxy not found in PATH (Debian: apt-get install haproxy)")

// HAProxyConfig renders the HAProxy configuration of the comparison: one frontend on
// 127.0.0.1:port, balance roundrobin over the backends, and option http-no-delay, without
// which HAProxy holds small writes (SSE events) for up to ~200 ms. With tcp, HAProxy relays
// bytes instead (mode tcp): each client connection is paired with one backend connection.
func HAProxyConfig(port int, backends []string, tcp bool) string {
	var b strings.Builder
	mode := "    mode http\n"
	if tcp {
		mode = "    mode tcp\n"
	}
	b.WriteString(`# written by prefixlb bench overhead
global
    maxconn 4096

defaults
` + mode + `    timeout connect 5s
    timeout client 600s
    timeout server 600s
`)
	if !tcp {
		b.WriteString("    option http-no-delay\n")
	}
	b.WriteString(`

frontend fe
    bind 127.0.0.1:` + strconv.Itoa(port) + `
    default_backend be

backend be
    balance roundrobin
`)
	for i, a := range hostPorts(backends) {
		fmt.Fprintf(&b, "    server s%d %s\n", i, a)
	}
	return b.String()
}

// HAProxyVersion returns the first line of `haproxy -v`, or "" when haproxy is missing.
func HAProxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

func haproxyTarget(bin, dir string, backends []string, tcp bool) (*target, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, errNoHAProxy
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	name, note := TargetHAProxy, "haproxy -db, balance roundrobin, option http-no-delay"
	if tcp {
		name, note = TargetHAProxyTCP, "haproxy -db, mode tcp, balance roundrobin (per connection)"
	}
	cfg := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(cfg, []byte(HAProxyConfig(port, backends, tcp)), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command(path, "-c", "-q", "-f", cfg).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c: %v: %s", err, out)
	}
	p, err := startProc(dir, name, []string{path, "-db", "-f", cfg})
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitReady(addr, p); err != nil {
		_ = p.stop()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &target{name: name, addrs: []string{addr}, pid: p.cmd.Process.Pid, note: note, stop: p.stop}, nil
}

// ---- prefixlb ----

// BenchKVCacheTokens is the KV-cache capacity, in tokens, that the benchmarked prefixlb is
// told each zero-latency backend has (prefix.default_kv_cache_tokens), and the routing
// harness's backends too: 8 Mi, so that the coding-agent sessions at 1 MB (64 sessions of up
// to ~221k tokens, 14M in all over two backends) fit, as on a fleet sized for its sessions.
// At the default (400k tokens per backend) they cannot: every request then misses, relearns
// its whole prompt (~3,500 chunks) and evicts as many, and Learn dominates prefixlb's CPU at
// 1 MB, measuring a cache too small for its sessions rather than routing. Smaller bodies are
// not affected (their shared system prompts stay, their unique turns are evicted either way).
const BenchKVCacheTokens = 8 << 20

// prefixlbConfig renders the YAML of a benchmarked prefixlb; extra, when set, is more
// top-level sections (a peering or tracing section).
func prefixlbConfig(listen, mode, logLevel string, backends []string, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %q\nadmin_listen: \"127.0.0.1:0\"\nmode: %s\nlog:\n  level: %s\n  format: json\nprefix:\n  default_kv_cache_tokens: %d\nbackends:\n", listen, mode, logLevel, BenchKVCacheTokens)
	for _, u := range backends {
		fmt.Fprintf(&b, "  - url: %q\n", u)
	}
	b.WriteString(extra)
	return b.String()
}

// peeredPrefixlbTargets starts TargetPrefixlbPeer: an idle prefixlb peer and the measured
// one joining it, both child processes in mode prefix, with a fresh random secret. Its CPU is
// both processes' (the measured one's routing and sending, the peer's receiving: per request,
// what each of two replicas that route as much pays), its peak RSS the measured one's; the
// peer's stop is folded into the target's. With a profile directory the idle peer writes one
// too (prefixlb-idle-peer.prof): what receiving the measured one's updates costs.
func peeredPrefixlbTargets(argv []string, dir, logLevel string, backends []string, profDir string, extraEnv []string) (*target, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	sf := filepath.Join(dir, "peering.secret")
	if err := os.WriteFile(sf, []byte(base64.StdEncoding.EncodeToString(secret)), 0o600); err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	mp, err := freePort()
	if err != nil {
		return nil, err
	}
	peerAddr, ownAddr := "127.0.0.1:"+strconv.Itoa(pp), "127.0.0.1:"+strconv.Itoa(mp)
	peer, err := prefixlbTargetWith("prefixlb-idle-peer", argv, dir, "prefix", logLevel, backends, profDir, extraEnv,
		fmt.Sprintf("peering:\n  listen: %q\n  secret_file: %q\n", peerAddr, sf))
	if err != nil {
		return nil, err
	}
	t, err := prefixlbTargetWith(TargetPrefixlbPeer, argv, dir, "prefix", logLevel, backends, profDir, extraEnv,
		fmt.Sprintf("peering:\n  listen: %q\n  join: [%q]\n  secret_file: %q\n", ownAddr, peerAddr, sf))
	if err != nil {
		_ = peer.stop()
		return nil, err
	}
	stopOwn := t.stop
	t.peerPid = peer.pid
	t.stop = func() error { return errors.Join(stopOwn(), peer.stop()) }
	t.note += "; peered with an idle prefixlb (peering.join); CPU: both processes'"
	return t, nil
}

// prefixlbTarget starts `<argv...> serve --config FILE` as a child process, so that its CPU
// time and peak RSS are its own.
func prefixlbTarget(name string, argv []string, dir, mode, logLevel string, backends []string, profDir string, extraEnv []string) (*target, error) {
	return prefixlbTargetWith(name, argv, dir, mode, logLevel, backends, profDir, extraEnv, "")
}

// prefixlbTargetWith is prefixlbTarget with more top-level sections (YAML: a peering or
// tracing section; "" for none).
func prefixlbTargetWith(name string, argv []string, dir, mode, logLevel string, backends []string, profDir string, extraEnv []string, extra string) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfg := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfg, []byte(prefixlbConfig(addr, mode, logLevel, backends, extra)), 0o644); err != nil {
		return nil, err
	}
	args := append(append([]string(nil), argv...), "serve", "--config", cfg)
	env := append([]string(nil), extraEnv...)
	if profDir != "" {
		if err := os.MkdirAll(profDir, 0o755); err != nil {
			return nil, err
		}
		abs, _ := filepath.Abs(filepath.Join(profDir, name+".prof"))
		env = append(env, "PREFIXLB_CPUPROFILE="+abs)
	}
	p, err := startProc(dir, name, args, env...)
	if err != nil {
		return nil, err
	}
	if err := waitReady(addr, p); err != nil {
		_ = p.stop()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &target{name: name, addrs: []string{addr}, pid: p.cmd.Process.Pid,
		note: strings.TrimSpace(strings.Join(extraEnv, " ") + " " + filepath.Base(argv[0]) + " serve, mode " + mode + ", log level " + logLevel + " (child process)"), stop: p.stop}, nil
}

// prefixlbInProcess serves prefixlb inside the harness (app.Start), with the tracing section
// tr. Its CPU and RSS cannot be told apart from the load generator's and are not reported.
func prefixlbInProcess(name, mode string, backends []string, tr configs.Tracing) (*target, error) {
	cfg := &configs.Config{Mode: mode, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Prefix: configs.Prefix{DefaultKVCacheTokens: BenchKVCacheTokens}, Tracing: tr}
	for _, u := range backends {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: u})
	}
	sv, err := app.Start(context.Background(), cfg, zap.NewNop())
	if err != nil {
		return nil, err
	}
	addr := sv.Addr().String()
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), inProcessStopGrace)
		defer cancel()
		return sv.Stop(ctx)
	}
	if err := waitReady(addr, nil); err != nil {
		_ = stop()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &target{name: name, addrs: []string{addr}, note: "in-process (app.Start): CPU and RSS not attributable", stop: stop}, nil
}

// inProcessStopGrace bounds the in-process prefixlb's shutdown once a run's load is over.
const inProcessStopGrace = 5 * time.Second

// ---- /proc ----

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100 on Linux/x86
// and arm64 alike).
const clockTicks = 100

// procCPU returns the user + system CPU time of process pid (all threads).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a /proc/PID/stat line; the
// command name (field 2) may hold spaces and parentheses, so fields are counted after the
// last ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 { // f[0] is field 3 (state): utime is f[11], stime f[12]
		return 0, errors.New("/proc stat: short line")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+s) * time.Second / clockTicks, nil
}

// procStatusKB returns a "Name: N kB" field of /proc/PID/status in bytes.
func procStatusKB(pid, field string) (int64, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, field)
}

func parseStatusKB(b []byte, field string) (int64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != field {
			continue
		}
		v := strings.Fields(rest)
		if len(v) == 0 {
			break
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("/proc status: no %s", field)
}

// peakRSS is VmHWM of pid: the largest resident set since start or the last resetPeakRSS.
func peakRSS(pid int) (int64, error) { return procStatusKB(strconv.Itoa(pid), "VmHWM") }

// resetPeakRSS sets pid's VmHWM to its current RSS (writing 5 to clear_refs, Linux ≥ 4.0).
func resetPeakRSS(pid int) error {
	return os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
}

// ---- tracing ----

// tracingSection is the tracing section of a benchmarked prefixlb: on, exporting to endpoint
// (OTLP/HTTP), new traces kept at ratio.
func tracingSection(endpoint string, ratio float64) string {
	return fmt.Sprintf("tracing:\n  enabled: true\n  endpoint: %q\n  sample_ratio: %g\n", endpoint, ratio)
}

// otlpSink is an OTLP/HTTP traces endpoint on 127.0.0.1 that reads every export and drops it,
// answering as a collector does (200, an empty protobuf response): the exporter's work is
// prefixlb's, the sink's is the harness's. It counts the exports and their bytes.
type otlpSink struct {
	srv     *http.Server
	url     string
	exports atomic.Int64
	bytes   atomic.Int64
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.exports.Add(1)
		s.bytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *otlpSink) close() error { return s.srv.Close() }

// note says what reached the sink by the end of the measurement (batches go out every 5 s,
// OTEL_BSP_SCHEDULE_DELAY), for the report.
func (s *otlpSink) note(ratio float64) string {
	return fmt.Sprintf("%s: tracing at sample ratio %g exported %d batches (%.1f KiB) to the harness's OTLP/HTTP sink during the run",
		TargetPrefixlbTraced, ratio, s.exports.Load(), float64(s.bytes.Load())/1024)
}

// tracedPrefixlbTarget starts TargetPrefixlbTraced: mode prefix with tracing on at ratio, as a
// child process (argv non-empty) or in the harness, exporting to an OTLP sink that the
// target's stop closes after prefixlb has flushed.
func tracedPrefixlbTarget(argv []string, dir, logLevel string, backends []string, profDir string, extraEnv []string, ratio float64) (*target, *otlpSink, error) {
	sink, err := startOTLPSink()
	if err != nil {
		return nil, nil, err
	}
	var t *target
	if len(argv) > 0 {
		t, err = prefixlbTargetWith(TargetPrefixlbTraced, argv, dir, "prefix", logLevel, backends, profDir, extraEnv, tracingSection(sink.url, ratio))
	} else {
		t, err = prefixlbInProcess(TargetPrefixlbTraced, "prefix", backends, configs.Tracing{Enabled: true, Endpoint: sink.url, SampleRatio: &ratio})
	}
	if err != nil {
		_ = sink.close()
		return nil, nil, err
	}
	stop := t.stop
	t.stop = func() error { return errors.Join(stop(), sink.close()) }
	t.note += fmt.Sprintf("; tracing on, sample ratio %g, OTLP/HTTP to a sink in the harness", ratio)
	return t, sink, nil
}
