package backend

import (
	"slices"
	"strings"
)

// Model is one model name a replica serves, as its /v1/models lists it: a base model, or a
// LoRA adapter that vLLM lists as an extra id whose Parent is the base model.
type Model struct {
	// ID is the name requests give in their "model" field.
	ID string
	// Parent is the base model of an adapter ("" for a base model).
	Parent string
}

// MaxModels bounds the models kept per replica: vLLM lists its base model and at most
// --max-loras adapters (a few hundred at most), so 1024 is far above any real list, and it
// bounds what a replica listing an endless /v1/models costs (pools, the GET /v1/models
// answer: per model a pool slice and a list entry).
const MaxModels = 1024

// ModelSet is the set of models one replica serves: immutable once built, sorted by ID,
// without duplicates, at most MaxModels.
type ModelSet struct {
	models []Model
	// Dropped is how many distinct ids beyond MaxModels were dropped (those after the first
	// MaxModels in ID order).
	Dropped int
	// Configured is true when the set comes from the config (backends[].models), which wins
	// over what the replica lists.
	Configured bool
}

// NewModelSet returns the set of ms, sorted by ID; the first of duplicate IDs wins, empty
// IDs are dropped, and only the first MaxModels IDs are kept (Dropped counts the others).
func NewModelSet(ms []Model, configured bool) *ModelSet {
	out := make([]Model, 0, len(ms))
	for _, m := range ms {
		if m.ID != "" {
			out = append(out, m)
		}
	}
	slices.SortStableFunc(out, func(a, b Model) int { return strings.Compare(a.ID, b.ID) })
	out = slices.CompactFunc(out, func(a, b Model) bool { return a.ID == b.ID })
	dropped := 0
	if len(out) > MaxModels {
		dropped = len(out) - MaxModels
		out = slices.Clone(out[:MaxModels]) // let the long list go
	}
	return &ModelSet{models: out, Configured: configured, Dropped: dropped}
}

// Models returns the set's models, sorted by ID. The slice must not be modified.
func (s *ModelSet) Models() []Model { return s.models }

// Has reports whether the set serves the model named name. It does not allocate.
func (s *ModelSet) Has(name []byte) bool {
	lo, hi := 0, len(s.models)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		switch c := compareID(s.models[mid].ID, name); {
		case c == 0:
			return true
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return false
}

// compareID is strings.Compare(id, string(name)) without converting name.
func compareID(id string, name []byte) int {
	n := min(len(id), len(name))
	for i := 0; i < n; i++ {
		if id[i] != name[i] {
			if id[i] < name[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(id) < len(name):
		return -1
	case len(id) > len(name):
		return 1
	}
	return 0
}

// Equal reports whether s and o list the same models with the same parents (nil is the
// unknown set, equal only to nil).
func (s *ModelSet) Equal(o *ModelSet) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Configured == o.Configured && slices.Equal(s.models, o.models)
}

// Models is the set of models the replica serves; nil while unknown (not yet read from its
// /v1/models, or the endpoint failed and nothing was configured), and a replica whose models
// are unknown is routed requests for any model, as before models were known.
func (b *Backend) Models() *ModelSet { return b.models.Load() }

// SetConfiguredModels fixes the replica's models to ids (backends[].models in the config):
// discovery no longer changes them. An empty ids clears the configured set (the models are
// unknown again until discovered).
func (b *Backend) SetConfiguredModels(ids []string) {
	if len(ids) == 0 {
		b.models.Store(nil)
		return
	}
	ms := make([]Model, len(ids))
	for i, id := range ids {
		ms[i] = Model{ID: id}
	}
	b.models.Store(NewModelSet(ms, true))
}

// SetDiscoveredModels stores the models the replica listed and reports whether its set
// changed. A configured set wins: it is kept, and false returned.
func (b *Backend) SetDiscoveredModels(s *ModelSet) bool {
	for {
		old := b.models.Load()
		if old != nil && old.Configured {
			return false
		}
		if old.Equal(s) {
			return false
		}
		if b.models.CompareAndSwap(old, s) {
			return true
		}
	}
}

// ModelsConfigured reports whether the replica's models come from the config.
func (b *Backend) ModelsConfigured() bool {
	s := b.models.Load()
	return s != nil && s.Configured
}
