package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// poolBackends returns backends with the given model sets (nil: unknown).
func poolBackends(t *testing.T, sets ...[]backend.Model) []*backend.Backend {
	t.Helper()
	var bs []*backend.Backend
	for i, ms := range sets {
		b, err := backend.New(fmt.Sprintf("http://127.0.0.1:%d", 10000+i), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ms != nil {
			b.SetDiscoveredModels(backend.NewModelSet(ms, false))
		}
		bs = append(bs, b)
	}
	return bs
}

func names(bs []*backend.Backend) string {
	var out []string
	for _, b := range bs {
		out = append(out, strings.TrimPrefix(b.Name, "http://127.0.0.1:"))
	}
	return strings.Join(out, ",")
}

func TestModelPoolsBuild(t *testing.T) {
	alpha, beta := backend.Model{ID: "alpha"}, backend.Model{ID: "beta"}
	lora := backend.Model{ID: "alpha-lora", Parent: "alpha"}
	cases := []struct {
		name      string
		sets      [][]backend.Model
		filtering bool
		served    []string
		pools     map[string]string // model → backends ("!" : not served)
	}{
		{"no model known: every backend, no filtering", [][]backend.Model{nil, nil}, false, nil,
			map[string]string{"alpha": "10000,10001", "": "10000,10001"}},
		{"pools by model, adapter on one", [][]backend.Model{{alpha}, {beta}, {alpha, lora}}, true, []string{"alpha", "alpha-lora", "beta"},
			map[string]string{"alpha": "10000,10002", "beta": "10001", "alpha-lora": "10002", "gamma": "!", "": "10000,10001,10002"}},
		{"an unknown backend serves any model", [][]backend.Model{{alpha}, nil}, true, []string{"alpha"},
			map[string]string{"alpha": "10000,10001", "gamma": "10001"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bs := poolBackends(t, c.sets...)
			s := &Server{pool: backend.NewPool(bs)}
			p := buildPools(bs, time.Unix(0, 0))
			s.pools.Store(p)
			if p.filtering != c.filtering || !slices.Equal(p.served, c.served) {
				t.Errorf("filtering %v served %v, want %v %v", p.filtering, p.served, c.filtering, c.served)
			}
			for m, want := range c.pools {
				got, ok := s.poolFor(&key.Key{Model: []byte(m)})
				if g := names(got); !ok && want != "!" || ok && g != want {
					t.Errorf("pool of %q = %q (ok %v), want %q", m, g, ok, want)
				}
			}
		})
	}
}

// The union list: sorted, deduplicated, adapters with their parent.
func TestModelListBody(t *testing.T) {
	bs := poolBackends(t, []backend.Model{{ID: "b"}}, []backend.Model{{ID: "b"}, {ID: "a-lora", Parent: "b"}})
	got := string(buildPools(bs, time.Unix(7, 0)).list)
	want := `{"object":"list","data":[{"id":"a-lora","object":"model","created":7,"owned_by":"prefixlb","root":"b","parent":"b"},` +
		`{"id":"b","object":"model","created":7,"owned_by":"prefixlb","root":"b","parent":null}]}` + "\n"
	if got != want {
		t.Errorf("list\n%s\nwant\n%s", got, want)
	}
}

// The request path's lookup allocates nothing.
func TestPoolForDoesNotAllocate(t *testing.T) {
	bs := poolBackends(t, []backend.Model{{ID: "alpha"}}, []backend.Model{{ID: "beta"}})
	s := &Server{pool: backend.NewPool(bs)}
	s.pools.Store(buildPools(bs, time.Now()))
	k := &key.Key{Model: []byte("beta")}
	dst := make([]*backend.Backend, 0, 4)
	if n := testing.AllocsPerRun(100, func() { dst = s.candidatesFor(dst[:0], k) }); n != 0 {
		t.Errorf("candidatesFor allocates %v times", n)
	}
	if names(dst) != "10001" {
		t.Errorf("candidates %s", names(dst))
	}
}
