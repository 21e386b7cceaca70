package proxy

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

func TestFDBudgetShares(t *testing.T) {
	for _, c := range []struct {
		limit                        uint64
		total, clients, overflow, rs int64
	}{
		{limit: 256, total: 192, clients: 96, overflow: 16, rs: 64},
		{limit: 1024, total: 896, clients: 448, overflow: 32, rs: 128},
		{limit: 65536, total: 61440, clients: 30720, overflow: 256, rs: 4096},
		{limit: 100, total: 50, clients: 25, overflow: 16, rs: 50}, // the reserve never takes over half
	} {
		b := newFDBudget(c.limit)
		if b.max != c.total || b.maxClients != c.clients || b.maxOverflow != c.overflow || int64(c.limit)-b.max != c.rs {
			t.Errorf("limit %d: data path %d, clients %d, overflow %d, reserve %d; want %d, %d, %d, %d",
				c.limit, b.max, b.maxClients, b.maxOverflow, int64(c.limit)-b.max, c.total, c.clients, c.overflow, c.rs)
		}
	}
	if newFDBudget(0) != nil {
		t.Error("no limit known: want no budget")
	}
}

// Clients take half the budget, the overflow a few more to be refused, then Accept waits;
// backend connections take the rest, closing idle pooled ones when it runs out; every
// descriptor given back is usable again.
func TestFDBudgetAdmission(t *testing.T) {
	b := newFDBudget(256) // 192: 96 clients, overflow 16
	for i := range b.maxClients {
		if a := b.takeClient(); a != admitServe {
			t.Fatalf("client %d: %v, want served", i, a)
		}
	}
	for i := range b.maxOverflow {
		if a := b.takeClient(); a != admitOverflow {
			t.Fatalf("client %d over the share: %v, want overflow", i, a)
		}
	}
	if a := b.takeClient(); a != admitWait {
		t.Fatalf("client past the overflow: %v, want wait", a)
	}
	b.giveClient(admitOverflow)
	if a := b.takeClient(); a != admitOverflow {
		t.Fatalf("after an overflow connection closed: %v, want overflow", a)
	}
	for i := range b.max - b.maxClients {
		if !b.takeBackend() {
			t.Fatalf("backend connection %d refused with %d in use", i, b.used.Load())
		}
	}
	if b.takeBackend() {
		t.Fatal("backend connection past the budget taken")
	}
	reclaimed := 0
	b.reclaim = func() { reclaimed++; b.giveBackend() } // one idle pooled connection closed
	if !b.takeBackend() || reclaimed != 1 {
		t.Fatalf("with an idle connection to reclaim: refused (reclaimed %d)", reclaimed)
	}
	b.giveClient(admitServe)
	select {
	case <-b.freed:
	default:
		t.Error("a descriptor given back wakes no waiting Accept")
	}
	if b.used.Load() != b.max-1 || b.clients.Load() != b.maxClients-1 {
		t.Errorf("in use %d (clients %d), want %d (%d)", b.used.Load(), b.clients.Load(), b.max-1, b.maxClients-1)
	}
	var none *fdBudget
	if none.takeClient() != admitServe || !none.takeBackend() {
		t.Error("no budget must admit everything")
	}
	none.giveClient(admitServe)
	none.giveBackend()
}

