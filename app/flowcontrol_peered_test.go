package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
)

// limitedEngine is an httptest backend that runs at most limit requests at once, queueing
// the rest as an engine's scheduler does, and finishes each after work.
type limitedEngine struct {
	srv   *httptest.Server
	slots chan struct{}
	work  time.Duration

	mu                            sync.Mutex
	waiting, maxWaiting, finished int
}

func newLimitedEngine(t *testing.T, limit int, work time.Duration) *limitedEngine {
	e := &limitedEngine{slots: make(chan struct{}, limit), work: work}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		e.mu.Lock()
		e.waiting++
		e.mu.Unlock()
		select {
		case e.slots <- struct{}{}:
		case <-r.Context().Done():
			e.mu.Lock()
			e.waiting--
			e.mu.Unlock()
			return
		}
		e.mu.Lock()
		// What waited beside this one while it waited for a slot: the engine's queue.
		e.maxWaiting = max(e.maxWaiting, e.waiting-1)
		e.waiting--
		e.mu.Unlock()
		time.Sleep(e.work)
		<-e.slots
		e.mu.Lock()
		e.finished++
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":30,"completion_tokens":2}}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// TestFlowControlPeeredOverload: three peered prefixlb replicas with flow control on, in
// front of two engines that run two requests each, take six times that at once: every
// request completes or gets an explicit refusal (429/503 with Retry-After), and the
// engines' own queues stay within the peers' race window (docs/flow-control.md: at most one
// request per other peer per freed slot), far below what was sent.
func TestFlowControlPeeredOverload(t *testing.T) {
	const limit, peers, perPeer = 2, 3, 8
	engines := []*limitedEngine{newLimitedEngine(t, limit, 30*time.Millisecond), newLimitedEngine(t, limit, 30*time.Millisecond)}
	t.Setenv("PREFIXLB_TEST_FC_SECRET", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	var routers []*proxy.Serving
	var nodes []interface{ Alive() int }
	join := []string(nil)
	for i := range peers {
		cfg := &configs.Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Mode: "prefix",
			Health:  configs.Health{Disabled: true, ScrapeDisabled: true},
			Peering: &configs.Peering{Listen: "127.0.0.1:0", Join: join, SecretEnv: "PREFIXLB_TEST_FC_SECRET"}}
		for _, e := range engines {
			cfg.Backends = append(cfg.Backends, configs.Backend{URL: e.srv.URL})
		}
		sv, node, err := StartPeeredTuned(context.Background(), cfg, zap.NewNop(), Tuning{Proxy: func(o *proxy.Options) {
			o.FlowControl = proxy.FlowControl{Enabled: true, MaxQueueWait: 20 * time.Second}
			for _, b := range o.Backends {
				b.SetMaxConcurrency(limit)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
			defer cancel()
			_ = sv.Stop(ctx)
			_ = node.Close()
		})
		if i == 0 {
			join = []string{node.Addr()}
		}
		routers = append(routers, sv)
		nodes = append(nodes, node)
	}
	for i, n := range nodes {
		testutil.Eventually(t, testutil.Timeout, fmt.Sprintf("router %d sees its peers", i), func() bool { return n.Alive() == peers-1 })
	}

	type result struct {
		status     int
		retryAfter string
		err        error
	}
	results := make(chan result, peers*perPeer)
	var wg sync.WaitGroup
	for i := range peers * perPeer {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"tenant %d asks question %d in full"}]}`, i%5, i)
			resp, err := testutil.Client().Post(routers[i%peers].URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				results <- result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			results <- result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
		}()
	}
	wg.Wait()
	close(results)
	ok, refused := 0, 0
	for r := range results {
		switch {
		case r.err != nil:
			t.Errorf("a request failed without an answer: %v", r.err)
		case r.status == http.StatusOK:
			ok++
		case (r.status == http.StatusTooManyRequests || r.status == http.StatusServiceUnavailable) && r.retryAfter != "":
			refused++
		default:
			t.Errorf("a request got %d (Retry-After %q): neither served nor explicitly refused", r.status, r.retryAfter)
		}
	}
	if ok+refused != peers*perPeer || ok == 0 {
		t.Errorf("%d served, %d refused of %d", ok, refused, peers*perPeer)
	}
	for i, e := range engines {
		e.mu.Lock()
		mw := e.maxWaiting
		e.mu.Unlock()
		t.Logf("engine %d: at most %d waiting in its own queue", i, mw)
		if bound := limit * (peers - 1); mw > bound {
			t.Errorf("engine %d queued %d requests itself, more than the peers' race window allows (%d)", i, mw, bound)
		}
	}
}
