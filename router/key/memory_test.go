package key

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// Keying memory: a body of any shape, to any API, is keyed within a small multiple of its
// size (Build's doc states the bound). These are the worst shapes for a parse tree or an
// index: many tiny values, tiny messages, tiny content blocks, escaped keys.

// worstBodySize is the size of the worst-shaped bodies: 12 MB.
const worstBodySize = 12_000_000

// repeatBody returns head, then item repeated (comma-separated) until the body reaches about
// size bytes, then tail.
func repeatBody(head, item, tail string, size int) []byte {
	n := max((size-len(head)-len(tail))/(len(item)+1), 1)
	var sb strings.Builder
	sb.Grow(len(head) + n*(len(item)+1) + len(tail))
	sb.WriteString(head)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(item)
	}
	sb.WriteString(tail)
	return []byte(sb.String())
}

// worstBody is one worst-shaped body: its path, and whether it keys (OK), or, for the
// model-only path, names model "m".
type worstBody struct {
	name, path string
	body       func(size int) []byte
	ok         bool
}

var worstBodies = []worstBody{
	{"chat fast path: tiny messages", pathChat, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[`, `{"role":"user","content":"a"}`, `]}`, n)
	}, true},
	{"chat fast path: empty messages", pathChat, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[`, `{}`, `]}`, n)
	}, true},
	{"chat: escaped key, tiny text parts", pathChat, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[{"role":"user","\u0063ontent":[`, `{"type":"text","text":"a"}`, `]}]}`, n)
	}, true},
	{"chat: one escaped content", pathChat, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[{"role":"user","content":"`, `\n\"`, `"}]}`, n)
	}, true},
	{"chat: tiny escaped keys and contents", pathChat, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[`, `{"\u0072ole":"\u0075","content":"\n"}`, `]}`, n)
	}, true},
	// Both: the fast path's arena for the escapes, then (NaN) fastjson's copy and its tree.
	{"chat: escaped content, then NaN", pathChat, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[{"role":"user","content":"`, `\n\"`, `"}],"temperature":NaN}`, n)
	}, true},
	{"completions: token ids", pathCompl, func(n int) []byte {
		return repeatBody(`{"model":"m","prompt":[`, `1`, `]}`, n)
	}, true},
	// Handed back to the fastjson path (NaN), whose tree would cost too much: parse-fallback.
	{"completions: NaN, tiny logit_bias", pathCompl, func(n int) []byte {
		return repeatBody(`{"model":"m","prompt":"p","temperature":NaN,"logit_bias":{`, `"1":0`, `}}`, n)
	}, false},
	// Handed back (NaN), with as many values as an affordable tree may have: parsed, and keyed.
	{"chat: NaN, the largest affordable tree", pathChat, nanTreeBody, true},
	{"responses: tiny input_text parts", pathResp, func(n int) []byte {
		return repeatBody(`{"model":"m","input":[{"role":"user","content":[`, `{"type":"input_text","text":"a"}`, `]}]}`, n)
	}, true},
	{"responses: tiny items", pathResp, func(n int) []byte {
		return repeatBody(`{"model":"m","input":[`, `{"role":"user"}`, `]}`, n)
	}, true},
	{"messages: tiny text blocks", pathMsgs, func(n int) []byte {
		return repeatBody(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[`, `{"type":"text","text":"a"}`, `]}]}`, n)
	}, true},
	{"messages: tiny escaped text blocks", pathMsgs, func(n int) []byte {
		return repeatBody(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[`, `{"type":"text","text":"\t"}`, `]}]}`, n)
	}, true},
	{"embeddings: token ids", pathEmbed, func(n int) []byte {
		return repeatBody(`{"model":"m","input":[`, `1`, `]}`, n)
	}, true},
	{"embeddings: messages, tiny text parts", pathEmbed, func(n int) []byte {
		return repeatBody(`{"model":"m","messages":[{"role":"user","content":[`, `{"type":"text","text":"a"}`, `]}]}`, n)
	}, true},
	{"rerank: tiny documents", pathRerank, func(n int) []byte {
		return repeatBody(`{"model":"m","query":"q","documents":[`, `""`, `]}`, n)
	}, false},
	{"tokenize: tiny values", "/tokenize", func(n int) []byte {
		return repeatBody(`{"model":"m","prompt":"x","extra":[`, `0`, `]}`, n)
	}, false},
}

// nanTreeBody is a chat body of about n bytes that the fast path hands back (NaN) and whose
// parse tree has close to maxTreeValues values: the most that the fastjson path parses.
func nanTreeBody(n int) []byte {
	values := maxTreeValues(n, 0) - 16
	head := `{"model":"m","temperature":NaN,"stop":[` + strings.TrimSuffix(strings.Repeat("0,", values), ",") + `],"messages":[{"role":"user","content":"`
	tail := `"}]}`
	return []byte(head + strings.Repeat("a", max(n-len(head)-len(tail), 0)) + tail)
}

// keyingAlloc builds body on path with a fresh Builder and returns the bytes allocated
// meanwhile (runtime.MemStats.TotalAlloc: an upper bound of the heap the build added at its
// peak) and the key.
func keyingAlloc(path string, body []byte) (uint64, Key) {
	b := NewBuilder(0)
	var k Key
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.Build([]byte(path), body, &k)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, k
}