func TestLocalKindOf(t *testing.T) {
	wrap := func(call string, e syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError(call, e)}
	}
	for _, c := range []struct {
		err   error
		kind  localKind
		local bool
	}{
		{wrap("socket", syscall.EMFILE), localEMFILE, true},
		{wrap("socket", syscall.ENFILE), localENFILE, true},
		{wrap("connect", syscall.EADDRNOTAVAIL), localEADDRNOTAVAIL, true},
		{wrap("connect", syscall.ENOBUFS), localENOBUFS, true},
		{fmt.Errorf("accept: %w", syscall.ENOMEM), localENOMEM, true},
		{wrap("connect", syscall.ECONNREFUSED), 0, false},
		{wrap("connect", syscall.ETIMEDOUT), 0, false},
		{wrap("connect", syscall.EHOSTUNREACH), 0, false},
		{errors.New("i/o timeout"), 0, false},
	} {
		kind, local := localKindOf(c.err)
		if local != c.local || (local && kind != c.kind) {
			t.Errorf("%v: %v %v, want %v %v", c.err, kind, local, c.kind, c.local)
		}
	}
	le := &localError{localEMFILE, wrap("socket", syscall.EMFILE)}
	if statusOf(le) != 503 || retryable(le) || !errors.Is(le, syscall.EMFILE) || errDetail(le) != "too many open files" {
		t.Errorf("local error: status %d, retryable %v, detail %q; want 503, not retried, the errno",
			statusOf(le), retryable(le), errDetail(le))
	}
}

// Every error is counted; one line per kind per localLogEvery says how many were left out.
func TestLocalResourcesRateLimited(t *testing.T) {
	log, rec := recordingLogger()
	now := time.Unix(1000, 0)
	l := newLocalResources(metrics.NewSet(), log, func() time.Time { return now })
	emfile := os.NewSyscallError("socket", syscall.EMFILE)
	for range 5 {
		l.report(localEMFILE, "dial", emfile)
		now = now.Add(time.Second)
	}
	l.report(localEADDRNOTAVAIL, "dial", os.NewSyscallError("connect", syscall.EADDRNOTAVAIL))
	now = now.Add(localLogEvery)
	l.report(localEMFILE, "accept", emfile)
	if n := l.counts[localEMFILE].Get(); n != 6 {
		t.Errorf("emfile counted %d, want 6", n)
	}
	lines := rec.WithMessage(logLocalResource)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (emfile, eaddrnotavail, emfile again): %+v", len(lines), lines)
	}
	last := lines[2].Fields
	if last["kind"] != "emfile" || last["where"] != "accept" || fmt.Sprint(last["suppressed"]) != "4" || last["error"] != "too many open files" {
		t.Errorf("the second emfile line %v, want kind emfile at accept with 4 suppressed", last)
	}
}

// A backend connection's and a client connection's descriptors go back to the budget once,
// however many times they are closed.
func TestConnectionsGiveDescriptorsBackOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b := newFDBudget(256)
	u := &upstream{timeout: time.Second, fds: b}
	u.b = testBackends(t, "http://"+ln.Addr().String())[0]
	c, err := u.dial()
	if err != nil {
		t.Fatal(err)
	}
	if b.used.Load() != 1 {
		t.Fatalf("in use %d after a dial, want 1", b.used.Load())
	}
	_ = c.Close()
	_ = c.Close()
	if b.used.Load() != 0 {
		t.Errorf("in use %d after closing twice, want 0", b.used.Load())
	}

	rl := &retryListener{Listener: ln, fds: b, where: "accept"}
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			_ = c.Close()
		}
	}()
	cc, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if b.clients.Load() != 1 || b.used.Load() != 1 {
		t.Fatalf("clients %d, in use %d after an accept; want 1, 1", b.clients.Load(), b.used.Load())
	}
	_ = cc.Close()
	_ = cc.Close()
	if b.clients.Load() != 0 || b.used.Load() != 0 {
		t.Errorf("clients %d, in use %d after closing twice; want 0, 0", b.clients.Load(), b.used.Load())
	}

	// Over the budget, a dial is refused as prefixlb's own condition, never tried.
	for b.take() {
	}
	if _, err := u.dial(); !errors.Is(err, errLocalResource) || statusOf(err) != 503 {
		t.Errorf("dial over the budget: %v, want a local resource error (503)", err)
	}
	// A closed listener ends an Accept that waits for a descriptor.
	for b.takeClient() != admitWait {
	}
	done := make(chan error, 1)
	go func() { _, err := rl.Accept(); done <- err }()
	_ = rl.Close()
	if err := recvWithin(t, done, testTimeout, "Accept to end"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
