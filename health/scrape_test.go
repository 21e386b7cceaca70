package health

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

func TestScrapeFixtures(t *testing.T) {
	tests := []struct {
		file     string
		want     Load
		capacity int64
	}{
		{"testdata/vllm_metrics.txt", Load{Running: 12, Waiting: 3, KVCacheUsage: 0.375,
			NumGPUBlocks: 54000, BlockSize: 16, StartTime: 1.75412345678e9}, 54000 * 16},
		{"testdata/sglang_metrics.txt", Load{Running: 21, Waiting: 6, KVCacheUsage: 0.2,
			NumGPUBlocks: 2 * 161721, BlockSize: 1}, 2 * 161721},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			srv := newFakeServer(t)
			srv.setMetricsFile(t, tt.file)
			b := srv.backend(t)
			c, clk, _ := newTestChecker(t, Options{})
			c.SetBackends([]*backend.Backend{b})
			c.scrapeAll(bg)
			got, fresh := c.Load(b)
			tt.want.At = clk.Now()
			if !fresh || !loadEqual(got, tt.want) {
				t.Fatalf("Load = %+v fresh=%v\nwant   %+v fresh=true\nstate %+v", got, fresh, tt.want, c.State(b))
			}
			if n := b.KVCapacity(0); n != tt.capacity {
				t.Fatalf("backend's KV capacity %d after a scrape, want %d", n, tt.capacity)
			}
		})
	}
}

// parseText parses an exposition text and checks the Load it makes against want.
func parseText(t *testing.T, text string, want Load) *metrics {
	t.Helper()
	var m metrics
	if err := parseMetrics(bufio.NewReader(strings.NewReader(text)), &m); err != nil {
		t.Fatal(err)
	}
	if got := m.load(time.Time{}); !loadEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	return &m
}

func loadEqual(a, b Load) bool {
	const eps = 1e-9
	near := func(x, y float64) bool { return x-y < eps && y-x < eps }
	return near(a.Running, b.Running) && near(a.Waiting, b.Waiting) && near(a.KVCacheUsage, b.KVCacheUsage) &&
		a.NumGPUBlocks == b.NumGPUBlocks && a.BlockSize == b.BlockSize && a.StartTime == b.StartTime && a.At.Equal(b.At)
}

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		desc, text string
		want       Load
	}{
		{"empty", "", Load{}},
		{"older vLLM: gpu_cache_usage_perc",
			"vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\nvllm:num_requests_running{model_name=\"m\"} 2\n",
			Load{Running: 2, KVCacheUsage: 0.75}},
		{"kv_cache_usage_perc wins over the older name",
			"vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n", Load{KVCacheUsage: 0.1}},
		{"sum over model names",
			"vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 2.5\n",
			Load{Running: 3.5}},
		{"no labels, timestamp, CRLF, no final newline",
			"vllm:num_requests_waiting 4 1712345678000\r\nvllm:num_requests_running 3",
			Load{Running: 3, Waiting: 4}},
		{"quoted brace and escaped quote in a label value",
			`vllm:num_requests_running{model_name="a}\"b",x="y"} 5` + "\n", Load{Running: 5}},
		{"similar names are not the metric",
			"vllm:num_requests_running_total 9\nvllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9\n" +
				"# vllm:num_requests_running 9\nxvllm:num_requests_running 9\n", Load{}},
		{"NaN, Inf and garbage are skipped",
			"vllm:num_requests_running NaN\nvllm:num_requests_running +Inf\nvllm:num_requests_running abc\nvllm:num_requests_running{\nvllm:num_requests_running 1\n",
			Load{Running: 1}},
		{"cache config before profiling",
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n", Load{}},
		{"cache config label order",
			`vllm:cache_config_info{num_gpu_blocks="100", block_size="32",num_gpu_blocks_override="7"} 1` + "\n",
			Load{NumGPUBlocks: 100, BlockSize: 32}},
		{"usage clamped to 1", "sglang:token_usage 1.5\n", Load{KVCacheUsage: 1}},
		{"start time", "process_start_time_seconds 1.7e+09\n", Load{StartTime: 1.7e9}},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			parseText(t, tt.text, tt.want)
		})
	}
}

