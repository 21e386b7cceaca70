package proxy

// Request-body budget (issue 11, defect 2): bodies over limits.max_buffered_body_bytes are
// refused at once with 503, accepted ones are forwarded whole, the budget returns to 0
// whatever happened, and the process's heap stays under the budget plus a constant.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
)

// bbPattern is the body bytes every upload sends, over and over: a client never holds a
// body, so the test process's memory is the proxy's.
var bbPattern = bytes.Repeat([]byte("0123456789abcdef"), 16<<10) // 256 KiB

// bbUpload is one raw upload of n body bytes: the head and the first `first` bytes, then,
// when full, the rest from a second goroutine while the response is read.
type bbUpload struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func bbSend(base string, n, first int, full bool, wait time.Duration) bbUpload {
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		return bbUpload{err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintf(c, "POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", n); err != nil {
		return bbUpload{err: err}
	}
	if _, err := c.Write(bbPattern[:first]); err != nil {
		return bbUpload{err: err}
	}
	if full {
		go func() {
			for left := n - first; left > 0; {
				k, err := c.Write(bbPattern[:min(left, len(bbPattern))])
				if err != nil {
					return // refused: the proxy stops reading
				}
				left -= k
			}
		}()
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return bbUpload{err: err}
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return bbUpload{status: resp.StatusCode, header: resp.Header, body: b}
}

// bbHoldBackend reads each request and its body (discarding it), counts it, and answers
// 200 only once release is closed.
type bbHoldBackend struct {
	ln      net.Listener
	arrived atomic.Int32
	bytes   atomic.Int64
	release chan struct{}
}

func newBBHoldBackend(t *testing.T) *bbHoldBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &bbHoldBackend{ln: ln, release: make(chan struct{})}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go b.serve(c)
		}
	}()
	return b
}

func (b *bbHoldBackend) URL() string { return "http://" + b.ln.Addr().String() }

func (b *bbHoldBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		n := -1
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			l = strings.TrimRight(l, "\r\n")
			if l == "" {
				break
			}
			if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "Content-Length") {
				n, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		got, err := io.CopyN(io.Discard, br, int64(max(n, 0)))
		if err != nil {
			return
		}
		b.bytes.Add(got)
		b.arrived.Add(1)
		select {
		case <-b.release:
		case <-time.After(time.Minute):
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(strconv.FormatInt(got, 10)), got)
	}
}