// TestKeyingMemoryBound: every API keys a 12 MB worst-shaped body within MaxBuildAlloc (2.5
// times its size and 2 MiB), and still keys it (or, when its key would cost too much, reads
// its model by the fallback scan).
func TestKeyingMemoryBound(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("heap measurements need a non-race, non-short run (the race detector allocates shadow memory)")
	}
	for _, w := range worstBodies {
		t.Run(w.name, func(t *testing.T) {
			body := w.body(worstBodySize)
			alloc, k := keyingAlloc(w.path, body)
			if limit := uint64(MaxBuildAlloc(len(body))); alloc > limit {
				t.Errorf("%s: keying a %d-byte body allocated %d bytes (%.1f× the body), want ≤ %d", w.path, len(body), alloc, float64(alloc)/float64(len(body)), limit)
			}
			if k.OK != w.ok || string(k.Model) != "m" {
				t.Errorf("%s: OK %v model %q, want OK %v model \"m\"", w.path, k.OK, k.Model, w.ok)
			}
		})
	}
}

// TestKeyingMemoryReport prints what keying each worst-shaped body allocates, and the
// largest heap in use while it runs (sampled by a goroutine while the collector runs as
// usual): go test -run TestKeyingMemoryReport -v ./router/key/.
func TestKeyingMemoryReport(t *testing.T) {
	if !testing.Verbose() || raceEnabled {
		t.Skip("a report: run with -v, without -race")
	}
	fmt.Printf("%-70s %8s %9s %6s %8s %6s %5s\n", "body (path)", "body MB", "alloc MB", "×body", "peak MB", "×body", "OK")
	for _, w := range worstBodies {
		body := w.body(worstBodySize)
		alloc, k := keyingAlloc(w.path, body)
		peak := keyingPeak(w.path, body)
		fmt.Printf("%-70s %8.1f %9.1f %6.2f %8.1f %6.2f %5v\n", w.name+" ("+w.path+")", float64(len(body))/1e6,
			float64(alloc)/1e6, float64(alloc)/float64(len(body)), float64(peak)/1e6, float64(peak)/float64(len(body)), k.OK)
	}
}

// keyingPeak builds body on path and returns the largest growth of the heap in use
// (HeapInuse) over its value before the build, sampled every 100 µs or so meanwhile.
func keyingPeak(path string, body []byte) uint64 {
	b := NewBuilder(0)
	var k Key
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	done := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var top uint64
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			top = max(top, ms.HeapInuse)
			select {
			case <-done:
				peak <- top
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	b.Build([]byte(path), body, &k)
	close(done)
	top := <-peak
	if top < base {
		return 0
	}
	return top - base
}

// TestTreeAffordable: a body the fast path hands back is parsed by fastjson and keyed as
// before when its tree is affordable; one whose tree would cost more is keyed like a body
// that does not parse, its model and stream flag read by the lenient scan, and a model-only
// endpoint reads its model the same way.
func TestTreeAffordable(t *testing.T) {
	b := NewBuilder(1)
	small := `{"model":"m","temperature":NaN,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if k, _, ref := bothPaths(b, pathChat, []byte(small)); !ref.OK || !sameKey(build(b, pathChat, small), ref) || k.OK {
		t.Fatalf("a small body handed back: Build %+v, want the fastjson path's %+v", build(b, pathChat, small), ref)
	}
	n := 1 << 20
	dense := `{"model":"m\u0031","temperature":NaN,"stream":true,"stop":[` + strings.TrimSuffix(strings.Repeat("0,", maxTreeValues(n, 0)+1), ",") + `],"messages":[{"role":"user","content":"hi"}]}`
	if treeAffordable([]byte(dense)) || !treeAffordable([]byte(small)) || !treeAffordable(nanTreeBody(n)) {
		t.Fatalf("treeAffordable: dense %v, small %v, at the cap %v; want false, true, true",
			treeAffordable([]byte(dense)), treeAffordable([]byte(small)), treeAffordable(nanTreeBody(n)))
	}
	if _, _, ref := bothPaths(b, pathChat, []byte(dense)); !ref.OK {
		t.Fatal("the fastjson path does not key the dense body: the test shows nothing")
	}
	k := build(b, pathChat, dense)
	if !k.Routed || k.OK || len(k.Chunks) != 0 || string(k.Model) != "m1" || !k.Stream {
		t.Errorf("a body whose tree costs too much: %+v, want parse-fallback with model m1 and stream", k)
	}
	for _, path := range []string{pathRerank, "/tokenize"} {
		if k := build(b, path, dense); k.Routed || string(k.Model) != "m1" {
			t.Errorf("%s, a body whose tree costs too much: %+v, want model m1", path, k)
		}
		if k := build(b, path, `{"model":"m","x":NaN}`); string(k.Model) != "m" {
			t.Errorf("%s, a small body handed back: %+v, want model m", path, k)
		}
	}
	// jsonValues counts what fastjson allocates a Value for (or more), strings stepped over.
	for _, c := range []struct {
		body string
		want int
	}{{`{}`, 2}, {`{"a":[1,2,{"b":"x,y[{"}]}`, 6}, {`{"a\",":"\\",",1}`, 3}, {`{"a":"unterminated,,,`, 2}} {
		if got := jsonValues([]byte(c.body), 100); got != c.want {
			t.Errorf("jsonValues(%s) = %d, want %d", c.body, got, c.want)
		}
	}
}