func TestParseMetricsLongLine(t *testing.T) {
	text := "vllm:num_requests_running{x=\"" + strings.Repeat("a", 100<<10) + "\"} 7\nvllm:num_requests_running 1\n"
	var m metrics
	if err := parseMetrics(bufio.NewReaderSize(strings.NewReader(text), 4096), &m); err != nil {
		t.Fatal(err)
	}
	if m.running != 1 {
		t.Fatalf("running = %v, want 1 (the over-long line skipped)", m.running)
	}
}

func TestScrapeStaleAndFailed(t *testing.T) {
	srv := newFakeServer(t)
	srv.setMetricsFile(t, "testdata/vllm_metrics.txt")
	b := srv.backend(t)
	c, clk, logs := newTestChecker(t, Options{})
	c.SetBackends([]*backend.Backend{b})
	if _, fresh := c.Load(b); fresh {
		t.Fatal("fresh before any scrape")
	}
	if n := b.KVCapacity(0); n != 0 {
		t.Fatalf("capacity %d known before any scrape", n)
	}
	c.scrapeAll(bg)
	clk.Add(DefaultScrapeStaleAfter)
	if _, fresh := c.Load(b); !fresh {
		t.Fatal("stale at exactly ScrapeStaleAfter")
	}
	clk.Add(time.Nanosecond)
	if l, fresh := c.Load(b); fresh || l.Running != 12 {
		t.Fatalf("past ScrapeStaleAfter: fresh=%v running=%v, want false 12", fresh, l.Running)
	}

	c.scrapeAll(bg)
	srv.metricsStatus.Store(http.StatusInternalServerError)
	for range 3 {
		c.scrapeAll(bg)
	}
	if l, fresh := c.Load(b); fresh || l.Running != 12 {
		t.Fatalf("after a 500: fresh=%v running=%v, want false 12 (last good)", fresh, l.Running)
	}
	if s := c.State(b); s.LastScrapeError == "" || s.LoadFresh {
		t.Fatalf("state after a failed scrape: %+v", s)
	}
	if n := b.KVCapacity(0); n == 0 {
		t.Fatal("capacity forgotten after a failed scrape")
	}
	if n := countLogs(logs, "metrics scrape failing; routing without this backend's load"); n != 1 {
		t.Fatalf("%d scrape-failing lines for 3 failures, want 1", n)
	}
	srv.metricsStatus.Store(http.StatusOK)
	c.scrapeAll(bg)
	if _, fresh := c.Load(b); !fresh {
		t.Fatal("not fresh after a good scrape")
	}

	// A server without any known load metric is not a fresh zero load.
	srv.setMetrics("# TYPE up gauge\nup 1\n")
	c.scrapeAll(bg)
	if _, fresh := c.Load(b); fresh {
		t.Fatal("fresh without load metrics")
	}

	// Nothing listening.
	d := deadBackend(t)
	c.SetBackends([]*backend.Backend{d})
	c.scrapeAll(bg)
	if _, fresh := c.Load(d); fresh || c.State(d).LastScrapeError == "" {
		t.Fatalf("dead backend: fresh=%v state %+v", fresh, c.State(d))
	}
}

// This proxy's requests answered while the scrape was being fetched, which the replica
// still listed, are not another sender's work (backend.SetScrapedLoad): the excess is
// taken beyond the in-flight count before the fetch, not only after.
func TestScrapeAnsweredDuringFetchNotForeign(t *testing.T) {
	srv := newFakeServer(t)
	b := srv.backend(t)
	c, _, _ := newTestChecker(t, Options{})
	c.SetBackends([]*backend.Backend{b})
	var ls [3]backend.Lease
	for i := range ls {
		ls[i].Begin(b, 0, 0, false)
	}
	answered := func() {
		for i := range ls {
			ls[i].Release()
		}
	}
	srv.onMetrics.Store(&answered)
	srv.setMetrics("vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\n")
	c.scrapeAll(bg)
	if l, fresh := c.Load(b); !fresh || l.Running != 3 {
		t.Fatalf("scrape: fresh=%v running=%v, want true 3", fresh, l.Running)
	}
	if e, busy := b.ScrapedExcess(), b.Busy(); e != 1 || busy != 1 {
		t.Errorf("3 of this proxy's answered during the fetch, 4 reported: excess %d, busy %d; want 1 and 1 (the other sender's)", e, busy)
	}
}