// bbHeap samples the bytes of live and not yet swept heap objects every 2 ms and keeps the
// peak, until stop.
type bbHeap struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// vmRSS is the process's resident set in bytes (/proc/self/status VmRSS), 0 if unknown.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func startBBHeap() *bbHeap {
	h := &bbHeap{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			if v := heapObjects(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *bbHeap) end() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

// Concurrent large bodies against a budget of three: the three accepted are forwarded
// whole and answered once the backend answers; every other one gets 503 naming the limit
// at once (after its first 16 KiB, before it sends the rest), and the heap stays under the
// budget plus a constant, though the refused bodies are sent in full too. Afterwards the
// budget is back to 0 and the large buffers are returned. Without a budget all nineteen
// bodies are buffered (152 MiB) and the refusals never come.
func TestBodyBudgetSoak(t *testing.T) {
	const (
		body     = 8 << 20
		accepted = 3
		budget   = accepted * body
		burst    = 16
		slack    = 32 << 20 // heap the rest of the test process may add meanwhile
	)
	be := newBBHoldBackend(t)
	s, base := rqStartProxy(t, []string{be.URL()}, nil, func(o *Options) {
		o.MaxRequestBodyBytes = 2 * body
		o.MaxBufferedBodyBytes = budget
		o.Timeouts.ClientRead = 60 * time.Second
	})
	runtime.GC() // a clean baseline; nothing below collects on the proxy's behalf
	heap0, rss0 := heapObjects(), vmRSS()
	heap := startBBHeap()

	// Phase 1: three uploads fill the budget; the backend holds them.
	var held sync.WaitGroup
	kept := make([]bbUpload, accepted)
	for i := range accepted {
		held.Go(func() { kept[i] = bbSend(base, body, 16<<10, true, 60*time.Second) })
	}
	eventually(t, 30*time.Second, "the backend holds the three accepted uploads", func() bool { return be.arrived.Load() == accepted })
	if u := s.bodies.used.Load(); u != budget {
		t.Errorf("budget in use %d with three uploads held, want %d", u, budget)
	}

	check503 := func(what string, u bbUpload) {
		t.Helper()
		if u.err != nil || u.status != 503 || !bytes.Contains(u.body, []byte("limits.max_buffered_body_bytes")) ||
			!bytes.Contains(u.body, []byte(`"code":"prefixlb_503"`)) || u.header.Get("Retry-After") == "" {
			t.Errorf("%s: %d %.120q %v (Retry-After %q), want 503 naming limits.max_buffered_body_bytes", what, u.status, u.body, u.err, u.header.Get("Retry-After"))
		}
	}
	// Phase 2: uploads that send their head and 16 KiB, then wait for the answer without
	// sending more: a refusal that needed the body would never come.
	// Phase 3: uploads that send their whole body while waiting for the answer.
	for phase, full := range []bool{false, true} {
		var wg sync.WaitGroup
		got := make([]bbUpload, burst)
		for i := range burst {
			wg.Go(func() { got[i] = bbSend(base, body, 16<<10, full, 20*time.Second) })
		}
		wg.Wait()
		for i := range burst {
			check503(fmt.Sprintf("phase %d upload %d", phase+2, i), got[i])
		}
	}
	peak := heap.end()
	t.Logf("heap: baseline %d MiB, peak +%d MiB (budget %d MiB); VmRSS %d MiB -> %d MiB",
		heap0>>20, (peak-heap0)>>20, budget>>20, rss0>>20, vmRSS()>>20)
	if peak > heap0+budget+slack {
		t.Errorf("heap peaked %d MiB above its baseline, over the budget (%d MiB) + %d MiB", (peak-heap0)>>20, budget>>20, slack>>20)
	}

	// Phase 4: the backend answers; the accepted uploads succeed, whole.
	close(be.release)
	held.Wait()
	for i, u := range kept {
		if u.err != nil || u.status != 200 || string(u.body) != strconv.Itoa(body) {
			t.Errorf("accepted upload %d: %d %q %v, want 200 with all %d bytes forwarded", i, u.status, u.body, u.err, body)
		}
	}
	eventually(t, 10*time.Second, "the body budget back to 0", func() bool { return s.bodies.used.Load() == 0 })
	// The large buffers are not pooled: the heap returns near its baseline without the
	// test collecting (the budget's trim does, a second after the burst).
	eventually(t, 15*time.Second, fmt.Sprintf("the heap back within 16 MiB of its baseline (%d MiB)", heap0>>20), func() bool {
		return heapObjects() < heap0+16<<20
	})
	// ... and given back to the OS (the race detector's shadow memory keeps some of it).
	if rss0 > 0 {
		eventually(t, 15*time.Second, fmt.Sprintf("VmRSS back within 20 MiB of its baseline (%d MiB)", rss0>>20), func() bool {
			return vmRSS() < rss0+20<<20
		})
	}
	t.Logf("after: heap %d MiB, VmRSS %d MiB", heapObjects()>>20, vmRSS()>>20)
}

// bbChunked sends body with Transfer-Encoding: chunked in 64 KiB chunks and reads the
// answer.
func bbChunked(t *testing.T, base string, n int) bbUpload {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() {
		bw := bufio.NewWriter(c)
		fmt.Fprintf(bw, "POST /v1/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		for left := n; left > 0; {
			k := min(left, 64<<10)
			fmt.Fprintf(bw, "%x\r\n", k)
			_, _ = bw.Write(bbPattern[:k])
			if _, err := bw.WriteString("\r\n"); err != nil {
				return
			}
			left -= k
		}
		_, _ = bw.WriteString("0\r\n\r\n")
		_ = bw.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return bbUpload{err: err}
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return bbUpload{status: resp.StatusCode, header: resp.Header, body: b}
}

// A chunked body has no declared length: its reservation grows as it is read. One that
// outgrows what is left of the budget gets 503, one over max_request_body_bytes 413, one
// that fits is forwarded whole; the budget is back to 0 after each.
func TestBodyBudgetChunked(t *testing.T) {
	be := newBBHoldBackend(t)
	s, base := rqStartProxy(t, []string{be.URL()}, nil, func(o *Options) {
		o.MaxRequestBodyBytes = 4 << 20
		o.MaxBufferedBodyBytes = 6 << 20
	})
	// A 4 MiB upload the backend holds leaves 2 MiB of the budget.
	held := make(chan bbUpload, 1)
	go func() { held <- bbSend(base, 4<<20, 16<<10, true, 30*time.Second) }()
	eventually(t, 10*time.Second, "the backend holds the 4 MiB upload", func() bool { return be.arrived.Load() == 1 })
	if u := bbChunked(t, base, 3<<20); u.err != nil || u.status != 503 || !bytes.Contains(u.body, []byte("limits.max_buffered_body_bytes")) {
		t.Errorf("3 MiB chunked beside a held 4 MiB: %d %.120q %v, want 503 naming limits.max_buffered_body_bytes", u.status, u.body, u.err)
	}
	close(be.release)
	if u := recvWithin(t, held, 30*time.Second, "the held upload's answer"); u.status != 200 || string(u.body) != strconv.Itoa(4<<20) {
		t.Errorf("held upload: %d %q %v", u.status, u.body, u.err)
	}
	for _, tc := range []struct {
		name   string
		n      int
		status int
		want   string
	}{
		{"fits", 3 << 20, 200, strconv.Itoa(3 << 20)},
		{"exactly max_request_body_bytes", 4 << 20, 200, strconv.Itoa(4 << 20)},
		{"over max_request_body_bytes", 4<<20 + 1, 413, "max_request_body_bytes"},
		{"empty", 0, 200, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := bbChunked(t, base, tc.n)
			if u.err != nil || u.status != tc.status || !bytes.Contains(u.body, []byte(tc.want)) {
				t.Errorf("%d chunked bytes: %d %.120q %v, want %d with %q", tc.n, u.status, u.body, u.err, tc.status, tc.want)
			}
			eventually(t, 10*time.Second, "the body budget back to 0", func() bool { return s.bodies.used.Load() == 0 })
		})
	}
}

// A client that stalls mid-body is answered 408 after timeouts.client_body_idle, long
// before client_read, and its reservation is given back; one that leaves mid-body gives
// it back too.
func TestBodyBudgetStalledOrGoneClient(t *testing.T) {
	be := newBBHoldBackend(t)
	close(be.release)
	s, base := rqStartProxy(t, []string{be.URL()}, nil, func(o *Options) {
		o.Timeouts.ClientRead = 60 * time.Second
		o.Timeouts.ClientBodyIdle = 300 * time.Millisecond
	})
	for _, leave := range []bool{false, true} {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 1<<20)
		_, _ = c.Write(bbPattern[:200<<10])
		eventually(t, 10*time.Second, "the upload's reservation taken", func() bool { return s.bodies.used.Load() == 1<<20 })
		if leave {
			_ = c.Close()
		} else {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("stalled upload: no answer (client_read is 60 s): %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 408 || !bytes.Contains(b, []byte("client_body_idle")) {
				t.Errorf("stalled upload: %d %s, want 408 naming timeouts.client_body_idle", resp.StatusCode, b)
			}
			_ = c.Close()
		}
		eventually(t, 10*time.Second, fmt.Sprintf("the reservation given back (client left: %v)", leave), func() bool { return s.bodies.used.Load() == 0 })
	}
	if n := be.arrived.Load(); n != 0 {
		t.Errorf("backend got %d partial uploads", n)
	}
}

