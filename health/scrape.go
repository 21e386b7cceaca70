package health

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
)

// Load is a model server's load as scraped from its Prometheus endpoint. Values summed over
// label sets are summed over every series of the metric (engines, data-parallel ranks, model
// names); fractions are averaged.
type Load struct {
	// Running is the number of requests in the engine's batch: vllm:num_requests_running or
	// sglang:num_running_reqs, summed.
	Running float64 `json:"running"`
	// Waiting is the number of queued requests: vllm:num_requests_waiting or
	// sglang:num_queue_reqs, summed.
	Waiting float64 `json:"waiting"`
	// KVCacheUsage is the fraction of the KV cache in use, 0..1: vllm:kv_cache_usage_perc
	// (vllm:gpu_cache_usage_perc before vLLM 0.10) or sglang:token_usage, averaged.
	KVCacheUsage float64 `json:"kv_cache_usage"`
	// NumGPUBlocks and BlockSize (tokens per block) come from the labels of
	// vllm:cache_config_info (blocks summed over engines). For SGLang, whose KV pool is
	// counted in tokens, NumGPUBlocks is sglang:max_total_num_tokens and BlockSize is 1.
	// 0: not reported.
	NumGPUBlocks int64 `json:"num_gpu_blocks,omitempty"`
	BlockSize    int64 `json:"block_size,omitempty"`
	// StartTime is process_start_time_seconds (Unix seconds; 0: not reported).
	StartTime float64 `json:"start_time,omitempty"`
	// At is when the scrape finished (the Checker's clock).
	At time.Time `json:"at"`
}

// scrapeResult is what the last scrape of a backend left. It is immutable once stored.
type scrapeResult struct {
	load    Load      // the last successful scrape (zero if none yet)
	good    bool      // load is set
	ok      bool      // the last attempt succeeded
	attempt time.Time // when the last attempt finished
	err     string    // its error, if any
	prompt  float64   // summed prompt-token counters of the last success (restart fallback)
	hasProm bool
}

// Load returns b's latest scraped load. fresh is false when the last scrape failed, when
// it is older than ScrapeStaleAfter, when the server reported none of the known load
// metrics, or when b was never scraped; l is then the last good value, or zero.
func (c *Checker) Load(b *backend.Backend) (l Load, fresh bool) {
	st := c.lookup(b)
	if st == nil {
		return Load{}, false
	}
	r := st.scrape.Load()
	if r == nil {
		return Load{}, false
	}
	return r.load, c.fresh(r)
}

func (c *Checker) fresh(r *scrapeResult) bool {
	return r.ok && r.good && c.now().Sub(r.load.At) <= c.o.ScrapeStaleAfter
}

// OnKVCapacity sets f to be called (from a scrape goroutine) when a backend's reported KV
// capacity first appears or changes; the prefix index resizes that backend's share then.
func (c *Checker) OnKVCapacity(f func(b *backend.Backend)) { c.kvHook.Store(&f) }

// maxMetricsBytes bounds what a scrape reads: vLLM's full exposition with histograms is
// 50–300 KB. A longer body (or one that never ends) is a failed scrape: its values, summed
// over what was read, are no load.
const maxMetricsBytes = 16 << 20

// errMetricsTooLarge: the exposition did not end within maxMetricsBytes.
var errMetricsTooLarge = fmt.Errorf("metrics body longer than %d MiB (cut; its values discarded)", maxMetricsBytes>>20)

// restartWarnEvery is how often, at most, a backend's detected restarts are warned about: a
// start time that changes on every scrape (a broken exporter, a crash loop) would warn every
// ScrapeInterval. Every restart still resets the backend's cache.
const restartWarnEvery = time.Minute

var errNoLoadMetrics = errors.New("no known load metrics (vllm:num_requests_running, sglang:num_running_reqs)")

