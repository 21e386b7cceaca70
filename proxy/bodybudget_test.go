package proxy

// Request-body budget: bodies over limits.max_buffered_body_bytes are refused at once with
// 503, accepted ones are forwarded whole, the budget returns to 0 whatever happened, and the
// process's heap stays under the budget plus a constant.

import (
	"bufio"
	"bytes"
	"errors"
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

	"github.com/prefixlb/prefixlb/internal/testutil"
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
	b := &bbHoldBackend{release: make(chan struct{})}
	b.ln = testutil.ServeRaw(t, func(c net.Conn) { b.serve(c) })
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

// Rounds of concurrent large uploads, with Content-Length and chunked, against a budget
// they overfill: those whose buffers fit are forwarded whole, the others get 503 naming the
// limit, and the heap stays within the budget plus an eighth (the dropped buffers a
// collection waits for) plus a constant: every live buffer byte is reserved, the old buffer
// too while a growth copies, and dropped buffers are collected before they pile up (which
// GOGC=100 would let them do up to twice the live heap). Afterwards the budget is back to
// 0, and the heap and VmRSS return near their baselines.
func TestBodyBudgetSoak(t *testing.T) {
	const (
		body    = 6<<20 + 4099 // not a power of two
		budget  = 48 << 20
		clients = 10 // 60 MiB of bodies at once: over the budget
		rounds  = 6
		slack   = 12 << 20 // idle pooled buffers, connection buffers, the rest of the test process
	)
	be := newBBHoldBackend(t)
	close(be.release)
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.MaxRequestBodyBytes = body + 1<<20 // a chunked body's buffer grows towards this
		o.MaxBufferedBodyBytes = budget
		o.Timeouts.ClientRead = 60 * time.Second
	})
	bound := uint64(budget + budget/8 + slack)
	runtime.GC()
	heapStart, rss0 := heapObjects(), vmRSS()
	for _, chunked := range []bool{false, true} {
		kind := map[bool]string{false: "Content-Length", true: "chunked"}[chunked]
		runtime.GC() // a clean baseline; what collects below is the proxy's own
		heap0 := heapObjects()
		arrived0 := be.bytes.Load()
		heap := startBBHeap()
		var ok, refused atomic.Int32
		bad := make(chan string, clients*rounds)
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for range rounds {
					var u bbUpload
					if chunked {
						u = bbSendChunked(base, body, 30*time.Second)
					} else {
						u = bbSend(base, body, 16<<10, true, 30*time.Second)
					}
					switch {
					case u.err == nil && u.status == 200 && string(u.body) == strconv.Itoa(body):
						ok.Add(1)
					case u.err == nil && u.status == 503 && bytes.Contains(u.body, []byte("limits.max_buffered_body_bytes")) &&
						u.header.Get("Retry-After") != "":
						refused.Add(1)
					default:
						bad <- fmt.Sprintf("%d %.120q %v", u.status, u.body, u.err)
					}
				}
			})
		}
		wg.Wait()
		peak := heap.end()
		close(bad)
		for b := range bad {
			t.Errorf("%s upload: %s, want 200 with all %d bytes forwarded or 503 naming limits.max_buffered_body_bytes", kind, b, body)
		}
		gcs := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}, {Name: "/gc/cycles/total:gc-cycles"}}
		metrics.Read(gcs)
		t.Logf("%s: %d forwarded, %d refused; heap peak +%d MiB over %d MiB (budget %d MiB, bound %d MiB); VmRSS %d MiB; collections so far %d forced, %d in all",
			kind, ok.Load(), refused.Load(), (peak-heap0)>>20, heap0>>20, budget>>20, bound>>20, vmRSS()>>20, gcs[0].Value.Uint64(), gcs[1].Value.Uint64())
		// Refusals are immediate and a refused client sends its next upload at once, so how many
		// of the 60 find room is the scheduler's call (a clean clone's test run read 4 chunked,
		// 18 with Content-Length): the floor is that the budget admits bodies at all.
		if ok.Load() == 0 {
			t.Errorf("%s: none of %d uploads forwarded, want some (the budget holds three at once)", kind, clients*rounds)
		}
		if got, want := be.bytes.Load()-arrived0, int64(ok.Load())*body; got != want {
			t.Errorf("%s: the backend got %d body bytes, want %d (%d whole uploads)", kind, got, want, ok.Load())
		}
		if peak > heap0+bound {
			t.Errorf("%s: heap peaked %d MiB above its baseline, over the budget (%d MiB) + an eighth + %d MiB",
				kind, (peak-heap0)>>20, budget>>20, slack>>20)
		}
		eventually(t, 10*time.Second, "the body budget back to 0", func() bool { return s.bodies.used.Load() == 0 })
	}
	// The large buffers are not pooled: the heap returns near its baseline without the
	// test collecting (the budget's collector does, and trims a second after the burst).
	eventually(t, 15*time.Second, fmt.Sprintf("the heap back within 16 MiB of its baseline (%d MiB)", heapStart>>20), func() bool {
		return heapObjects() < heapStart+16<<20
	})
	// ... and given back to the OS (the race detector's shadow memory is not).
	if rss0 > 0 && !raceEnabled {
		eventually(t, 15*time.Second, fmt.Sprintf("VmRSS back within 20 MiB of its baseline (%d MiB)", rss0>>20), func() bool {
			return vmRSS() < rss0+20<<20
		})
	}
	t.Logf("after: heap %d MiB, VmRSS %d MiB", heapObjects()>>20, vmRSS()>>20)
}