func TestRestartDetection(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	restarted := strings.Replace(string(vllm), "process_start_time_seconds 1.75412345678e+09",
		"process_start_time_seconds 1.75412399999e+09", 1)
	srv := newFakeServer(t)
	srv.setMetrics(string(vllm))
	b := srv.backend(t)
	c, _, logs := newTestChecker(t, Options{Disabled: true})
	c.SetBackends([]*backend.Backend{b})
	c.scrapeAll(bg)
	c.scrapeAll(bg)
	e := b.Epoch()
	srv.setMetrics(restarted)
	c.scrapeAll(bg)
	c.scrapeAll(bg)
	if b.Epoch() != e+1 {
		t.Fatalf("epoch %d after a start-time change, want %d", b.Epoch(), e+1)
	}
	const msg = "backend restart detected; its cached prefixes are forgotten"
	if n := countLogs(logs, msg); n != 1 {
		t.Fatalf("%d restart lines, want 1", n)
	}

	// SGLang has no process_start_time_seconds: prompt_tokens_total going back means a restart.
	sgl, err := os.ReadFile("testdata/sglang_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	srv.setMetrics(string(sgl))
	c.scrapeAll(bg)
	e = b.Epoch()
	c.scrapeAll(bg)
	srv.setMetrics(strings.ReplaceAll(string(sgl), "8.128902e+06", "1200"))
	c.scrapeAll(bg)
	if b.Epoch() != e+1 {
		t.Fatalf("epoch %d after prompt_tokens_total went back, want %d", b.Epoch(), e+1)
	}
}

// The first good scrape of a backend has no earlier start time to compare with: a process
// that started after the backend's model list was asked for is a restart since that read (its
// list is the predecessor's), so the list is read again and the cache reset; one that started
// before is not, nor is any process when no list was read.
func TestRestartBeforeFirstScrape(t *testing.T) {
	tests := []struct {
		name       string
		read       bool          // a model-list read began before the scrape
		failFirst  bool          // a failed scrape came before the good one
		startAfter time.Duration // the process's start, after the read's
		restart    bool
	}{
		{"started after the read", true, false, time.Second, true},
		{"started after the read, a failed scrape before", true, true, time.Second, true},
		{"started before the read", true, false, -time.Minute, false},
		{"started before the read, a failed scrape before", true, true, -time.Minute, false},
		{"no read", false, false, time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeServer(t)
			b := srv.backend(t)
			c, clk, logs := newTestChecker(t, Options{Disabled: true, ModelsInterval: time.Hour})
			c.SetBackends([]*backend.Backend{b})
			st := c.lookup(b)
			readAt := clk.Now()
			if tt.read {
				c.readModels(bg, st, false) // the fake server has no list: the read fails, as one may
			}
			if tt.failFirst {
				srv.metricsStatus.Store(http.StatusServiceUnavailable)
				c.scrapeAll(bg)
				srv.metricsStatus.Store(http.StatusOK)
			}
			clk.Add(2 * time.Second)
			start := readAt.Add(tt.startAfter)
			srv.setMetrics(fmt.Sprintf("vllm:num_requests_running 0\nprocess_start_time_seconds %.3f\n",
				float64(start.UnixNano())/1e9))
			e := b.Epoch()
			c.scrapeAll(bg)
			if _, fresh := c.Load(b); !fresh {
				t.Fatalf("no good scrape: %s", c.State(b).LastScrapeError)
			}
			kicked := len(st.modelsKick) == 1
			warned := countLogs(logs, "backend restart detected; its cached prefixes are forgotten") == 1
			if kicked != tt.restart || (b.Epoch() != e) != tt.restart || warned != tt.restart {
				t.Errorf("model read asked %v, epoch %d -> %d, warned %v; want a restart: %v", kicked, e, b.Epoch(), warned, tt.restart)
			}
			c.scrapeAll(bg) // the same start time again: nothing more
			if (b.Epoch() != e) != tt.restart || (b.Epoch() > e+1) {
				t.Errorf("epoch %d after a second scrape of the same process (was %d)", b.Epoch(), e)
			}
		})
	}
}

