package sim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkEngineStep measures one engine step (Schedule + Complete) in steady state: 64
// requests of 2000 prompt tokens (1500 shared) and 200 output tokens, each replaced by a new one
// when it finishes, so steps mix decode, admission with prefix hits and chunked prefill.
func BenchmarkEngineStep(b *testing.B) {
	e := NewEngine(DefaultConfig())
	shared := seq(0, 1500)
	next := 0
	newReq := func() *Request {
		p := append(append(make([]uint32, 0, 2200), shared...), seq(100000+next*500, 500)...)
		next++
		return NewRequest(p, 200, 1, false, true)
	}
	live := make([]*Request, 64)
	for i := range live {
		live[i] = newReq()
		if err := e.Add(live[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	var now time.Duration
	step := func() {
		d, ok := e.Schedule()
		if !ok {
			b.Fatal("idle")
		}
		now += d
		e.Complete(now)
		for i, r := range live {
			select {
			case <-r.Ready(): // drain, as a handler would
			default:
			}
			if r.Done() {
				live[i] = newReq()
				if err := e.Add(live[i], now); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for range 500 { // reach steady state
		step()
	}
	start := e.Stats().GenerationTokens
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		step()
	}
	b.StopTimer()
	toks := e.Stats().GenerationTokens - start
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(toks), "ns/token")
	b.ReportMetric(float64(toks)/float64(b.N), "tokens/step")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHTTPStreamToken measures the whole streaming path over loopback HTTP: 4×GOMAXPROCS
// concurrent chat streams of 256 tokens on one replica, read line by line by a Go client in the
// same process. cpu-ns/token is the process's CPU time (server and client together) per
// generated token: an upper bound on the sim's own cost.
//   - burst: speedup 1e6, model time is nearly free and tokens coalesce into few writes;
//   - paced: speedup 50 (a decode step ≈ 130µs of wall time), so each token is its own event,
//     write and flush, as at real speed.
func BenchmarkHTTPStreamToken(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchStream(b, 1e6) })
	b.Run("paced", func(b *testing.B) { benchStream(b, 50) })
}

func benchStream(b *testing.B, speedup float64) {
	cfg := DefaultConfig()
	cfg.Speedup = speedup
	c, err := StartCluster(cfg, 1, "127.0.0.1", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	url := c.URLs()[0] + "/v1/chat/completions"
	tr := &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	const maxTokens = 256
	doc := strings.Repeat("Some shared document text for the benchmark. ", 100)
	run := func(i int) {
		body := `{"stream":true,"stream_options":{"include_usage":true},"max_tokens":` + strconv.Itoa(maxTokens) +
			`,"messages":[{"role":"system","content":"` + doc + `"},{"role":"user","content":"q` + strconv.Itoa(i) + `"}]}`
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			b.Error(err)
			return
		}
		br := bufio.NewReaderSize(resp.Body, 4096)
		events := 0
		for {
			line, err := br.ReadSlice('\n')
			if len(line) > 6 && string(line[:6]) == "data: " {
				events++
			}
			if err != nil {
				break
			}
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := maxTokens + 3; events != want { // role chunk, tokens, usage, [DONE]
			b.Errorf("%d events, want %d", events, want)
		}
	}
	run(-1) // warm up
	cpu0 := cpuTime()
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(4) // 4×GOMAXPROCS concurrent streams
	var n int64
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			run(i)
			i++
		}
	})
	b.StopTimer()
	n = int64(b.N) * maxTokens
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/token")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/token")
}