// bbChunked sends n body bytes with Transfer-Encoding: chunked in 64 KiB chunks while it
// reads the answer.
func bbChunked(t *testing.T, base string, n int) bbUpload {
	t.Helper()
	u := bbSendChunked(base, n, 20*time.Second)
	if u.err != nil && u.status == 0 && errors.Is(u.err, errBBDial) {
		t.Fatal(u.err)
	}
	return u
}

// errBBDial marks an upload that could not connect.
var errBBDial = errors.New("dial")

// bbSendChunked is bbChunked for any goroutine: every error is in the result.
func bbSendChunked(base string, n int, wait time.Duration) bbUpload {
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		return bbUpload{err: fmt.Errorf("%w: %v", errBBDial, err)}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
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
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
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
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
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
		// 200 KiB sent of 1 MiB declared: the buffer holds what arrived, in the 256 KiB class.
		eventually(t, 10*time.Second, "the upload's reservation taken", func() bool { return s.bodies.used.Load() == 256<<10 })
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

// The budget's pieces on their own: reservations never exceed the limit; grow reserves the
// new buffer while the old one is still held (both count during the copy) and gives the
// old one back after; the growth steps; the pool keeps at most bodyClassMax buffers per
// class and never a large one.
func TestBodyBudgetAccounting(t *testing.T) {
	b := newBodyBudget(400<<10, vm.NewSet())
	b.gc, b.trim = func() {}, func() {}
	var a, c bodyLease
	if !b.reserve(&a, 300<<10) || b.reserve(&c, 200<<10) || c.n != 0 {
		t.Fatalf("reserve: a %d c %d used %d", a.n, c.n, b.used.Load())
	}
	b.release(&a)
	if b.used.Load() != 0 || a.n != 0 || a.buf != nil {
		t.Fatalf("after release: used %d, lease %+v", b.used.Load(), a)
	}
	// grow: nothing -> 16 KiB -> 64 KiB, the bytes kept, the reservation the buffer's capacity.
	if !b.grow(&a, 0, bodyFirst) || len(a.buf) != bodyFirst || a.n != bodyFirst || b.used.Load() != bodyFirst {
		t.Fatalf("first buffer: len %d, lease %d, used %d", len(a.buf), a.n, b.used.Load())
	}
	copy(a.buf, "abc")
	if !b.grow(&a, 3, 40<<10) || len(a.buf) != 40<<10 || cap(a.buf) != 64<<10 || a.n != 64<<10 ||
		b.used.Load() != 64<<10 || string(a.buf[:3]) != "abc" {
		t.Fatalf("grow: len %d cap %d, lease %d, used %d", len(a.buf), cap(a.buf), a.n, b.used.Load())
	}
	// 64 KiB held + 256 KiB new fits 400 KiB; with 100 KiB reserved elsewhere it does not,
	// though the new buffer alone would: the old one is alive during the copy.
	if !b.reserve(&c, 100<<10) {
		t.Fatal("reserve 100 KiB")
	}
	if b.grow(&a, 3, 256<<10) || a.n != 64<<10 || cap(a.buf) != 64<<10 || b.used.Load() != 164<<10 {
		t.Fatalf("grow past the budget: lease %d cap %d used %d, want refused and unchanged", a.n, cap(a.buf), b.used.Load())
	}
	b.release(&c)
	if !b.grow(&a, 3, 256<<10) || a.n != 256<<10 || b.used.Load() != 256<<10 || string(a.buf[:3]) != "abc" {
		t.Fatalf("grow to 256 KiB: lease %d used %d", a.n, b.used.Load())
	}
	b.release(&a)
	if b.used.Load() != 0 {
		t.Fatalf("used %d after release", b.used.Load())
	}

	for _, tc := range []struct{ cur, total, want int }{
		{16 << 10, 20 << 10, 20 << 10},       // within the classes: class to class, then the total
		{16 << 10, 100 << 10, 64 << 10},      //
		{64 << 10, 100 << 10, 100 << 10},     //
		{256 << 10, 1200 << 10, 1 << 20},     //
		{1 << 20, 1200 << 10, 1200 << 10},    // past them: the total when within twice cur
		{1 << 20, 40 << 20, 1280 << 10},      // else the largest total/2^k within twice cur:
		{1280 << 10, 40 << 20, 2560 << 10},   // 1.25, 2.5, 5, 10, 20, 40 MiB
		{16 << 20, 40 << 20, 20 << 20},       //
		{20 << 20, 40 << 20, 40 << 20},       // the last growth holds 1.5 times the body
		{16 << 20, 64<<20 + 1, 32<<20 + 1},   // 16 MiB+1 is a step too small: 32 MiB+1
		{32 << 20, 64<<20 + 1, 64<<20 + 1},   // 32 MiB+1 too: straight to the total
		{32<<20 + 1, 64<<20 + 1, 64<<20 + 1}, //
		{1 << 20, 64<<20 + 1, 2<<20 + 1},     //
	} {
		if got := nextLen(tc.cur, tc.total); got != tc.want {
			t.Errorf("nextLen(%d, %d) = %d, want %d", tc.cur, tc.total, got, tc.want)
		}
	}
	// Every chain from the first buffer: steps of at most four times (2.5 past the classes),
	// ending at the total, the last from at most half of it (or the largest class).
	for _, total := range []int{20 << 10, 1<<20 + 1, 3<<20 - 7, 40 << 20, 64<<20 + 1, 100_000_007} {
		cur, steps := bodyFirst, 0
		for cur < total && steps < 64 {
			next := nextLen(cur, total)
			if next <= cur || next > 4*cur || (cur >= maxClass && 2*next > 5*cur) {
				t.Fatalf("total %d: step %d -> %d", total, cur, next)
			}
			if next == total && cur > max((total+1)/2, maxClass) {
				t.Errorf("total %d: the last growth is from %d, over half the total", total, cur)
			}
			cur, steps = next, steps+1
		}
		if cur != total {
			t.Errorf("total %d: chain ends at %d after %d steps", total, cur, steps)
		}
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

// Dropped large buffers are debt until a collection reclaims them: a reservation must fit
// beside it; once gcAfter of it accrued a goroutine collects, pays it back, returns the
// heap to the OS after the burst and ends. A reservation that only the debt keeps out waits
// for a collection instead of failing; one that the live bytes keep out fails at once.
func TestBodyBudgetCollects(t *testing.T) {
	b := newBodyBudget(64<<20, vm.NewSet())
	var gcs, trims atomic.Int32
	b.gc = func() { gcs.Add(1) }
	b.trim = func() { trims.Add(1) }
	if b.gcAfter != 8<<20 {
		t.Fatalf("gcAfter %d, want an eighth of the budget", b.gcAfter)
	}
	b.put(make([]byte, 7<<20))
	b.put(make([]byte, bodyClasses[0])) // pooled: not debt
	if b.collecting.Load() || b.debt.Load() != 7<<20 {
		t.Fatalf("debt %d, collecting %v after 7 MiB dropped (gcAfter 8 MiB)", b.debt.Load(), b.collecting.Load())
	}
	var l bodyLease
	if b.reserve(&l, 60<<20) {
		t.Fatal("reserved 60 MiB of 64 beside 7 MiB of debt")
	}
	b.put(make([]byte, 2<<20))
	eventually(t, 10*time.Second, "a collection once 9 MiB were dropped", func() bool { return gcs.Load() == 1 })
	eventually(t, 10*time.Second, "the debt paid back", func() bool { return b.debt.Load() == 0 })
	eventually(t, 10*time.Second, "the trim after the burst", func() bool { return trims.Load() == 1 })
	eventually(t, 10*time.Second, "the collect goroutine ends after the trim", func() bool { return !b.collecting.Load() })
	if g := gcs.Load(); g != 1 {
		t.Errorf("%d collections for one burst, want 1", g)
	}

	// Debt below gcAfter calls for no collection, but a growth it keeps out has one run.
	b.put(make([]byte, 4<<20))
	if !b.reserveWait(&l, 62<<20) || l.n != 62<<20 || b.debt.Load() != 0 {
		t.Fatalf("reserveWait 62 MiB beside 4 MiB of debt: lease %d, debt %d", l.n, b.debt.Load())
	}
	if g := gcs.Load() + trims.Load(); g < 3 {
		t.Errorf("reserveWait got its room without a collection (%d collections and trims)", g)
	}
	if b.reserveWait(&l, 4<<20) || l.n != 62<<20 {
		t.Fatalf("reserveWait 4 MiB beside 62 MiB live of 64: lease %d, want refused", l.n)
	}
	b.release(&l)
	if b.used.Load() != 0 {
		t.Errorf("used %d after release", b.used.Load())
	}
}

// A client that writes its whole body before reading (as most SDKs do) still gets the
// refusal: the connection closes lingering, reading and dropping the rest of the body,
// instead of resetting, which would destroy the answer in the client's receive buffer.
func TestRefusedUploadStillGetsTheAnswer(t *testing.T) {
	be := newBBHoldBackend(t)
	close(be.release)
	_, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
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