// scrapeOne scrapes st once and stores the result.
func (c *Checker) scrapeOne(ctx context.Context, st *bstate) {
	st.scrapeMu.Lock()
	defer st.scrapeMu.Unlock()
	var m metrics
	before := st.b.Counted() // this proxy's and its peers' in flight as the fetch starts (SetScrapedLoad)
	err := c.fetchMetrics(ctx, st.metricsURL, &m)
	if ctx.Err() != nil {
		return
	}
	if err == nil && !m.hasRunning && !m.hasWaiting {
		err = errNoLoadMetrics
	}
	now := c.now()
	prev := st.scrape.Load()
	res := &scrapeResult{attempt: now}
	if prev != nil {
		res.load, res.good, res.prompt, res.hasProm = prev.load, prev.good, prev.prompt, prev.hasProm
	}
	if err != nil {
		res.err = err.Error()
		st.scrapeErrors.Add(1)
		st.scrape.Store(res)
		st.b.SetScrapedLoad(0, 0) // fall back to the proxy's own in-flight count
		st.b.SetScrapedKVUsage(0)
		if prev == nil || !prev.good || now.Sub(prev.load.At) > c.o.ScrapeStaleAfter {
			// A failure or two keep the verdict (and the tie-break) as it was; a stale one
			// is no verdict.
			c.setSenders(st, backend.SendersUnknown)
		}
		if !st.scrapeFail {
			st.scrapeFail = true
			c.log.Warn("metrics scrape failing; routing without this backend's load",
				zap.String("backend", st.b.Name), zap.String("url", st.metricsURL), zap.Error(err))
		}
		return
	}
	if st.scrapeFail {
		st.scrapeFail = false
		c.log.Info("metrics scrape working", zap.String("backend", st.b.Name))
	}
	load := m.load(now)
	restarted := ""
	switch {
	case prev == nil || !prev.good:
		// No earlier start time to compare with. A process that started after the model
		// list was asked for cannot have answered it: the replica restarted between that
		// read and this first good scrape, and the list is its predecessor's. (A replica
		// clock ahead of ours costs one more read; one behind by more than the gap leaves the
		// list to the next ModelsInterval read, as without this.)
		if asked := st.modelsAsked.Load(); asked != 0 && load.StartTime*1e9 > float64(asked) {
			restarted = "process started after its model list was read"
		}
	case load.StartTime != 0 && prev.load.StartTime != 0:
		if load.StartTime != prev.load.StartTime {
			restarted = "process_start_time_seconds changed"
		}
	case load.StartTime == 0 && m.hasPrompt && prev.hasProm && m.prompt < prev.prompt:
		// No start time (SGLang's multiprocess registry has none): a counter going back means
		// the process started over.
		restarted = "prompt_tokens_total went backwards"
	}
	res.load, res.good, res.ok = load, true, true
	st.b.SetScrapedRequests(int64(load.Running+0.5), int64(load.Waiting+0.5), before)
	st.b.SetScrapedKVUsage(load.KVCacheUsage)
	if load.NumGPUBlocks > 0 && load.BlockSize > 0 && st.b.SetScrapedKVCacheTokens(load.NumGPUBlocks*load.BlockSize) {
		if h := c.kvHook.Load(); h != nil {
			(*h)(st.b)
		}
	}
	res.prompt, res.hasProm = m.prompt, m.hasPrompt
	st.scrape.Store(res)
	c.setSenders(st, st.senders.observe(now, senderSample{finished: m.finished, has: m.hasFinished, dialect: m.hasRunning,
		busy: m.running + m.waiting, ours: st.b.Completed(), inFlight: st.b.InFlight()}))
	c.scraped(st, restarted, prev, load)
}

// setSenders stores the verdict on st's other senders, logging a change (scrape goroutine).
func (c *Checker) setSenders(st *bstate, v backend.Senders) {
	if st.b.SetOtherSenders(v) && v != backend.SendersUnknown {
		c.log.Info("backend's other senders judged", zap.String("backend", st.b.Name), zap.Stringer("senders", v))
	}
}

// scraped handles restart detection after a successful scrape.
func (c *Checker) scraped(st *bstate, restarted string, prev *scrapeResult, load Load) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bumped := st.resetSinceScrape
	st.resetSinceScrape = false
	if restarted == "" || st.removed {
		return
	}
	st.kickModels() // a restarted replica may serve other models

	prevStart := 0.0 // no good scrape before this one
	if prev != nil {
		prevStart = prev.load.StartTime
	}
	fields := []zap.Field{zap.String("backend", st.b.Name), zap.String("signal", restarted),
		zap.Float64("start_time", load.StartTime), zap.Float64("previous_start_time", prevStart)}
	if bumped {
		// It came back from unhealthy since the last scrape, which already dropped its cache.
		c.log.Info("backend restart detected; cache already reset on its return", fields...)
		return
	}
	st.b.ResetCache()
	if ok, held := st.restartLog.allow(c.now(), restartWarnEvery); ok {
		c.log.Warn("backend restart detected; its cached prefixes are forgotten",
			append(fields, zap.Uint64("cache_epoch", st.b.Epoch()), zap.Int("restarts_not_logged", held))...)
	}
}

