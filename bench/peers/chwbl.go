package peers

import (
	"strings"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// DefaultCHWBLPrefixChars is KubeAI's default prefixCharLength, 100: the characters of the
// first user message that are hashed.
const DefaultCHWBLPrefixChars = 100

// DefaultCHWBLLoadFactor is KubeAI's default meanLoadPercentage, 125: no endpoint takes a
// request that would put its in-flight count above 1.25 × the mean.
const DefaultCHWBLLoadFactor = 1.25

// CHWBLOptions tune the chwbl peer; zero fields take the defaults.
type CHWBLOptions struct {
	// LoadFactor is the bound on an endpoint's in-flight count as a multiple of the mean
	// (0: DefaultCHWBLLoadFactor).
	LoadFactor float64
	// PrefixChars is how many leading characters of the first user message are hashed
	// (0: DefaultCHWBLPrefixChars).
	PrefixChars int
}

// CHWBL is KubeAI's PrefixHash load balancing: consistent hashing with bounded loads
// (CHWBL) keyed on the start of the prompt. Source: substratusai/kubeai
// internal/loadbalancer/balance_chwbl.go and api/k8s/v1/model_types.go (prefixHash,
// meanLoadPercentage 125), docs/benchmarks/prefix-aware-load-balancing.md; summarised in
// ../shared/research/peers-2026.md §1.
//
// The key is KubeAI's: the model (KubeAI's adapter) and the first PrefixChars (100)
// characters of the first user message (chat; for completions, of the prompt), hashed with
// xxhash, read from the request body (key.Key.Body). A body without a user message of text
// is keyed on its first key.HeadChunks chunks instead (Chunks[key.HeadChunks-1]: the first
// key.DefaultChunkTokens/4 approximate tokens of the rendered prompt); a request with neither
// goes to the least loaded candidate.
//
// The ring is prefixlb's hashring (160 points per backend where KubeAI uses 256, xxhash
// both). Load is this proxy's in-flight count per backend, as KubeAI counts in-flight
// requests per endpoint. The walk from the key's point takes the first candidate whose load
// after taking the request stays within LoadFactor × the mean including it:
// load + 1 ≤ LoadFactor × (total + 1) / n, with every load accepted while total is 0. If none
// qualifies, the least loaded candidate. It keeps no prefix index and learns nothing.
type CHWBL struct {
	loadFactor  float64
	prefixChars int
	ring        atomic.Pointer[placement]
	rot         rotor
}

// placement is an immutable ring over the configured backends.
type placement struct {
	ring *hashring.Ring
	ids  []uint64 // ring member → backend ID
}

// NewCHWBL returns a chwbl policy; call SetBackends before use.
func NewCHWBL(o CHWBLOptions) *CHWBL {
	if o.LoadFactor <= 0 {
		o.LoadFactor = DefaultCHWBLLoadFactor
	}
	if o.PrefixChars <= 0 {
		o.PrefixChars = DefaultCHWBLPrefixChars
	}
	return &CHWBL{loadFactor: o.LoadFactor, prefixChars: o.PrefixChars}
}

// SetBackends rebuilds the ring over every configured backend.
func (p *CHWBL) SetBackends(all []*backend.Backend) {
	ms := make([]hashring.Member, len(all))
	ids := make([]uint64, len(all))
	for i, b := range all {
		ms[i] = hashring.Member{Name: b.Name, Weight: b.Weight()}
		ids[i] = b.ID
	}
	p.ring.Store(&placement{ring: hashring.New(ms), ids: ids})
}

// ModelsChanged: CHWBL keeps no state per model pool.
func (p *CHWBL) ModelsChanged(*backend.Backend) {}

// Pick places k by its key (see CHWBL) on the ring within the load bound (router.ReasonCold when
// the key's owner took it, router.ReasonOverload when the walk passed it), or the least
// loaded candidate (router.ReasonLeastLoad) without a key, a ring or a candidate under it.
func (p *CHWBL) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return p.pick(k, cs, true) }

// Preview is Pick without turning the tie-break's rotation.
func (p *CHWBL) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *CHWBL) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	least := func() router.Decision {
		j := argmin(n, p.rot.startAt(commit), func(j int) float64 { return float64(cs[j].InFlight()) })
		return router.Decision{Backend: cs[j], Reason: router.ReasonLeastLoad}
	}
	pl := p.ring.Load()
	if k == nil || pl == nil {
		return least()
	}
	h, ok := firstUserHash(k, p.prefixChars)
	if !ok {
		return least()
	}
	var total int64
	byID := make(map[uint64]int, n)
	for j, b := range cs {
		total += b.InFlight()
		byID[b.ID] = j
	}
	bound := p.loadFactor * float64(total+1) / float64(n)
	owner := pl.ring.Lookup(h, nil)
	m := pl.ring.Lookup(h, func(m int) bool {
		j, ok := byID[pl.ids[m]]
		return ok && (total == 0 || float64(cs[j].InFlight()+1) <= bound+boundSlack)
	})
	if m < 0 {
		return least()
	}
	r := router.ReasonCold
	if m != owner {
		r = router.ReasonOverload
	}
	return router.Decision{Backend: cs[byID[pl.ids[m]]], Reason: r}
}

// firstUserHash is KubeAI's key for k's request: xxhash of the model, a zero byte and the
// first n characters of the first user message's text (chat) or of the prompt (completions);
// else the last head chunk (key.HeadChunks); ok is false with neither.
func firstUserHash(k *key.Key, n int) (uint64, bool) {
	var text string
	if len(k.Body) > 0 {
		var pr fastjson.Parser
		if v, err := pr.ParseBytes(k.Body); err == nil {
			text = firstUserText(v)
		}
	}
	if text == "" {
		if len(k.Chunks) < key.HeadChunks {
			return 0, false
		}
		return k.Chunks[key.HeadChunks-1], true
	}
	if r := []rune(text); len(r) > n {
		text = string(r[:n])
	}
	d := xxhash.New()
	_, _ = d.Write(k.Model)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(text)
	return d.Sum64(), true
}

// firstUserText is the text of the first user message of a chat body (string content, or its
// text parts joined), or a completions body's string prompt; "" if none.
func firstUserText(v *fastjson.Value) string {
	for _, m := range v.GetArray("messages") {
		if string(m.GetStringBytes("role")) != "user" {
			continue
		}
		c := m.Get("content")
		if c == nil {
			return ""
		}
		if c.Type() == fastjson.TypeString {
			return string(c.GetStringBytes())
		}
		var b strings.Builder
		for _, part := range c.GetArray() {
			if string(part.GetStringBytes("type")) == "text" {
				b.Write(part.GetStringBytes("text"))
			}
		}
		return b.String()
	}
	return string(v.GetStringBytes("prompt"))
}

// boundSlack absorbs float rounding in the load bound (loads are whole requests).
const boundSlack = 1e-9

var (
	_ router.Policy = (*CHWBL)(nil)
	_ router.Fleet  = (*CHWBL)(nil)
)
