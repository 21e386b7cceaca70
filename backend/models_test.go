package backend

import (
	"fmt"
	"slices"
	"testing"
)

func modelIDs(s *ModelSet) []string {
	var ids []string
	for _, m := range s.Models() {
		ids = append(ids, m.ID)
	}
	return ids
}

func TestModelSet(t *testing.T) {
	cases := []struct {
		name  string
		in    []Model
		ids   []string
		has   []string
		hasnt []string
	}{
		{"sorted, duplicates and empty ids dropped", []Model{{ID: "b"}, {ID: ""}, {ID: "a"}, {ID: "b", Parent: "x"}}, []string{"a", "b"}, []string{"a", "b"}, []string{"", "c", "ab"}},
		{"adapter beside its base", []Model{{ID: "llama"}, {ID: "llama-sql", Parent: "llama"}}, []string{"llama", "llama-sql"}, []string{"llama-sql"}, []string{"sql"}},
		{"empty", nil, nil, nil, []string{"a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewModelSet(c.in, false)
			if !slices.Equal(modelIDs(s), c.ids) {
				t.Errorf("ids %v, want %v", modelIDs(s), c.ids)
			}
			for _, h := range c.has {
				if !s.Has([]byte(h)) {
					t.Errorf("Has(%q) false", h)
				}
			}
			for _, h := range c.hasnt {
				if s.Has([]byte(h)) {
					t.Errorf("Has(%q) true", h)
				}
			}
		})
	}
	if s := NewModelSet([]Model{{ID: "b"}, {ID: "b", Parent: "x"}}, false); s.Models()[0].Parent != "" {
		t.Errorf("duplicate ids: the first should win, got %+v", s.Models())
	}
}

// Unknown until set; discovery changes the set (reporting changes only); a configured set
// wins over discovery until cleared.
func TestBackendModels(t *testing.T) {
	b, err := New("http://127.0.0.1:1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Models() != nil || b.ModelsConfigured() {
		t.Fatal("a new backend's models are known")
	}
	ab := NewModelSet([]Model{{ID: "a"}, {ID: "b"}}, false)
	if !b.SetDiscoveredModels(ab) || b.SetDiscoveredModels(NewModelSet([]Model{{ID: "b"}, {ID: "a"}}, false)) {
		t.Error("SetDiscoveredModels: want changed once, then unchanged for the same set")
	}
	b.SetConfiguredModels([]string{"c"})
	if b.SetDiscoveredModels(ab) || !slices.Equal(modelIDs(b.Models()), []string{"c"}) || !b.ModelsConfigured() {
		t.Errorf("discovery overrode the configured set: %v", modelIDs(b.Models()))
	}
	b.SetConfiguredModels(nil)
	if b.Models() != nil || !b.SetDiscoveredModels(ab) {
		t.Error("clearing the configured set does not let discovery fill it again")
	}
}

// Has is what the request path calls per request: it must not allocate.
func TestModelSetHasDoesNotAllocate(t *testing.T) {
	s := NewModelSet([]Model{{ID: "alpha"}, {ID: "beta"}, {ID: "gamma"}}, false)
	name := []byte("beta")
	if n := testing.AllocsPerRun(100, func() { _ = s.Has(name) }); n != 0 {
		t.Errorf("Has allocates %v times", n)
	}
}

// A replica listing more than MaxModels ids keeps the first MaxModels (in ID order) and
// counts the rest (duplicates not counted twice).
func TestModelSetBounded(t *testing.T) {
	const extra = 10
	var in []Model
	for i := MaxModels + extra - 1; i >= 0; i-- {
		id := fmt.Sprintf("m%06d", i)
		in = append(in, Model{ID: id}, Model{ID: id})
	}
	s := NewModelSet(in, false)
	if got := len(s.Models()); got != MaxModels {
		t.Fatalf("kept %d models, want MaxModels=%d", got, MaxModels)
	}
	if s.Dropped != extra {
		t.Errorf("Dropped=%d, want %d", s.Dropped, extra)
	}
	if first, last := s.Models()[0].ID, s.Models()[MaxModels-1].ID; first != "m000000" || last != fmt.Sprintf("m%06d", MaxModels-1) {
		t.Errorf("kept %s..%s, want the first MaxModels ids in order", first, last)
	}
	if cap(s.Models()) != MaxModels {
		t.Errorf("the set holds on to %d entries, want %d", cap(s.Models()), MaxModels)
	}
	if s := NewModelSet(in[:4], false); s.Dropped != 0 || len(s.Models()) != 2 {
		t.Errorf("small set: %d models, Dropped %d", len(s.Models()), s.Dropped)
	}
}