// metricsLineBuffer is a scrape's read buffer: a line longer than 16 KiB is no metric that
// parseMetrics reads, and is skipped.
const metricsLineBuffer = 16 << 10

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, metricsLineBuffer) }}

// fetchMetrics GETs url and parses the Prometheus text body into m. A body that does not end
// within maxMetricsBytes, or whose read fails (the check Timeout included), is an error: m
// then holds a part of the exposition and must be discarded.
func (c *Checker) fetchMetrics(ctx context.Context, url string, m *metrics) error {
	return c.get(ctx, url, func(body io.Reader) error {
		br := readerPool.Get().(*bufio.Reader)
		lr := &io.LimitedReader{R: body, N: maxMetricsBytes + 1} // a byte past the cap: the body did not end
		br.Reset(lr)
		err := parseMetrics(br, m)
		br.Reset(nil)
		readerPool.Put(br)
		if err == nil && lr.N == 0 {
			err = errMetricsTooLarge
		}
		if err != nil {
			return fmt.Errorf("GET %s: %w", url, err)
		}
		return nil
	})
}

// metrics accumulates the samples parseMetrics looks for.
type metrics struct {
	running, waiting       float64
	hasRunning, hasWaiting bool
	kvSum                  float64 // vllm:kv_cache_usage_perc or sglang:token_usage
	kvN                    int
	gpuSum                 float64 // vllm:gpu_cache_usage_perc (older name; used if no kvN)
	gpuN                   int
	blocks, blockSize      int64
	sglTokens              float64 // sglang:max_total_num_tokens
	startTime              float64
	prompt                 float64 // prompt-token counters (restart fallback)
	hasPrompt              bool
	finished               float64 // finished requests: the e2e latency histograms' counts (senders.go)
	hasFinished            bool
}

func (m *metrics) load(at time.Time) Load {
	l := Load{Running: m.running, Waiting: m.waiting, StartTime: m.startTime, At: at}
	switch {
	case m.kvN > 0:
		l.KVCacheUsage = m.kvSum / float64(m.kvN)
	case m.gpuN > 0:
		l.KVCacheUsage = m.gpuSum / float64(m.gpuN)
	}
	l.KVCacheUsage = min(max(l.KVCacheUsage, 0), 1)
	switch {
	case m.blocks > 0 && m.blockSize > 0 && m.blocks <= math.MaxInt64/m.blockSize:
		l.NumGPUBlocks, l.BlockSize = m.blocks, m.blockSize
	case m.sglTokens >= 1:
		l.NumGPUBlocks, l.BlockSize = int64(m.sglTokens), 1
	}
	return l
}

// metric names parseMetrics knows.
const (
	mRunning = iota + 1
	mWaiting
	mKV
	mGPU
	mCacheConfig
	mSglTokens
	mStart
	mPrompt
	mFinished
)

func metricKind(name []byte) int {
	switch string(name) { // no allocation: the compiler compares the bytes in place
	case "vllm:num_requests_running", "sglang:num_running_reqs":
		return mRunning
	case "vllm:num_requests_waiting", "sglang:num_queue_reqs":
		return mWaiting
	case "vllm:kv_cache_usage_perc", "sglang:token_usage":
		return mKV
	case "vllm:gpu_cache_usage_perc":
		return mGPU
	case "vllm:cache_config_info":
		return mCacheConfig
	case "sglang:max_total_num_tokens":
		return mSglTokens
	case "process_start_time_seconds":
		return mStart
	case "vllm:prompt_tokens_total", "sglang:prompt_tokens_total":
		return mPrompt
	case "vllm:e2e_request_latency_seconds_count", "sglang:e2e_request_latency_seconds_count":
		return mFinished
	}
	return 0
}

