package sim

import (
	"testing"
	"time"
)

// agenticState builds an engine loaded like the suite's agentic near-saturation cell: a
// shared 17k-token tools+system prefix, `running` sessions of ~ctx tokens decoding, `waiting`
// more queued behind them.
func agenticState(tb testing.TB, running, waiting, ctx int) *Engine {
	e := NewEngine(DefaultConfig())
	id := 0
	add := func() {
		s := spec{shared: 17000, own: ctx - 17000, max: 1500}
		if err := e.Add(NewRequest(s.prompt(id), s.max, 7, false, false), 0); err != nil {
			tb.Fatal(err)
		}
		id++
	}
	for range running {
		add()
	}
	now := time.Duration(0)
	for range 40 { // prefill them and start decoding
		d, ok := e.Schedule()
		if !ok {
			break
		}
		now += d
		e.Complete(now)
	}
	for range waiting {
		add()
	}
	return e
}

// BenchmarkPredictAgentic: Predict on engines loaded like the suite's agentic cells, hashing
// the 100k-token probe each time (Predict) or walking only, the probe hashed once by
// NewPending (PredictPending: what the oracle does under each replica's mutex, which the
// replica's engine loop needs for Schedule and Complete).
func BenchmarkPredictAgentic(b *testing.B) {
	for _, c := range []struct {
		name                  string
		running, waiting, ctx int
	}{{"light-4run-0wait-50k", 4, 0, 50000}, {"sat-6run-4wait-60k", 6, 4, 60000}, {"sat-8run-8wait-100k", 8, 8, 100000}} {
		b.Run(c.name, func(b *testing.B) {
			e := agenticState(b, c.running, c.waiting, c.ctx)
			probe := spec{shared: 17000, own: 83000, max: 200}.prompt(999)
			q := NewPending(probe, 7, 200, DefaultConfig().BlockSize)
			for _, v := range []struct {
				name    string
				predict func() Prediction
			}{
				{"Predict", func() Prediction { return e.Predict(probe, 7, 200, 0, nil) }},
				{"PredictPending", func() Prediction { return e.PredictPending(q, 0, nil) }},
			} {
				b.Run(v.name, func(b *testing.B) {
					var p Prediction
					for b.Loop() {
						p = v.predict()
					}
					b.ReportMetric(float64(p.TTFT)/1e6, "ttft-model-ms")
					if !p.OK {
						b.Log("not OK")
					}
				})
			}
		})
	}
}

// TestPredictPendingIsPredict: the walk on a prompt hashed once (NewPending) predicts what
// Predict on its tokens does, and a Pending cut for another block size predicts nothing.
func TestPredictPendingIsPredict(t *testing.T) {
	e := agenticState(t, 6, 4, 60000)
	probe := spec{shared: 17000, own: 23000, max: 200}.prompt(999)
	bs := DefaultConfig().BlockSize
	want := e.Predict(probe, 7, 200, 0, nil)
	if !want.OK || want.CachedTokens == 0 {
		t.Fatalf("Predict %+v: want OK with the shared prefix cached", want)
	}
	if got := e.PredictPending(NewPending(probe, 7, 200, bs), 0, nil); got != want {
		t.Errorf("PredictPending %+v, Predict %+v", got, want)
	}
	if got := e.PredictPending(NewPending(probe, 7, 200, 2*bs), 0, nil); got.OK {
		t.Errorf("a Pending of block size %d on an engine of %d: %+v, want not OK", 2*bs, bs, got)
	}
}

func BenchmarkBlockChain100k(b *testing.B) {
	probe := spec{shared: 17000, own: 83000, max: 200}.prompt(999)
	for b.Loop() {
		_ = blockChain(probe, 7, 16)
	}
}
