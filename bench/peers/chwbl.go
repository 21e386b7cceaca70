package peers

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// DefaultCHWBLPrefixChars is KubeAI's default prefixCharLength, 100: the characters of the
// first user message that are hashed.
const DefaultCHWBLPrefixChars = 100

// DefaultCHWBLLoadFactor is KubeAI's default meanLoadPercentage, 125 (api/k8s/v1/
// model_types.go, PrefixHash): an endpoint takes the request while its in-flight count is at
// most 1.25 × the mean in-flight count with the request counted in the total.
const DefaultCHWBLLoadFactor = 1.25

// DefaultCHWBLPoints is KubeAI's default replication, 256 (api/k8s/v1/model_types.go,
// PrefixHash): the points each endpoint has on the ring.
const DefaultCHWBLPoints = 256

// CHWBLOptions tune the chwbl peer; zero fields take the defaults.
type CHWBLOptions struct {
	// LoadFactor is the bound on an endpoint's in-flight count as a multiple of the mean
	// (0: DefaultCHWBLLoadFactor; KubeAI refuses less than 1).
	LoadFactor float64
	// PrefixChars is how many leading characters of the first user message are hashed
	// (0: DefaultCHWBLPrefixChars).
	PrefixChars int
	// Points is the ring points per backend (0: DefaultCHWBLPoints).
	Points int
}

// CHWBL is KubeAI's PrefixHash load balancing: consistent hashing with bounded loads
// (CHWBL) keyed on the start of the prompt. Source: kubeai-project/kubeai (formerly
// substratusai/kubeai) internal/loadbalancer/balance_chwbl.go (chwblGetAddr, chwblLoadOK,
// chwblAddEndpoint) and group.go (getBestAddr: the key, in-flight counting), defaults in
// api/k8s/v1/model_types.go (meanLoadPercentage 125, replication 256, prefixCharLength 100);
// docs/benchmarks/prefix-aware-load-balancing.md. Summarised in
// ../shared/research/peer-audit-2026-12.md.
//
// The key is KubeAI's: the model (KubeAI keys on its adapter; it keeps one ring per model)
// and the first PrefixChars (100) characters of the first user message (chat; for
// completions, of the prompt), hashed with xxhash, read from the request body (key.Key.Body).
// A body without a user message of text is keyed on its first key.HeadChunks chunks instead
// (Chunks[key.HeadChunks-1]: the first key.DefaultChunkTokens/4 approximate tokens of the
// rendered prompt); a request with neither goes to the least loaded candidate.
//
// The ring is KubeAI's: Points (256) points per backend, point i at xxhash(name + decimal
// i), no weights. The walk starts at the first point at or after the key's hash (wrapping)
// and takes the first candidate whose load passes KubeAI's bound
//
//	load ≤ LoadFactor × (total + 1) / n
//
// where load is this proxy's in-flight count on the candidate (the request itself not
// counted, as KubeAI counts it only once an endpoint is chosen), total the candidates' sum
// and n their number; every load passes while total is 0. If none passes, the first
// candidate the walk met (KubeAI's default endpoint: the key's owner among the candidates),
// never the least loaded. With LoadFactor ≥ 1 some candidate always passes (the least
// loaded holds at most total/n), so that fallback is only reached with a smaller factor. It
// keeps no prefix index and learns nothing.
type CHWBL struct {
	loadFactor  float64
	prefixChars int
	points      int
	ring        atomic.Pointer[chwblRing]
	rot         rotor
}

// chwblRing is an immutable ring over the configured backends: points sorted by hash, each
// naming its backend's ID.
type chwblRing struct {
	hash []uint64
	id   []uint64
}

// NewCHWBL returns a chwbl policy; call SetBackends before use.
func NewCHWBL(o CHWBLOptions) *CHWBL {
	if o.LoadFactor <= 0 {
		o.LoadFactor = DefaultCHWBLLoadFactor
	}
	if o.PrefixChars <= 0 {
		o.PrefixChars = DefaultCHWBLPrefixChars
	}
	if o.Points <= 0 {
		o.Points = DefaultCHWBLPoints
	}
	return &CHWBL{loadFactor: o.LoadFactor, prefixChars: o.PrefixChars, points: o.Points}
}

// SetBackends rebuilds the ring over every configured backend.
func (p *CHWBL) SetBackends(all []*backend.Backend) {
	type point struct{ hash, id uint64 }
	pts := make([]point, 0, len(all)*p.points)
	for _, b := range all {
		for i := range p.points {
			pts = append(pts, point{xxhash.Sum64String(b.Name + strconv.Itoa(i)), b.ID})
		}
	}
	slices.SortFunc(pts, func(a, b point) int { return cmp.Compare(a.hash, b.hash) })
	r := &chwblRing{hash: make([]uint64, len(pts)), id: make([]uint64, len(pts))}
	for i, pt := range pts {
		r.hash[i], r.id[i] = pt.hash, pt.id
	}
	p.ring.Store(r)
}

// walk calls visit with each backend ID in the order the walk from h meets them on r, each
// once, until visit returns false.
func (r *chwblRing) walk(h uint64, visit func(id uint64) bool) {
	n := len(r.hash)
	start, _ := slices.BinarySearch(r.hash, h)
	seen := make(map[uint64]bool, 8)
	for i := range n {
		id := r.id[(start+i)%n]
		if seen[id] {
			continue
		}
		seen[id] = true
		if !visit(id) {
			return
		}
	}
}

// ModelsChanged: CHWBL keeps no state per model pool.
func (p *CHWBL) ModelsChanged(*backend.Backend) {}

// Pick places k by its key (see CHWBL) on the ring within the load bound (router.ReasonCold
// when the first candidate on the walk took it, or none passed and it gets it anyway;
// router.ReasonOverload when the walk passed over it), or the least loaded candidate
// (router.ReasonLeastLoad) without a key or a ring.
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
	r := p.ring.Load()
	if k == nil || r == nil || len(r.hash) == 0 {
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
	first, chosen, met := -1, -1, 0
	r.walk(h, func(id uint64) bool {
		j, ok := byID[id]
		if !ok {
			return true
		}
		if first < 0 {
			first = j
		}
		if total == 0 || float64(cs[j].InFlight()) <= bound+boundSlack {
			chosen = j
			return false
		}
		met++
		return met < n
	})
	switch {
	case chosen >= 0 && chosen != first:
		return router.Decision{Backend: cs[chosen], Reason: router.ReasonOverload}
	case first >= 0:
		return router.Decision{Backend: cs[first], Reason: router.ReasonCold}
	}
	return least() // a candidate not on the ring (SetBackends not told of it)
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
