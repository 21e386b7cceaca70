package health

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

func TestParseModels(t *testing.T) {
	cases := []struct {
		name, body string
		want       []backend.Model
		err        string
	}{
		{"vLLM with a LoRA adapter",
			`{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":131072},` +
				`{"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B-Instruct"}]}`,
			[]backend.Model{{ID: "meta-llama/Llama-3.1-8B-Instruct"}, {ID: "sql-lora", Parent: "meta-llama/Llama-3.1-8B-Instruct"}}, ""},
		{"SGLang (no parent field)", `{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"sglang"}]}`, []backend.Model{{ID: "qwen"}}, ""},
		{"no ids", `{"object":"list","data":[]}`, nil, "no ids"},
		{"an over-long id and parent dropped", `{"data":[{"id":"a"},{"id":"` + strings.Repeat("x", maxModelIDBytes+1) + `"},` +
			`{"id":"a-lora","parent":"` + strings.Repeat("x", maxModelIDBytes+1) + `"}]}`, []backend.Model{{ID: "a"}}, ""},
		{"only over-long ids", `{"data":[{"id":"` + strings.Repeat("x", maxModelIDBytes+1) + `"}]}`, nil, "no ids of at most 256 bytes (1 longer)"},
		{"not JSON", `<html>404</html>`, nil, "not JSON"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _, err := parseModels(strings.NewReader(c.body))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := s.Models()
			if len(got) != len(c.want) {
				t.Fatalf("models %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("model %d = %+v, want %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}

// The Checker reads a backend's /v1/models at start and again when kicked (a return to
// healthy, a restart), keeps what it knew when the list fails, calls the OnModels hook on a
// change only, and never reads a backend whose models the config fixes.
func TestModelDiscovery(t *testing.T) {
	var list atomic.Pointer[string]
	var reads atomic.Int32
	set := func(s string) { list.Store(&s) }
	set(`{"data":[{"id":"a"}]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != DefaultModelsPath {
			w.WriteHeader(http.StatusOK)
			return
		}
		reads.Add(1)
		if s := *list.Load(); s == "" {
			w.WriteHeader(http.StatusNotFound)
		} else {
			_, _ = w.Write([]byte(s))
		}
	}))
	defer srv.Close()
	b, _ := backend.New(srv.URL, 0, 1)
	fixed, _ := backend.New("http://"+testutil.FreeAddr(t), 0, 1)
	fixed.SetConfiguredModels([]string{"z"})
	c := New(Options{Disabled: true, ModelsInterval: time.Hour}, nil, nil)
	defer c.Close()
	var hooks atomic.Int32
	c.OnModels(func(*backend.Backend) { hooks.Add(1) })
	c.SetBackends([]*backend.Backend{b, fixed})
	c.Start()
	testutil.Eventually(t, testutil.Timeout, "models read at start", func() bool { return b.Models() != nil })
	if !b.Models().Has([]byte("a")) || hooks.Load() != 1 {
		t.Fatalf("after the first read: %+v, hooks %d", b.Models().Models(), hooks.Load())
	}
	st := c.lookup(b)
	kick := func(want int32) {
		t.Helper()
		st.kickModels()
		testutil.Eventually(t, testutil.Timeout, "a kicked read", func() bool { return reads.Load() >= want })
	}
	set("") // the list fails: what was known stays
	kick(2)
	set(`{"data":[{"id":"a"}]}`) // the same list again: no hook
	kick(3)
	set(`{"data":[{"id":"b"},{"id":"b-lora","parent":"b"}]}`)
	kick(4)
	testutil.Eventually(t, testutil.Timeout, "the new list stored", func() bool { return b.Models().Has([]byte("b-lora")) })
	if b.Models().Has([]byte("a")) || hooks.Load() != 2 {
		t.Errorf("after the change: %+v, hooks %d (want 2)", b.Models().Models(), hooks.Load())
	}
	if m := fixed.Models().Models(); len(m) != 1 || m[0].ID != "z" {
		t.Errorf("the configured set changed: %+v", m)
	}
}

// A backend listing far more than backend.MaxModels ids, new ones on every read, is kept to
// MaxModels per read and warned about once, not once per read.
func TestModelDiscoveryBounded(t *testing.T) {
	var reads atomic.Int32
	const listed = 3 * backend.MaxModels
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != DefaultModelsPath {
			return
		}
		n := reads.Add(1)
		var sb strings.Builder
		sb.WriteString(`{"data":[`)
		for i := range listed {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"id":"read%d-model%d"}`, n, i)
		}
		sb.WriteString(`]}`)
		_, _ = w.Write([]byte(sb.String()))
	}))
	defer srv.Close()
	b, _ := backend.New(srv.URL, 0, 1)
	c, _, logs := newTestChecker(t, Options{Disabled: true, ModelsInterval: time.Hour})
	c.SetBackends([]*backend.Backend{b})
	c.Start()
	testutil.Eventually(t, testutil.Timeout, "models read at start", func() bool { return b.Models() != nil })
	st := c.lookup(b)
	st.kickModels()
	testutil.Eventually(t, testutil.Timeout, "the second list stored", func() bool {
		return b.Models().Has([]byte("read2-model0"))
	})
	if got := len(b.Models().Models()); got != backend.MaxModels {
		t.Errorf("kept %d models, want backend.MaxModels=%d", got, backend.MaxModels)
	}
	warn := logs.WithMessage("backend lists too many models; keeping the first (by id), dropping the rest")
	if len(warn) != 1 {
		t.Fatalf("%d warnings over 2 reads, want 1", len(warn))
	}
	if d := warn[0].Fields["dropped"]; d != int64(listed-backend.MaxModels) {
		t.Errorf("dropped=%v, want %d", d, listed-backend.MaxModels)
	}
	for _, e := range logs.WithMessage("backend models") {
		if ids, _ := e.Fields["models"].([]any); len(ids) > maxModelsLogged {
			t.Errorf("the log line names %d ids, want at most %d", len(ids), maxModelsLogged)
		}
	}
}

// A model id (or an adapter's parent) over maxModelIDBytes is dropped, not stored: one 3 MB id
// would make /metrics, the 404 for an unknown model and GET /v1/models megabytes each. The
// warning comes at most once per longIDWarnEvery, however often the list is read.
func TestModelIDLengthBounded(t *testing.T) {
	long, longParent := strings.Repeat("x", 3<<20), strings.Repeat("p", 512<<10) // within maxModelsBytes
	var reads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != DefaultModelsPath {
			return
		}
		n := reads.Add(1)
		fmt.Fprintf(w, `{"data":[{"id":"m%d"},{"id":%q},{"id":"lora%d","parent":%q},{"id":%q}]}`,
			n, long, n, longParent, strings.Repeat("y", maxModelIDBytes))
	}))
	defer srv.Close()
	b, _ := backend.New(srv.URL, 0, 1)
	// A read of this 3.5 MB list takes about a second under -race on a loaded machine: past
	// the default 2 s timeout it would fail, and the next read is an hour away. Each read gets
	// longLimit, and the test waits as long for it, or fails at once on a failed read.
	const longLimit = 2 * time.Minute
	c, clk, logs := newTestChecker(t, Options{Disabled: true, ModelsInterval: time.Hour, Timeout: longLimit})
	c.SetBackends([]*backend.Backend{b})
	c.Start()
	const warning = "backend lists model ids over the length limit; dropping them"
	read := func(n int) {
		t.Helper()
		if n > 1 {
			c.lookup(b).kickModels()
		}
		id := fmt.Sprintf("m%d", n)
		testutil.Eventually(t, longLimit, "read "+id, func() bool {
			if f := logs.WithMessage("model list unreadable; keeping what was known (unknown: serves any model)"); len(f) > 0 {
				t.Fatalf("read %d failed: %v", n, f[0].Fields["error"])
			}
			return b.Models() != nil && b.Models().Has([]byte(id))
		})
		ms := b.Models().Models()
		if len(ms) != 2 {
			t.Fatalf("read %d: %d models stored, want m%d and the id of exactly %d bytes", n, len(ms), n, maxModelIDBytes)
		}
		for _, m := range ms {
			if len(m.ID) > maxModelIDBytes || len(m.Parent) > maxModelIDBytes {
				t.Fatalf("read %d: a model of %d bytes (parent %d) stored", n, len(m.ID), len(m.Parent))
			}
		}
	}
	read(1)
	read(2)
	if w := logs.WithMessage(warning); len(w) != 1 || w[0].Fields["dropped"] != int64(2) {
		t.Fatalf("after 2 reads: %d warnings (%v), want 1 with dropped=2", len(w), w)
	}
	clk.Add(longIDWarnEvery)
	read(3)
	w := logs.WithMessage(warning)
	if len(w) != 2 || w[1].Fields["reads_not_logged"] != int64(1) {
		t.Fatalf("a period later: %d warnings, want 2, the second with reads_not_logged=1: %v", len(w), w)
	}
	for _, e := range logs.Entries() {
		for k, v := range e.Fields {
			if s, ok := v.(string); ok && len(s) > 1<<10 {
				t.Errorf("log %q carries %s of %d bytes", e.Message, k, len(s))
			}
		}
	}
}
