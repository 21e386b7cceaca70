package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
)

// Backends are added and removed by rewriting the config file under load, without a failed
// request; a bad new config is rejected and the old one keeps serving.
func TestConfigReloadUnderLoad(t *testing.T) {
	var hits [3]atomic.Int32
	var urls [3]string
	for i := range urls {
		i := i
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			_, _ = io.WriteString(w, "ok")
		}))
		defer ts.Close()
		urls[i] = ts.URL
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "prefixlb.yaml")
	write := func(body string) {
		if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	conf := func(bs ...string) string {
		s := "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmode: round-robin\nhealth:\n  disabled: true\n  scrape_disabled: true\nbackends:\n"
		for _, b := range bs {
			s += "  - url: " + b + "\n"
		}
		return s
	}
	write(conf(urls[0], urls[1]))
	load := func() (*configs.Config, error) { return configs.Load(path) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan *Server, 1)
	addr := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, zap.NewNop(), RunOptions{Load: load, Path: path, PollInterval: 20 * time.Millisecond,
			OnReady: func(s *Server, d, _ net.Addr) { ready <- s; addr <- d }})
	}()
	s := <-ready
	base := "http://" + (<-addr).String()

	stop := make(chan struct{})
	failed := make(chan string, 100)
	var sent atomic.Int32
	go func() {
		for {
			select {
			case <-stop:
				close(failed)
				return
			default:
			}
			sent.Add(1)
			resp, err := http.Get(base + "/v1/models")
			if err != nil {
				failed <- err.Error()
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed <- fmt.Sprint("status ", resp.StatusCode)
			}
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	names := func() (out []string) {
		for _, b := range s.Backends() {
			out = append(out, b.Name)
		}
		return out
	}
	first := s.Backends()[0]
	write(conf(urls[0], urls[1], urls[2]))
	waitFor("a third backend", func() bool { return len(s.Backends()) == 3 })
	if s.Backends()[0] != first {
		t.Error("an unchanged backend was replaced: its state (in-flight, index) would be lost")
	}
	waitFor("traffic on the new backend", func() bool { return hits[2].Load() > 0 })
	write("backends:\n  - url: nope\n")
	time.Sleep(100 * time.Millisecond)
	if n := len(s.Backends()); n != 3 {
		t.Errorf("a bad config changed the backends: %v", names())
	}
	write(conf(urls[2]))
	waitFor("removal of two backends", func() bool { return len(s.Backends()) == 1 })
	time.Sleep(50 * time.Millisecond) // a request picked just before the removal drains there
	before := hits[0].Load() + hits[1].Load()
	time.Sleep(100 * time.Millisecond)
	if after := hits[0].Load() + hits[1].Load(); after != before {
		t.Errorf("removed backends still got %d requests", after-before)
	}
	close(stop)
	for f := range failed {
		t.Errorf("request failed during reload: %s", f)
	}
	t.Logf("%d requests across three reloads", sent.Load())
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

type staticResolver struct{ hosts atomic.Pointer[[]string] }

func (r *staticResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	return *r.hosts.Load(), nil
}

func (r *staticResolver) LookupSRV(ctx context.Context, _, _, name string) (string, []*net.SRV, error) {
	return "", nil, fmt.Errorf("no SRV for %s", name)
}

// DNS discovery adds the pods a headless Service resolves to, and follows changes.
func TestDNSDiscoveryFeedsBackends(t *testing.T) {
	var hits atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer ts.Close()
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	cfg, err := configs.Parse([]byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmode: least-load\n" +
		"health:\n  disabled: true\n  scrape_disabled: true\n" +
		"discovery:\n  dns:\n    name: vllm.test.svc\n    port: " + port + "\n    interval: 100ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := &staticResolver{}
	r.hosts.Store(&[]string{"127.0.0.1"})
	ready := make(chan *Server, 1)
	addr := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = Run(ctx, cfg, zap.NewNop(), RunOptions{Resolver: r, OnReady: func(s *Server, d, _ net.Addr) { ready <- s; addr <- d }})
	}()
	s := <-ready
	base := "http://" + (<-addr).String()
	deadline := time.Now().Add(5 * time.Second)
	for len(s.Backends()) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.Backends(); len(got) != 1 || got[0].Name != "http://127.0.0.1:"+port {
		t.Fatalf("backends after discovery: %v", got)
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || hits.Load() != 1 {
		t.Errorf("request through a discovered backend: %d, hits %d", resp.StatusCode, hits.Load())
	}
	r.hosts.Store(&[]string{"127.0.0.1", "127.0.0.2"})
	for len(s.Backends()) != 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(s.Backends()) != 2 {
		t.Errorf("a new pod was not added: %d backends", len(s.Backends()))
	}
}
