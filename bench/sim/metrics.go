package sim

import (
	"bytes"
	"strconv"
)

// Stats is a snapshot of an engine's gauges and counters. Token counts are in the sim's tokens;
// latencies are model seconds.
type Stats struct {
	Running, Waiting int // requests
	UsedBlocks       int // KV blocks pinned by running requests
	TotalBlocks      int
	CachedBlocks     int // blocks registered in the prefix cache (pinned or free)

	PrefixQueries    uint64 // prompt tokens looked up at admission (vllm:prefix_cache_queries)
	PrefixHits       uint64 // of those, tokens found cached (vllm:prefix_cache_hits)
	PromptTokens     uint64 // prompt tokens of requests that produced a first token
	GenerationTokens uint64
	RequestsAdded    uint64 // requests Add accepted
	RequestsFinished uint64
	RequestsAborted  uint64
	// Preemptions counts running requests sent back to the waiting queue for lack of KV
	// blocks, each time (vllm:num_preemptions).
	Preemptions uint64
	Steps       uint64
	// BatchedPrefillTokens counts tokens computed in prefill steps: prompt tokens not found in
	// the cache, and the tokens a preempted request recomputes.
	BatchedPrefillTokens uint64

	TTFT Histogram // vllm:time_to_first_token_seconds
	E2E  Histogram // vllm:e2e_request_latency_seconds
}

// KVCacheUsage is the fraction of KV blocks in use, as vllm:kv_cache_usage_perc (0..1).
func (s *Stats) KVCacheUsage() float64 {
	if s.TotalBlocks == 0 {
		return 0
	}
	return float64(s.UsedBlocks) / float64(s.TotalBlocks)
}

// histBounds are the upper bounds of vLLM's TTFT histogram buckets (seconds); the E2E histogram
// uses the same ones, which cover its range well enough for a simulator.
var histBounds = [...]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}

// Histogram is a fixed-bucket histogram (non-cumulative counts; the last bucket is +Inf).
type Histogram struct {
	Counts [len(histBounds) + 1]uint64
	Sum    float64
	Count  uint64
}

func (h *Histogram) observe(v float64) {
	i := 0
	for i < len(histBounds) && v > histBounds[i] {
		i++
	}
	h.Counts[i]++
	h.Sum += v
	h.Count++
}

// writeMetrics renders s in the Prometheus text format under vLLM's metric names.
func writeMetrics(b *bytes.Buffer, s *Stats, cfg *Config, startUnix float64) {
	lbl := `{engine="0",model_name=` + strconv.Quote(cfg.Model) + `}`
	gauge := func(name, help string, v float64) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + lbl + " ")
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		b.WriteByte('\n')
	}
	counter := func(name, help string, v uint64) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + "_total" + lbl + " ")
		b.WriteString(strconv.FormatUint(v, 10))
		b.WriteByte('\n')
	}
	hist := func(name, help string, h *Histogram) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n")
		inner := lbl[1 : len(lbl)-1]
		var cum uint64
		for i, n := range h.Counts {
			cum += n
			le := "+Inf"
			if i < len(histBounds) {
				le = strconv.FormatFloat(histBounds[i], 'g', -1, 64)
			}
			b.WriteString(name + `_bucket{` + inner + `,le="` + le + `"} ` + strconv.FormatUint(cum, 10) + "\n")
		}
		b.WriteString(name + "_sum" + lbl + " " + strconv.FormatFloat(h.Sum, 'g', -1, 64) + "\n")
		b.WriteString(name + "_count" + lbl + " " + strconv.FormatUint(h.Count, 10) + "\n")
	}

	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(s.Running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(s.Waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.KVCacheUsage())
	gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage (older name).", s.KVCacheUsage())
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.PrefixQueries)
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.PrefixHits)
	counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in tokens (older name).", s.PrefixQueries)
	counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in tokens (older name).", s.PrefixHits)
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.PromptTokens)
	counter("vllm:generation_tokens", "Number of generation tokens processed.", s.GenerationTokens)
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.Preemptions)
	b.WriteString("# HELP vllm:request_success Count of successfully processed requests.\n# TYPE vllm:request_success counter\n")
	b.WriteString(`vllm:request_success_total{engine="0",finished_reason="length",model_name=` + strconv.Quote(cfg.Model) + "} " +
		strconv.FormatUint(s.RequestsFinished, 10) + "\n")
	hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &s.TTFT)
	hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &s.E2E)
	b.WriteString("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	b.WriteString(`vllm:cache_config_info{block_size="` + strconv.Itoa(cfg.BlockSize) +
		`",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="` +
		strconv.FormatFloat(cfg.GPUMemoryUtilization, 'g', -1, 64) +
		`",num_cpu_blocks="None",num_gpu_blocks="` + strconv.Itoa(cfg.NumGPUBlocks) + `"} 1` + "\n")
	b.WriteString("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\n")
	b.WriteString("process_start_time_seconds " + strconv.FormatFloat(startUnix, 'f', 3, 64) + "\n")
}
