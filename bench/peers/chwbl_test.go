package peers

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// ringOrder returns the backends in the order KubeAI's walk from h meets them, computed by
// brute force from KubeAI's point labels (name + decimal i, xxhash, points per backend):
// the points in ascending order of their distance clockwise from h.
func ringOrder(bs []*backend.Backend, h uint64, points int) []int {
	dist := make([]uint64, len(bs)) // each backend's nearest point at or after h, wrapping
	for i, b := range bs {
		dist[i] = math.MaxUint64
		for p := range points {
			dist[i] = min(dist[i], xxhash.Sum64String(b.Name+strconv.Itoa(p))-h) // mod 2^64
		}
	}
	order := make([]int, len(bs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(dist[a], dist[b]) })
	return order
}

// TestCHWBLRules: each rule of KubeAI's chwblGetAddr / chwblLoadOK on hand-made loads, with
// the key's walk order computed independently (ringOrder). The cases marked "old" were
// encoded wrongly before: the bound counted the request itself (load + 1 ≤ …), so an owner
// with the fleet's mean load failed, and every candidate failing sent the request to the
// least loaded.
func TestCHWBLRules(t *testing.T) {
	k := keyOf(chain("conv", 4))
	h := k.Chunks[key.HeadChunks-1]
	tests := []struct {
		name   string
		n      int
		factor float64
		loads  func(order []int) []int // per backend, given the walk order
		omit   int                     // a backend left out of the candidates (-1: none)
		want   func(order []int) int   // backend index (-1: any least loaded)
		reason router.Reason
	}{
		{"idle: the key's owner on the ring", 4, 0, func([]int) []int { return make([]int, 4) }, -1,
			func(o []int) int { return o[0] }, router.ReasonCold},
		{"old: all at 1 in flight, the owner within 1.25 × 5/4", 4, 0, func([]int) []int {
			return []int{1, 1, 1, 1} // bound 1.5625 ≥ 1 (load + 1 = 2 failed it)
		}, -1, func(o []int) int { return o[0] }, router.ReasonCold},
		{"old: two replicas, one request on the owner", 2, 0, func(o []int) []int {
			l := make([]int, 2)
			l[o[0]] = 1 // total 1, bound 1.25 × 2/2 = 1.25 ≥ 1
			return l
		}, -1, func(o []int) int { return o[0] }, router.ReasonCold},
		{"old: the owner at 4 of 13, bound 4.375", 4, 0, func(o []int) []int {
			l := []int{3, 3, 3, 3}
			l[o[0]] = 4 // total 13, bound 1.25 × 14/4 = 4.375 ≥ 4
			return l
		}, -1, func(o []int) int { return o[0] }, router.ReasonCold},
		{"the owner at 5 of 14, over 4.6875: the next on the ring", 4, 0, func(o []int) []int {
			l := []int{3, 3, 3, 3}
			l[o[0]] = 5 // total 14, bound 4.6875 < 5; the next holds 3
			return l
		}, -1, func(o []int) int { return o[1] }, router.ReasonOverload},
		{"four replicas, one request on the owner: the next", 4, 0, func(o []int) []int {
			l := make([]int, 4)
			l[o[0]] = 1 // total 1, bound 0.625 < 1
			return l
		}, -1, func(o []int) int { return o[1] }, router.ReasonOverload},
		{"the owner and the next over the bound: the third, not the least loaded", 4, 0, func(o []int) []int {
			l := make([]int, 4)
			l[o[0]], l[o[1]], l[o[2]], l[o[3]] = 3, 3, 1, 0 // total 7, bound 2.5
			return l
		}, -1, func(o []int) int { return o[2] }, router.ReasonOverload},
		{"the owner not a candidate: the next on the ring", 4, 0, func([]int) []int { return make([]int, 4) }, 0,
			func(o []int) int {
				if o[0] == 0 {
					return o[1]
				}
				return o[0]
			}, router.ReasonCold},
		{"old: none within the bound: the first on the walk, not the least loaded", 4, 0.5, func(o []int) []int {
			l := []int{1, 1, 1, 1}
			l[o[0]] = 3 // total 6, bound 0.5 × 7/4 = 0.875: every candidate over
			return l
		}, -1, func(o []int) int { return o[0] }, router.ReasonCold},
		{"no chunk: least loaded", 4, 0, func([]int) []int { return []int{2, 0, 2, 2} }, -1,
			func([]int) int { return 1 }, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, tc.n)
			order := ringOrder(bs, h, DefaultCHWBLPoints)
			p := NewCHWBL(CHWBLOptions{LoadFactor: tc.factor})
			p.SetBackends(bs)
			l := tc.loads(order)
			loads(t, bs, l...)
			var cs []*backend.Backend
			for i, b := range bs {
				if i != tc.omit {
					cs = append(cs, b)
				}
			}
			kk := k
			if tc.reason == router.ReasonLeastLoad {
				kk = &key.Key{Routed: true, OK: true, PromptTokens: 3}
			}
			d := p.Pick(kk, cs)
			want := bs[tc.want(order)]
			if d.Backend != want || d.Reason != tc.reason {
				t.Fatalf("picked %s (%v), want %s (%v); loads %v, walk order %v", d.Backend.Name, d.Reason, want.Name, tc.reason, l, order)
			}
		})
	}
}

