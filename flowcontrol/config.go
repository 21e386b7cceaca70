package flowcontrol

import (
	"fmt"
	"time"
)

// Defaults of Config; docs/flow-control.md gives the reasoning.
const (
	// DefaultMaxItems bounds the queued requests of one pool.
	DefaultMaxItems = 1024
	// DefaultMaxBytes bounds the queued request bodies of one pool (64 MiB); the caller also
	// counts them against its body budget.
	DefaultMaxBytes = 64 << 20
	// DefaultMinBandShare is the share of dispatched GPU work guaranteed to each backlogged
	// lower band while higher bands are backlogged.
	DefaultMinBandShare = 0.05
	// DefaultMaxRequestWork caps one request's charge (token-equivalents): a 128k-token
	// uncached prompt generating 64k tokens is 256k at the default weights.
	DefaultMaxRequestWork = 256 << 10
	// DefaultPrefillWeight and DefaultDecodeWeight weigh a prefill token and a generated
	// token in GPU work, the weights of the virtual token counter paper (w_p = 1, w_q = 2).
	DefaultPrefillWeight = 1
	DefaultDecodeWeight  = 2
	// DefaultMaxQueueWait is how long the caller lets a request wait queued (its Deadline)
	// when the client sets no shorter deadline: long enough to ride out a burst, short
	// enough that a client still waits for the answer.
	DefaultMaxQueueWait = 30 * time.Second
	// DefaultLIFOAfter is how long a flow's oldest queued request may wait before the flow is
	// served newest first (Config.LIFOAfter): twice a chat reply's TTFT objective, so a queue
	// that a burst built and that drains within it keeps arrival order.
	DefaultLIFOAfter = time.Second
	// DefaultBurstCredit is the work a flow that comes back to the backlog may take ahead of
	// the flows served while it was away (Config.BurstCredit): a handful of chat turns or
	// one long prompt, and no more than a flow under its share has to catch up.
	DefaultBurstCredit = 64 << 10
	// DefaultBandMemory is how long a band counts as served lately after its last request
	// (Config.BandMemory): several of a chat user's turns, so that a band whose requests come
	// every few seconds is not forgotten between two of them.
	DefaultBandMemory = 10 * time.Second
)

// Fairness policies between the flows of one band (Config.Fairness).
const (
	// FairnessVTC serves the backlogged flow with the least GPU work served (the virtual
	// token counter of Sheng et al., OSDI '24), each dispatch charged its predicted work and
	// corrected to the real work at Settle. The default.
	FairnessVTC = "vtc"
	// FairnessRoundRobin serves the backlogged flows in turn, one request each per round,
	// whatever each request costs: the default inter-flow policy of llm-d's flow control
	// (gateway-api-inference-extension pkg/epp/flowcontrol, "round-robin"). A flow whose
	// requests cost 20× more gets 20× the GPU work. Kept for the bench's llm-d-style arm
	// (bench/README.md, llm-d-fc), so that the two orderings are measured side by side.
	FairnessRoundRobin = "round-robin"
)

// Config bounds and tunes a Queue. Zero fields take the defaults.
type Config struct {
	// MaxItems bounds queued requests; Push beyond it fails with ErrFull.
	MaxItems int
	// MaxBytes bounds queued body bytes; Push beyond it fails with ErrBytesFull.
	MaxBytes int64
	// MinBandShare in [0, 0.5] is the share of dispatched work each backlogged band is
	// guaranteed against the bands above it; negative means 0 (strict bands).
	MinBandShare float64
	// MaxRequestWork caps the work charged for one request (predicted or settled), so a
	// wrong prediction moves its flow's counter by a bounded amount.
	MaxRequestWork int64
	// PrefillWeight and DecodeWeight convert Cost to work: an uncached prefill token costs
	// PrefillWeight, a generated token DecodeWeight.
	PrefillWeight int64
	DecodeWeight  int64
	// Fairness is how a band chooses among its backlogged flows: FairnessVTC ("" means it)
	// or FairnessRoundRobin. Priority bands, the guaranteed band share (counted in work
	// either way) and arrival order within a flow are the same under both.
	Fairness string
	// LIFOAfter makes a flow's order adaptive (adaptive LIFO, as in Facebook's "Fail at
	// Scale", 2015): arrival order while the flow's oldest queued request has waited less
	// than LIFOAfter, newest first once it has. A queue standing that long is one the fleet
	// cannot serve within its clients' patience; in arrival order every dispatched request is
	// then the one closest to being abandoned, and the engine's prefill of it is likely spent
	// on a client that is gone. Newest first serves the requests most likely to still be
	// wanted; the oldest wait for the backlog to clear or are refused at their deadline.
	// A head without an Arrival has no age: arrival order. Zero means DefaultLIFOAfter;
	// negative keeps arrival order always.
	LIFOAfter time.Duration
	// BurstCredit bounds the credit, in token-equivalents, of a flow that becomes backlogged
	// again: its counter is lifted to the least backlogged counter less BurstCredit (never
	// lowered), so a flow under its share that comes back with a burst has up to that much
	// work served before the flows that were served while it was away, and a flow over its
	// share, always backlogged, has none. Without it (the virtual token counter's plain
	// lift) the flow under its share alternates with the flooding one from its first
	// request, and its queue stands whenever its rate nears half the fleet's. Round-robin
	// fairness takes no credit (a turn is a request). Zero means DefaultBurstCredit;
	// negative means none.
	BurstCredit int64
	// BandMemory is how long the highest band noted (Queue.NoteBand) is remembered after its
	// last request (Queue.TopBand). Zero means DefaultBandMemory; negative turns the memory
	// off (TopBand never reports a band).
	BandMemory time.Duration
}

