package backend

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of a replica's prefill model before it has learned its own.
const (
	// DefaultPrefillRate is 10,000 prompt tokens per second: an 8B model prefills 10–20k
	// tokens/s on one H100 under vLLM (bench/sim's model: 18.5k), a 70B model on 4 of them
	// about as many; the low end, so that an unlearned replica does not look fast.
	DefaultPrefillRate = 10_000.0
	// DefaultPrefillBase is 20 ms: the time to first token of a request with nothing to
	// prefill, one engine step with a batch of decodes (vLLM's 8B steps take 6–30 ms on H100).
	DefaultPrefillBase = 20 * time.Millisecond
	// MinPrefillSamples: a replica's own estimate is used once it has this many observations
	// of each kind (rate and base); before that, the caller's fallback.
	MinPrefillSamples = 8
	// minRateWork is the prefill work (tokens) from which an observation measures the rate;
	// below it the time to first token is mostly the fixed step cost and measures the base.
	minRateWork = 512
	// prefillStep is how far (in log space: 2%) one observation moves a learned estimate
	// toward it, whatever its size: the estimate follows the median of the observations, so
	// stalled requests and bursts of cache hits move it by a step each, not to their value;
	// a twofold change is followed in about 35 observations.
	prefillStep = 0.02
)

// PrefillModel is what prefixlb has learned of one replica's prefill speed, from the time to
// first token it measured for the requests it sent (Lease.FirstByte):
//
//	TTFT ≈ Base + work ÷ Rate
//
// where work is the prefill work the replica had to do, as Lease.Begin was given it: this
// request's, less what the policy predicted cached, plus what this proxy had sent there
// before it that had not started answering (the prefix policy's router.PrefillWork, tokens
// weighted by their attention). Rate is in tokens per second, learned from requests with at
// least 512 tokens of work; Base from those with less. Each is a running median in log space
// (see prefillStep), robust to outliers. Decode interference, other clients' load and the
// replica's own scheduling are not modelled apart: they are in what is measured. Safe for
// concurrent use; the zero value is ready.
type PrefillModel struct {
	mu           sync.Mutex
	logRate      float64 // ln tokens/s
	logBase      float64 // ln seconds
	nRate, nBase int
	rateBits     atomic.Uint64 // published tokens/s (0: not yet learned)
	baseBits     atomic.Uint64 // published seconds (0: not yet learned)
	samples      atomic.Int64
}

// Observe folds one measured time to first token after work prompt tokens of prefill.
func (m *PrefillModel) Observe(work int64, ttft time.Duration) {
	if ttft <= 0 || work < 0 {
		return
	}
	m.samples.Add(1)
	s := ttft.Seconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	rate := DefaultPrefillRate
	if m.nRate > 0 {
		rate = math.Exp(m.logRate)
	}
	if work < minRateWork {
		// The part that does not scale with the work (at least half the time).
		b := math.Max(s-float64(work)/rate, s/2)
		m.logBase, m.nBase = fold(m.logBase, m.nBase, math.Log(b))
		if m.nBase >= MinPrefillSamples {
			m.baseBits.Store(math.Float64bits(math.Exp(m.logBase)))
		}
		return
	}
	// The work's share of the time: the base is the part that does not scale with it (at
	// least half the time counts, so an overestimated base cannot make the rate infinite).
	base := DefaultPrefillBase.Seconds()
	if m.nBase > 0 {
		base = math.Exp(m.logBase)
	}
	t := math.Max(s-base, s/2)
	m.logRate, m.nRate = fold(m.logRate, m.nRate, math.Log(float64(work)/t))
	if m.nRate >= MinPrefillSamples {
		m.rateBits.Store(math.Float64bits(math.Exp(m.logRate)))
	}
}

// fold adds observation x (a log) to the running estimate est of n observations: the mean of
// the first MinPrefillSamples, then a step of prefillStep toward each observation (a running
// median).
func fold(est float64, n int, x float64) (float64, int) {
	switch {
	case n == 0:
		return x, 1
	case n < MinPrefillSamples:
		return est + (x-est)/float64(n+1), n + 1
	case x > est:
		return est + prefillStep, n + 1
	case x < est:
		return est - prefillStep, n + 1
	}
	return est, n + 1
}

// Rate is the learned prefill rate in tokens per second; ok is false until it has
// MinPrefillSamples observations.
func (m *PrefillModel) Rate() (tokensPerSecond float64, ok bool) {
	r := math.Float64frombits(m.rateBits.Load())
	return r, r > 0
}

// Base is the learned time to first token with nothing to prefill; ok is false until it has
// MinPrefillSamples observations.
func (m *PrefillModel) Base() (time.Duration, bool) {
	b := math.Float64frombits(m.baseBits.Load())
	return time.Duration(b * float64(time.Second)), b > 0
}

// Samples is the number of observations so far.
func (m *PrefillModel) Samples() int64 { return m.samples.Load() }

// Prefill is what this proxy has learned of the replica's prefill speed.
func (b *Backend) Prefill() *PrefillModel { return &b.prefill }

// SetFleetPrefill makes m the fleet's prefill model for b (nil: none): every observation of
// b's (ObservePrefill) teaches m too, and until b's own model has learned its rate
// (MinPrefillSamples), QueuedPrefill drains b's queue at m's rate rather than
// DefaultPrefillRate. The prefix policy gives the backends of each model pool one
// (router.Prefix.SetBackends, and ModelsChanged when a backend's models change), so that a
// fleet of like replicas is judged at its measured speed after its first 8 answers, not each
// replica's 8, and the replicas of another model (another speed) teach it nothing.
func (b *Backend) SetFleetPrefill(m *PrefillModel) { b.fleet.Store(m) }

// FleetPrefill is the pooled model SetFleetPrefill gave b (nil: none).
func (b *Backend) FleetPrefill() *PrefillModel { return b.fleet.Load() }

// ObservePrefill folds one measured time to first token after work tokens of prefill into
// b's prefill model and the fleet's (SetFleetPrefill).
func (b *Backend) ObservePrefill(work int64, ttft time.Duration) {
	b.prefill.Observe(work, ttft)
	if f := b.fleet.Load(); f != nil {
		f.Observe(work, ttft)
	}
}
