package peers

import (
	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// Weights of the llm-d default scheduling profile: GIE config/charts/epplib/templates/
// _config.yaml, the same as llm-d-router pkg/epp/config/loader/defaults.go.
const (
	// DefaultLLMDQueueWeight is queue-scorer's weight, 2.
	DefaultLLMDQueueWeight = 2
	// DefaultLLMDKVWeight is kv-cache-utilization-scorer's weight, 2.
	DefaultLLMDKVWeight = 2
	// DefaultLLMDPrefixWeight is prefix-cache-scorer's weight, 3.
	DefaultLLMDPrefixWeight = 3
)

// LLMDOptions tune the llm-d peer; zero weights take the defaults above.
type LLMDOptions struct {
	// Prefix sizes the approximate index (chunk size, capacity), as prefix mode's.
	Prefix                              router.PrefixOptions
	QueueWeight, KVWeight, PrefixWeight float64
}

// LLMD is the llm-d / Gateway API Inference Extension endpoint picker in its default
// scheduling profile: prefix-cache-scorer ×3, queue-scorer ×2,
// kv-cache-utilization-scorer ×2, max-score-picker. Source: GIE
// site-src/guides/epp-configuration/config-text.md and config/charts/epplib/templates/
// _config.yaml, pkg/epp/scheduling/scheduler_profile.go, the scorers under
// pkg/epp/scheduling/framework/plugins (v1.5.0); summarised in
// ../shared/research/llm-d-gie.md §1.
//
// Each scorer gives a candidate a score in [0, 1]; the candidate of the highest weighted sum
// wins, ties at random (here: a rotating start).
//
//   - prefix: matched blocks ÷ the prompt's blocks, from prefixlb's approximate index (the
//     approximate prefix-cache producer likewise records each request's blocks for the pod
//     it was sent to, with an LRU per pod); a block is a prefixlb chunk, counted by the
//     tokens it spans (key.PrefixTokens), as llm-d's blocks are all one size and prefixlb's
//     head chunks are smaller (key.HeadChunks: a 4-token match is not a block's score).
//   - queue: (max q − q) ÷ (max q − min q) over the candidates, 1 when all are equal. llm-d
//     scrapes vLLM's waiting-queue length; q here is the candidate's Load (this proxy's
//     in-flight count, or the replica's scraped running + waiting requests when higher),
//     which counts running requests too.
//   - kv-cache-utilization: 1 − usage. llm-d scrapes vLLM's KV-cache usage; a proxy has no
//     such figure, so usage is estimated as Load × the mean prompt tokens of the requests
//     this policy has routed ÷ the candidate's KV capacity, at most 1 (the blocks running
//     requests pin; cached blocks nobody uses count as free in vLLM too).
//
// The reason is router.ReasonMatch when the chosen candidate holds part of the prompt, else
// router.ReasonLeastLoad.
type LLMD struct {
	tree
	o    LLMDOptions
	mean router.RunningMean
	rot  rotor
}

// NewLLMD returns an llm-d policy; call SetBackends before use.
func NewLLMD(o LLMDOptions) *LLMD {
	if o.QueueWeight <= 0 {
		o.QueueWeight = DefaultLLMDQueueWeight
	}
	if o.KVWeight <= 0 {
		o.KVWeight = DefaultLLMDKVWeight
	}
	if o.PrefixWeight <= 0 {
		o.PrefixWeight = DefaultLLMDPrefixWeight
	}
	return &LLMD{tree: newTree(o.Prefix), o: o}
}

// Pick returns the candidate of the highest weighted score.
func (p *LLMD) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return p.pick(k, cs, true) }

// Preview is Pick without folding the prompt into the running mean or turning the rotation.
func (p *LLMD) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *LLMD) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	prompt, blocks, chunked := 0, 0, 0
	if k != nil {
		prompt, blocks = k.PromptTokens, len(k.Chunks)
		chunked = key.PrefixTokens(blocks, p.o.Prefix.ChunkTokens)
	}
	mean := observe(&p.mean, float64(prompt), commit)
	matched := p.match(k, cs)
	q := make([]int64, n)
	lo, hi := cs[0].Load(), cs[0].Load()
	for j, b := range cs {
		q[j] = b.Load()
		lo, hi = min(lo, q[j]), max(hi, q[j])
	}
	defKV := p.defaultKV
	j := argmin(n, p.rot.startAt(commit), func(j int) float64 {
		var s float64
		if chunked > 0 {
			s += p.o.PrefixWeight * float64(key.PrefixTokens(matched[j], p.o.Prefix.ChunkTokens)) / float64(chunked)
		}
		queue := 1.0
		if hi > lo {
			queue = float64(hi-q[j]) / float64(hi-lo)
		}
		s += p.o.QueueWeight * queue
		usage := 1.0
		if c := cs[j].KVCapacity(defKV); c > 0 {
			usage = min(float64(q[j])*mean/float64(c), 1)
		}
		s += p.o.KVWeight * (1 - usage)
		return -s
	})
	r := router.ReasonLeastLoad
	if matched[j] > 0 {
		r = router.ReasonMatch
	}
	return router.Decision{Backend: cs[j], Reason: r, MatchedChunks: matched[j]}
}

var (
	_ router.Policy    = (*LLMD)(nil)
	_ router.Fleet     = (*LLMD)(nil)
	_ router.Learner   = (*LLMD)(nil)
	_ router.Inspector = (*LLMD)(nil)
)