// A backend that came back from unhealthy already had its epoch bumped; the new start time
// seen right after must not bump it again (that would drop what was learned in between).
func TestRestartAfterReturnBumpsOnce(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	srv := newFakeServer(t)
	srv.setMetrics(string(vllm))
	b := srv.backend(t)
	c, _, logs := newTestChecker(t, Options{Rise: 1, Fall: 1})
	c.SetBackends([]*backend.Backend{b})
	c.CheckOnce(bg)
	c.scrapeAll(bg)
	srv.healthStatus.Store(http.StatusServiceUnavailable)
	c.CheckOnce(bg)
	srv.healthStatus.Store(http.StatusOK)
	srv.setMetrics(strings.Replace(string(vllm), "1.75412345678e+09", "1.8e+09", 1))
	c.CheckOnce(bg)
	e := b.Epoch()
	c.scrapeAll(bg)
	if b.Epoch() != e {
		t.Fatalf("epoch bumped twice for one restart: %d, want %d", b.Epoch(), e)
	}
	if n := countLogs(logs, "backend restart detected; cache already reset on its return"); n != 1 {
		t.Fatalf("%d restart lines, want 1", n)
	}
}

func BenchmarkParseVLLM(b *testing.B) {
	data, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		b.Fatal(err)
	}
	text := string(data)
	r := strings.NewReader("")
	br := bufio.NewReaderSize(r, 16<<10)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(text)
		br.Reset(r)
		var m metrics
		if err := parseMetrics(br, &m); err != nil {
			b.Fatal(err)
		}
	}
}

// checkParsed fails t unless every field parseMetrics produced is a finite, non-negative
// number (NaN fails: both comparisons with it are false), usage is within 0..1, and the KV
// capacity NumGPUBlocks × BlockSize fits an int64.
func checkParsed(t *testing.T, input string, m *metrics) {
	t.Helper()
	l := m.load(time.Time{})
	for _, f := range []struct {
		name string
		v    float64
	}{{"Running", l.Running}, {"Waiting", l.Waiting}, {"KVCacheUsage", l.KVCacheUsage}, {"StartTime", l.StartTime},
		{"prompt tokens", m.prompt}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			t.Fatalf("%q: %s = %v, want finite and >= 0", input, f.name, f.v)
		}
	}
	if l.KVCacheUsage > 1 {
		t.Fatalf("%q: KVCacheUsage %v above 1", input, l.KVCacheUsage)
	}
	if l.NumGPUBlocks < 0 || l.BlockSize < 0 {
		t.Fatalf("%q: NumGPUBlocks %d BlockSize %d, want >= 0", input, l.NumGPUBlocks, l.BlockSize)
	}
	if l.BlockSize > 0 && l.NumGPUBlocks > math.MaxInt64/l.BlockSize {
		t.Fatalf("%q: capacity %d blocks × %d tokens overflows", input, l.NumGPUBlocks, l.BlockSize)
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"testdata/vllm_metrics.txt", "testdata/sglang_metrics.txt"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data))
	}
	f.Add(`vllm:cache_config_info{block_size="16\",num_gpu_blocks="1"} 1`)
	f.Add("vllm:num_requests_running{")
	for _, tt := range validExposition {
		f.Add(tt.text)
	}
	for _, s := range hostileSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var m metrics
		_ = parseMetrics(bufio.NewReaderSize(strings.NewReader(s), 64), &m)
		checkParsed(t, s, &m)
	})
}

// hostileSamples are expositions a broken or hostile model server could send: NaN and
// infinite samples, negative gauges and counters, sums that overflow to infinity, sizes
// beyond int64.
var hostileSamples = []string{
	"vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc NaN\nprocess_start_time_seconds NaN\n",
	"vllm:num_requests_running +Inf\nsglang:max_total_num_tokens +Inf\nvllm:prompt_tokens_total -Inf\n",
	"vllm:num_requests_running -1\n",
	"vllm:num_requests_waiting -0.5\nvllm:num_requests_waiting 0.25\n",
	"vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n",
	"sglang:num_queue_reqs 1.7e308\nsglang:num_queue_reqs 1.7e308\nsglang:num_queue_reqs -1.7e308\n",
	"vllm:kv_cache_usage_perc -3\n",
	"vllm:kv_cache_usage_perc 1e308\nvllm:kv_cache_usage_perc 1e308\n",
	"process_start_time_seconds -5\n",
	"vllm:prompt_tokens_total -7\nvllm:prompt_tokens_total 1e308\nvllm:prompt_tokens_total 1e308\n",
	"sglang:max_total_num_tokens 1e300\n",
	"sglang:max_total_num_tokens -4\n",
	`vllm:cache_config_info{num_gpu_blocks="9223372036854775807",block_size="16"} 1` + "\n",
	`vllm:cache_config_info{num_gpu_blocks="9223372036854775807",block_size="1"} 1` + "\n" +
		`vllm:cache_config_info{num_gpu_blocks="9223372036854775807",block_size="1"} 1` + "\n",
	`vllm:cache_config_info{num_gpu_blocks="-5",block_size="-16"} 1` + "\n",
}