// withDefaults fills zero fields and validates the rest.
func (c Config) withDefaults() (Config, error) {
	if c.MaxItems == 0 {
		c.MaxItems = DefaultMaxItems
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	switch {
	case c.MinBandShare == 0:
		c.MinBandShare = DefaultMinBandShare
	case c.MinBandShare < 0:
		c.MinBandShare = 0
	}
	if c.MaxRequestWork == 0 {
		c.MaxRequestWork = DefaultMaxRequestWork
	}
	if c.PrefillWeight == 0 {
		c.PrefillWeight = DefaultPrefillWeight
	}
	if c.DecodeWeight == 0 {
		c.DecodeWeight = DefaultDecodeWeight
	}
	if c.Fairness == "" {
		c.Fairness = FairnessVTC
	}
	if c.LIFOAfter == 0 {
		c.LIFOAfter = DefaultLIFOAfter
	}
	if c.BandMemory == 0 {
		c.BandMemory = DefaultBandMemory
	}
	switch {
	case c.BurstCredit == 0:
		c.BurstCredit = DefaultBurstCredit
	case c.BurstCredit < 0:
		c.BurstCredit = 0
	}
	switch {
	case c.MaxItems < 0:
		return c, fmt.Errorf("flowcontrol: MaxItems %d < 0", c.MaxItems)
	case c.MaxBytes < 0:
		return c, fmt.Errorf("flowcontrol: MaxBytes %d < 0", c.MaxBytes)
	case c.MinBandShare > 0.5:
		return c, fmt.Errorf("flowcontrol: MinBandShare %g > 0.5", c.MinBandShare)
	case c.MaxRequestWork < 1:
		return c, fmt.Errorf("flowcontrol: MaxRequestWork %d < 1", c.MaxRequestWork)
	case c.PrefillWeight < 0 || c.DecodeWeight < 0:
		return c, fmt.Errorf("flowcontrol: negative weight (prefill %d, decode %d)", c.PrefillWeight, c.DecodeWeight)
	case c.Fairness != FairnessVTC && c.Fairness != FairnessRoundRobin:
		return c, fmt.Errorf("flowcontrol: Fairness %q is not %q or %q", c.Fairness, FairnessVTC, FairnessRoundRobin)
	}
	return c, nil
}

// roundRobin reports whether flows take turns by request rather than by work.
func (c Config) roundRobin() bool { return c.Fairness == FairnessRoundRobin }

// Work converts a cost to work in token-equivalents, clamped to [1, MaxRequestWork]: never
// zero, so a band's guaranteed share always has something to pay for.
func (c Config) Work(cost Cost) int64 {
	return max(c.weigh(cost), 1)
}

// weigh is cost's work clamped to [0, MaxRequestWork], computed without overflow: a cost
// whose weighted tokens exceed int64 is charged the cap, as any cost above it is.
func (c Config) weigh(cost Cost) int64 {
	capped := func(weight int64, tokens int) int64 {
		n := int64(max(tokens, 0))
		if n == 0 || weight == 0 {
			return 0
		}
		if weight > c.MaxRequestWork/n {
			return c.MaxRequestWork
		}
		return weight * n
	}
	p, d := capped(c.PrefillWeight, cost.UncachedPrefillTokens), capped(c.DecodeWeight, cost.OutputTokens)
	if p > c.MaxRequestWork-d {
		return c.MaxRequestWork
	}
	return p + d
}
