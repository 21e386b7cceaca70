package discovery

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

type fakeResolver struct {
	mu    sync.Mutex
	hosts []string
	srv   []*net.SRV
	err   error
	calls int
}

func (f *fakeResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return slices.Clone(f.hosts), f.err
}

func (f *fakeResolver) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return name, f.srv, f.err
}

func (f *fakeResolver) set(hosts []string, err error) {
	f.mu.Lock()
	f.hosts, f.err = hosts, err
	f.mu.Unlock()
}

func TestResolve(t *testing.T) {
	cases := []struct {
		name    string
		d       DNS
		r       *fakeResolver
		want    []string
		wantErr bool
	}{
		{"A records sorted and deduplicated", DNS{Name: "vllm", Port: 8000},
			&fakeResolver{hosts: []string{"10.0.0.2", "10.0.0.1", "10.0.0.2"}},
			[]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, false},
		{"IPv6", DNS{Name: "vllm", Port: 8000, Scheme: "https"},
			&fakeResolver{hosts: []string{"fd00::1"}}, []string{"https://[fd00::1]:8000"}, false},
		{"SRV carries ports", DNS{Name: "_http._tcp.vllm", SRV: true},
			&fakeResolver{srv: []*net.SRV{{Target: "vllm-1.vllm.", Port: 8001}, {Target: "vllm-0.vllm.", Port: 8000}}},
			[]string{"http://vllm-0.vllm:8000", "http://vllm-1.vllm:8001"}, false},
		{"empty answer is an error", DNS{Name: "vllm", Port: 8000}, &fakeResolver{}, nil, true},
		{"lookup error", DNS{Name: "vllm", Port: 8000}, &fakeResolver{err: errors.New("no such host")}, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.d.Resolver = c.r
			got, err := c.d.Resolve(context.Background())
			if (err != nil) != c.wantErr || !slices.Equal(got, c.want) {
				t.Errorf("Resolve = %v, %v; want %v (error %v)", got, err, c.want, c.wantErr)
			}
		})
	}
}

// Run delivers a new list only when it changes and keeps the last good list on errors.
func TestRunFollowsChanges(t *testing.T) {
	r := &fakeResolver{hosts: []string{"10.0.0.1"}}
	d := DNS{Name: "vllm", Port: 8000, Interval: 5 * time.Millisecond, Resolver: r}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan []string, 16)
	errs := make(chan error, 64)
	done := make(chan struct{})
	go func() {
		d.Run(ctx, func(u []string) { got <- u }, func(e error) {
			select {
			case errs <- e:
			default:
			}
		})
		close(done)
	}()
	next := func() []string {
		select {
		case u := <-got:
			return u
		case <-time.After(5 * time.Second):
			t.Fatal("no update")
			return nil
		}
	}
	if u := next(); !slices.Equal(u, []string{"http://10.0.0.1:8000"}) {
		t.Fatalf("first list %v", u)
	}
	r.set(nil, errors.New("SERVFAIL"))
	select {
	case <-errs:
	case <-time.After(5 * time.Second):
		t.Fatal("error not reported")
	}
	r.set([]string{"10.0.0.1", "10.0.0.3"}, nil)
	if u := next(); !slices.Equal(u, []string{"http://10.0.0.1:8000", "http://10.0.0.3:8000"}) {
		t.Fatalf("second list %v", u)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	select {
	case u := <-got:
		t.Errorf("unchanged answers delivered again: %v", u)
	default:
	}
}