// The hostile samples give finite, non-negative loads.
func TestParseMetricsHostile(t *testing.T) {
	for _, s := range hostileSamples {
		var m metrics
		if err := parseMetrics(bufio.NewReader(strings.NewReader(s)), &m); err != nil {
			t.Fatal(err)
		}
		checkParsed(t, s, &m)
	}
}

// validExposition is a hand-written table of well-formed Prometheus text (format 0.0.4) with
// the values a conforming parser reads from it: the check a differential test against a
// reference parser would make (none is in the module graph).
var validExposition = []struct {
	desc, text string
	want       Load
	prompt     float64
}{
	{"HELP and TYPE lines, engines summed",
		"# HELP vllm:num_requests_running Number of requests.\n# TYPE vllm:num_requests_running gauge\n" +
			`vllm:num_requests_running{engine="0",model_name="m"} 7.0` + "\n" + `vllm:num_requests_running{engine="1",model_name="m"} 5` + "\n",
		Load{Running: 12}, 0},
	{"float forms", "vllm:num_requests_running 1e1\nvllm:num_requests_waiting +2.5E+0\nsglang:num_queue_reqs .5\nsglang:num_running_reqs 0.25e1\n",
		Load{Running: 12.5, Waiting: 3}, 0},
	{"negative zero is zero", "vllm:num_requests_running -0\nvllm:num_requests_running 4\n", Load{Running: 4}, 0},
	{"empty label set and trailing comma", `vllm:num_requests_running{} 1` + "\n" + `vllm:num_requests_running{model_name="m",} 2` + "\n",
		Load{Running: 3}, 0},
	{"escapes and spaces in label values",
		`vllm:num_requests_waiting{model_name="a \"b\" \\ c\nd",x="}{"} 6` + "\n", Load{Waiting: 6}, 0},
	{"tabs and spaces around the value, negative timestamp",
		"vllm:num_requests_running\t 3 -1712345678000\nvllm:num_requests_waiting  2\t1712345678000\n",
		Load{Running: 3, Waiting: 2}, 0},
	{"usage averaged over engines", "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.25\n",
		Load{KVCacheUsage: 0.375}, 0},
	{"cache config summed over engines",
		`vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="27000"} 1` + "\n" +
			`vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="27000"} 1` + "\n",
		Load{NumGPUBlocks: 54000, BlockSize: 16}, 0},
	{"sglang token pool", "sglang:max_total_num_tokens 161721\nsglang:token_usage 0.2\n",
		Load{NumGPUBlocks: 161721, BlockSize: 1, KVCacheUsage: 0.2}, 0},
	{"start time and prompt counters",
		"process_start_time_seconds 1.75412345678e+09\nvllm:prompt_tokens_total{engine=\"0\"} 1.5e+06\nvllm:prompt_tokens_total{engine=\"1\"} 500000\n",
		Load{StartTime: 1.75412345678e9}, 2e6},
	{"other families and histograms are ignored",
		"# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 9\n" +
			"vllm:time_to_first_token_seconds_sum 3.5\nvllm:time_to_first_token_seconds_count 9\npython_gc_objects_collected_total{generation=\"0\"} 1234\n" +
			"vllm:num_requests_running 1\n",
		Load{Running: 1}, 0},
}

func TestParseMetricsValidExposition(t *testing.T) {
	for _, tt := range validExposition {
		t.Run(tt.desc, func(t *testing.T) {
			m := parseText(t, tt.text, tt.want)
			if m.prompt != tt.prompt {
				t.Fatalf("prompt tokens %v, want %v", m.prompt, tt.prompt)
			}
			checkParsed(t, tt.text, m)
		})
	}
}