// TestCHWBLRing: KubeAI's ring, 256 points per backend at xxhash(name + i), sorted; the key's
// owner is the backend of the first point at or after its hash, wrapping.
func TestCHWBLRing(t *testing.T) {
	bs := testBackends(t, 5)
	p := NewCHWBL(CHWBLOptions{})
	p.SetBackends(bs)
	r := p.ring.Load()
	if len(r.hash) != 5*256 || !slices.IsSorted(r.hash) {
		t.Fatalf("%d points (sorted %v), want 5 × 256 sorted", len(r.hash), slices.IsSorted(r.hash))
	}
	for i := range 200 {
		h := xxhash.Sum64String(fmt.Sprint("key ", i))
		if i == 0 {
			h = r.hash[len(r.hash)-1] + 1 // past the last point: wraps to the first
		}
		want := ringOrder(bs, h, 256)
		var got []int
		r.walk(h, func(id uint64) bool {
			for j, b := range bs {
				if b.ID == id {
					got = append(got, j)
				}
			}
			return true
		})
		if !slices.Equal(got, want) {
			t.Fatalf("hash %x: walk %v, want %v", h, got, want)
		}
	}
}

func TestCHWBLSameKeySameBackend(t *testing.T) {
	bs := testBackends(t, 4)
	p := NewCHWBL(CHWBLOptions{})
	p.SetBackends(bs)
	// Two turns of one conversation share their first chunk, so they hash alike.
	first, later := keyOf(chain("conv", 2)), keyOf(chain("conv", 9))
	if a, b := p.Pick(first, bs).Backend, p.Pick(later, bs).Backend; a != b {
		t.Fatalf("turns of one conversation went to %s and %s", a.Name, b.Name)
	}
	if DefaultCHWBLLoadFactor != 1.25 || DefaultCHWBLPoints != 256 || DefaultCHWBLPrefixChars != 100 {
		t.Fatalf("KubeAI's defaults are meanLoadPercentage 125, replication 256, prefixCharLength 100; got %v, %d, %d",
			DefaultCHWBLLoadFactor, DefaultCHWBLPoints, DefaultCHWBLPrefixChars)
	}
}

// TestCHWBLKeyIsTheFirstUserMessage: KubeAI's key is the model and the first 100 characters
// of the first user message, whatever comes before (system prompt, tools) or after it.
func TestCHWBLKeyIsTheFirstUserMessage(t *testing.T) {
	long := strings.Repeat("q", DefaultCHWBLPrefixChars)
	chat := func(model, system, user, rest string) *key.Key {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q},{"role":"assistant","content":%q}]}`,
			model, system, user, rest)
		k := &key.Key{}
		key.NewBuilder(0).Build([]byte("/v1/chat/completions"), []byte(body), k)
		return k
	}
	hash := func(k *key.Key) uint64 {
		h, ok := firstUserHash(k, DefaultCHWBLPrefixChars)
		if !ok {
			t.Fatal("no key")
		}
		return h
	}
	base := hash(chat("m", "shared system prompt", long+" first", "a"))
	for _, tc := range []struct {
		name string
		k    *key.Key
		same bool
	}{
		{"another system prompt and later turns", chat("m", "another system", long+" first", "b"), true},
		{"a difference after 100 characters", chat("m", "shared system prompt", long+" second", "a"), true},
		{"another user message", chat("m", "shared system prompt", "z"+long, "a"), false},
		{"another model", chat("n", "shared system prompt", long+" first", "a"), false},
		{"text parts", func() *key.Key {
			k := &key.Key{Model: []byte("m")}
			k.Body = []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"` + long[:50] + `"},{"type":"text","text":"` + long[50:] + ` first"}]}]}`)
			return k
		}(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := hash(tc.k) == base; got != tc.same {
				t.Fatalf("same key: %v, want %v", got, tc.same)
			}
		})
	}
	// Completions: the prompt's start; no text: the first 16 tokens, the last head chunk
	// (the first chunk alone is framing most prompts share); neither: no key.
	pk := &key.Key{Body: []byte(`{"prompt":"` + long + `"}`)}
	if h, ok := firstUserHash(pk, DefaultCHWBLPrefixChars); !ok || h == 0 {
		t.Fatal("completions prompt: no key")
	}
	if h, ok := firstUserHash(&key.Key{Chunks: []uint64{41, 42, 43}}, DefaultCHWBLPrefixChars); !ok || h != 42 {
		t.Fatalf("no body: key %d %v, want the last head chunk 42", h, ok)
	}
	if _, ok := firstUserHash(&key.Key{Chunks: []uint64{41}}, DefaultCHWBLPrefixChars); ok {
		t.Fatal("no body and the first chunk alone: a key")
	}
	if _, ok := firstUserHash(&key.Key{}, DefaultCHWBLPrefixChars); ok {
		t.Fatal("no body and no chunk: a key")
	}
}