// The budget's pieces on their own: reservations never exceed the limit, grow keeps the
// reservation equal to the buffer, the pool keeps at most bodyClassMax buffers per class
// and never a large one.
func TestBodyBudgetAccounting(t *testing.T) {
	b := newBodyBudget(100<<10, vm.NewSet())
	b.trim = func() {}
	var a, c bodyLease
	if !b.reserve(&a, 60<<10) || b.reserve(&c, 60<<10) || c.n != 0 {
		t.Fatalf("reserve: a %d c %d used %d", a.n, c.n, b.used.Load())
	}
	a.buf = b.get(16 << 10)
	b.release(&a)
	if b.used.Load() != 0 || a.n != 0 || a.buf != nil {
		t.Fatalf("after release: used %d, lease %+v", b.used.Load(), a)
	}
	// grow: 16 KiB -> 32 KiB -> ... capped at limit+1.
	if !b.reserve(&a, chunkedFirst) {
		t.Fatal("reserve 16 KiB")
	}
	a.buf = b.get(chunkedFirst)
	copy(a.buf, "abc")
	nb := b.grow(&a, a.buf, 3, chunkedFirst+1, 40<<10)
	if nb == nil || len(nb) != 32<<10 || a.n != 32<<10 || b.used.Load() != 32<<10 || string(nb[:3]) != "abc" {
		t.Fatalf("grow: len %d, lease %d, used %d", len(nb), a.n, b.used.Load())
	}
	a.buf = nb
	nb = b.grow(&a, a.buf, 3, len(a.buf)+1, 40<<10)
	if nb == nil || len(nb) != 40<<10+1 || a.n != 40<<10+1 {
		t.Fatalf("grow to the cap: len %d, lease %d", len(nb), a.n)
	}
	a.buf = nb
	b.release(&a)
	if b.used.Load() != 0 {
		t.Fatalf("used %d after release", b.used.Load())
	}
	// The pool is bounded.
	var bufs [][]byte
	for range bodyClassMax[0] + 10 {
		bufs = append(bufs, b.get(1))
	}
	for _, x := range bufs {
		b.put(x)
	}
	if n := len(b.classes[0].free); n != bodyClassMax[0] {
		t.Errorf("class 0 keeps %d buffers, want %d", n, bodyClassMax[0])
	}
	b.put(make([]byte, 2<<20))
	for i := range b.classes {
		for _, x := range b.classes[i].free {
			if cap(x) != bodyClasses[i] {
				t.Errorf("class %d holds a %d-byte buffer", i, cap(x))
			}
		}
	}
}

// A client that writes its whole body before reading (as most SDKs do) still gets the
// refusal: the connection closes lingering, reading and dropping the rest of the body,
// instead of resetting, which would destroy the answer in the client's receive buffer.
func TestRefusedUploadStillGetsTheAnswer(t *testing.T) {
	be := newBBHoldBackend(t)
	close(be.release)
	_, base := rqStartProxy(t, []string{be.URL()}, nil, func(o *Options) {
		o.MaxRequestBodyBytes = 1 << 20
	})
	const n = 16 << 20
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", n)
	for left := n; left > 0; {
		k, err := c.Write(bbPattern[:min(left, len(bbPattern))])
		if err != nil {
			t.Fatalf("writing the body after %d bytes: %v (the proxy reset the connection)", n-left, err)
		}
		left -= k
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || !bytes.Contains(b, []byte("max_request_body_bytes")) {
		t.Errorf("%d %s, want 413 naming max_request_body_bytes", resp.StatusCode, b)
	}
}