// parseMetrics reads Prometheus text exposition from r and adds the samples it knows to m.
// It looks only at lines starting with "vllm:", "sglang:" or "process_start_time_seconds",
// skips comments and everything else without parsing, and allocates nothing per line.
// Malformed lines of known metrics are skipped; only a read error fails the parse.
func parseMetrics(r *bufio.Reader, m *metrics) error {
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: no metric we need looks like that. Skip it.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			line = nil
		}
		if len(line) > 0 {
			m.line(line)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

var (
	pfxVLLM   = []byte("vllm:")
	pfxSGLang = []byte("sglang:")
	pfxStart  = []byte("process_start_time_seconds")
)

// line handles one exposition line (with or without its newline).
func (m *metrics) line(line []byte) {
	if line[0] == '#' || (!bytes.HasPrefix(line, pfxVLLM) && !bytes.HasPrefix(line, pfxSGLang) && !bytes.HasPrefix(line, pfxStart)) {
		return
	}
	i := 0
	for i < len(line) && line[i] != '{' && line[i] != ' ' && line[i] != '\t' {
		i++
	}
	kind := metricKind(line[:i])
	if kind == 0 {
		return
	}
	var labels []byte
	rest := line[i:]
	if len(rest) > 0 && rest[0] == '{' {
		end := labelsEnd(rest)
		if end < 0 {
			return
		}
		labels, rest = rest[1:end], rest[end+1:]
	}
	v, ok := sampleValue(rest)
	if !ok {
		return
	}
	switch kind {
	case mRunning:
		m.running = addSample(m.running, v)
		m.hasRunning = true
	case mWaiting:
		m.waiting = addSample(m.waiting, v)
		m.hasWaiting = true
	case mKV:
		m.kvSum = addSample(m.kvSum, v)
		m.kvN++
	case mGPU:
		m.gpuSum = addSample(m.gpuSum, v)
		m.gpuN++
	case mCacheConfig:
		var blocks, size int64
		eachLabel(labels, func(name, value []byte) {
			switch string(name) {
			case "num_gpu_blocks":
				blocks, _ = strconv.ParseInt(string(value), 10, 64) // "None" before profiling: 0
			case "block_size":
				size, _ = strconv.ParseInt(string(value), 10, 64)
			}
		})
		if blocks > 0 && size > 0 {
			m.blocks = min(m.blocks, math.MaxInt64-blocks) + blocks // saturates, never wraps
			m.blockSize = max(m.blockSize, size)
		}
	case mSglTokens:
		m.sglTokens = addSample(m.sglTokens, v)
	case mStart:
		m.startTime = max(m.startTime, v)
	case mPrompt:
		m.prompt = addSample(m.prompt, v)
		m.hasPrompt = true
	case mFinished:
		m.finished = addSample(m.finished, v)
		m.hasFinished = true
	}
}

// maxSample caps a sum of samples at 2^53: beyond any real count of requests or tokens and
// still an exact integer, so that sums stay finite and convert to int64 without overflow.
const maxSample = 1 << 53

// addSample returns sum + v, capped at maxSample. sum ≤ maxSample and v finite: never Inf.
func addSample(sum, v float64) float64 { return min(sum+v, maxSample) }

// sampleValue parses the value after the metric name and labels: " 12.5" or " 12.5 1712345"
// (with a timestamp). NaN, infinities and negative values are rejected: every metric read
// here is a count, a fraction, a size or a timestamp.
func sampleValue(rest []byte) (float64, bool) {
	rest = bytes.TrimLeft(rest, " \t")
	end := bytes.IndexAny(rest, " \t\r\n")
	if end >= 0 {
		rest = rest[:end]
	}
	if len(rest) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(rest), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

// labelsEnd returns the index of the '}' closing the label set that s starts with ('{'),
// honouring quoted values with escapes, or -1.
func labelsEnd(s []byte) int {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i
		case c == '\n':
			return -1
		}
	}
	return -1
}

// eachLabel calls f for each name="value" pair of a label set (without braces). Values are
// passed raw, escapes not undone: the values read here are plain numbers.
func eachLabel(s []byte, f func(name, value []byte)) {
	for len(s) > 0 {
		s = bytes.TrimLeft(s, " \t,")
		eq := bytes.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return
		}
		name := bytes.TrimSpace(s[:eq])
		s = s[eq+2:]
		j := 0
		for j < len(s) && s[j] != '"' {
			if s[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(s) {
			return
		}
		f(name, s[:j])
		s = s[j+1:]
	}
}
