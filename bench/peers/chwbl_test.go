package peers

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// ringOrder returns the backends in the order the bounded-load walk from h meets them.
func ringOrder(bs []*backend.Backend, h uint64) []int {
	ms := make([]hashring.Member, len(bs))
	for i, b := range bs {
		ms[i] = hashring.Member{Name: b.Name, Weight: b.Weight()}
	}
	r := hashring.New(ms)
	var order []int
	for len(order) < len(bs) {
		m := r.Lookup(h, func(m int) bool {
			for _, o := range order {
				if o == m {
					return false
				}
			}
			return true
		})
		order = append(order, m)
	}
	return order
}

func TestCHWBLRules(t *testing.T) {
	k := keyOf(chain("conv", 4))
	const n = 4
	order := ringOrder(testBackends(t, n), k.Chunks[key.HeadChunks-1])
	owner, second := order[0], order[1]
	tests := []struct {
		name   string
		key    *key.Key
		loads  func() []int // per backend
		omit   int          // a backend left out of the candidates (-1: none)
		want   int          // backend index (-1: any least loaded)
		reason router.Reason
	}{
		{"idle: the key's owner on the ring", k, func() []int { return make([]int, n) }, -1, owner, router.ReasonCold},
		{"owner within 1.25 × mean keeps it", k, func() []int {
			return []int{4, 4, 4, 4} // total 16, bound 1.25 × 17 / 4 = 5.3125 ≥ 4 + 1
		}, -1, owner, router.ReasonCold},
		{"every candidate over the bound: least loaded", k, func() []int {
			return []int{1, 1, 1, 1} // total 4, bound 1.25 × 5 / 4 = 1.5625 < 1 + 1
		}, -1, -1, router.ReasonLeastLoad},
		{"owner over the bound: the next on the ring", k, func() []int {
			l := make([]int, n)
			l[owner] = 3 // total 3, bound 1.25 × 4 / 4 = 1.25; owner 3+1 > bound, others 0+1 ≤ bound
			return l
		}, -1, second, router.ReasonOverload},
		{"owner not a candidate: the next on the ring", k, func() []int { return make([]int, n) }, owner, second, router.ReasonOverload},
		{"no chunk: least loaded", &key.Key{Routed: true, OK: true, PromptTokens: 3}, func() []int {
			return []int{2, 0, 2, 2}
		}, -1, 1, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, n)
			p := NewCHWBL(CHWBLOptions{})
			p.SetBackends(bs)
			l := tc.loads()
			loads(t, bs, l...)
			var cs []*backend.Backend
			for i, b := range bs {
				if i != tc.omit {
					cs = append(cs, b)
				}
			}
			d := p.Pick(tc.key, cs)
			if d.Reason != tc.reason {
				t.Fatalf("reason %v, want %v", d.Reason, tc.reason)
			}
			if tc.want >= 0 && d.Backend != bs[tc.want] {
				t.Fatalf("picked %s, want %s (loads %v)", d.Backend.Name, bs[tc.want].Name, l)
			}
			if tc.want < 0 {
				for i, b := range bs {
					if b.InFlight() < d.Backend.InFlight() && i != tc.omit {
						t.Fatalf("picked %s at %d in flight, %s has %d", d.Backend.Name, d.Backend.InFlight(), b.Name, b.InFlight())
					}
				}
			}
		})
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
	if DefaultCHWBLLoadFactor != 1.25 {
		t.Fatalf("KubeAI's meanLoadPercentage is 125, got %v", DefaultCHWBLLoadFactor)
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
