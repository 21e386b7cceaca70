package proxy

// The proxy's own resources (file descriptors, socket buffers, local ports) and what happens
// when they run out. Running out is prefixlb's condition, never a backend's: a dial that
// fails for it is not a connect error of the backend (no ejection, no retry elsewhere, which
// would fail the same way), the client gets 503 with Retry-After and an OpenAI-shaped error
// naming the cause, the condition is counted in prefixlb_local_resource_errors_total{kind}
// and logged at most once per localLogEvery per kind.
//
// Descriptors are budgeted (fdBudget) so that the data path never takes the last of them:
// the admin port, health checks, peering, DNS and the process's own files live in a reserve
// the data path does not touch, as Envoy exempts its admin listener from the global
// downstream connection limit and HAProxy derives maxconn from the descriptor limit.

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/internal/fdlimit"
)

// localKind is one way a local resource ran out.
type localKind uint8

const (
	localFDBudget      localKind = iota // the data path's share of descriptors is in use (fdBudget)
	localEMFILE                         // the process is at RLIMIT_NOFILE
	localENFILE                         // the system-wide file table is full
	localENOBUFS                        // no socket buffer space
	localENOMEM                         // no kernel memory for the socket
	localEADDRNOTAVAIL                  // no free local port to connect from (ephemeral ports exhausted)
	nLocalKinds
)

var localKindNames = [nLocalKinds]string{"fd_budget", "emfile", "enfile", "enobufs", "enomem", "eaddrnotavail"}

// localKindMessages are the clients' error messages, per kind: the cause, and that it is
// prefixlb's.
var localKindMessages = [nLocalKinds]string{
	"prefixlb is at its connection limit (its share of file descriptors is in use); retry later",
	"prefixlb is out of file descriptors (RLIMIT_NOFILE); retry later",
	"the system is out of file descriptors; retry later",
	"prefixlb is out of socket buffer space; retry later",
	"prefixlb is out of kernel memory for sockets; retry later",
	"prefixlb is out of local ports to connect from; retry later",
}

func (k localKind) String() string { return localKindNames[k] }

// localKindOf reports whether err is a local resource running out, and which.
func localKindOf(err error) (localKind, bool) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return 0, false
	}
	switch errno {
	case syscall.EMFILE:
		return localEMFILE, true
	case syscall.ENFILE:
		return localENFILE, true
	case syscall.ENOBUFS:
		return localENOBUFS, true
	case syscall.ENOMEM:
		return localENOMEM, true
	case syscall.EADDRNOTAVAIL:
		return localEADDRNOTAVAIL, true
	}
	return 0, false
}

// errLocalResource is the class of every localError (statusOf: 503).
var errLocalResource = errors.New("prefixlb is out of a local resource")

// errFDBudget is the cause of a localError of kind localFDBudget.
var errFDBudget = errors.New("the data path's share of file descriptors is in use")

// retryAfterLocal is the Retry-After of a 503 for a local resource, seconds: descriptors
// come back as streams end, which at inference rates is within a second or two.
const retryAfterLocal = "1"

// localError is a request that failed because a local resource ran out: nothing reached a
// backend. Error is the client's message for the kind; the cause stays for errDetail.
type localError struct {
	kind localKind
	err  error
}

func (e *localError) Error() string   { return localKindMessages[e.kind] }
func (e *localError) Unwrap() []error { return []error{errLocalResource, e.err} }

// logLocalResource is the message of the local resource warning.
const logLocalResource = "out of a local resource: requests get 503, no backend is blamed (raise the file-descriptor limit, or add replicas)"

// localLogEvery is how often one kind of local resource error is logged at most.
const localLogEvery = 10 * time.Second

// localResources counts and logs local resource errors: prefixlb_local_resource_errors_total
// {kind}, and one warning per kind per localLogEvery saying how many were left out since.
type localResources struct {
	log    *zap.Logger
	counts [nLocalKinds]*metrics.Counter
	logged *logLimiter // per kind
}

func newLocalResources(set *metrics.Set, log *zap.Logger, now func() time.Time) *localResources {
	l := &localResources{log: log, logged: newLogLimiter(now, localLogEvery)}
	for k := range l.counts {
		l.counts[k] = set.NewCounter(fmt.Sprintf(`prefixlb_local_resource_errors_total{kind=%q}`, localKind(k)))
	}
	return l
}

// report counts one error of kind met where ("dial", "accept", "admin accept"), and logs it
// unless its kind was logged within localLogEvery.
func (l *localResources) report(kind localKind, where string, err error) {
	l.counts[kind].Inc()
	full, skipped := l.logged.allow(kind.String())
	if !full {
		return
	}
	l.log.Warn(logLocalResource,
		zap.Stringer("kind", kind), zap.String("where", where), zap.String("error", errDetail(err)),
		zap.Int("suppressed", skipped), zap.Duration("every", localLogEvery))
}

// fdBudget bounds the descriptors the data path holds: client connections accepted on the
// data port, and connections to backends. Clients take at most half of it, so that every
// accepted client finds a descriptor for its backend connection (idle pooled ones are
// closed to make room: reclaim). Past the clients' half, a few more connections (overflow)
// are accepted only to be answered 503 at once, so that a client over the limit hears why
// instead of waiting in the listen backlog; past those, the listener waits for a descriptor
// to come back. Counters only: no descriptor is held in advance.
type fdBudget struct {
	max         int64 // descriptors the data path may hold
	maxClients  int64 // of which client connections
	maxOverflow int64 // connections accepted over maxClients to be refused with 503
	used        atomic.Int64
	clients     atomic.Int64
	overflow    atomic.Int64
	freed       chan struct{} // a descriptor came back (capacity 1: a wakeup, not a count)
	reclaim     func()        // closes idle pooled backend connections (nil: none)
}

// The reserve of descriptors the data path leaves to the rest of the process: an eighth of
// the limit, at least fdReserveMin and at most fdReserveMax.
const (
	fdReserveMin = 64
	fdReserveMax = 4096
)

// newFDBudget returns the budget for an open-file limit of limit descriptors (0: none known,
// no budget: nil).
func newFDBudget(limit uint64) *fdBudget {
	if limit == 0 || limit > 1<<40 {
		return nil
	}
	n := int64(limit)
	reserve := min(max(n/8, fdReserveMin), fdReserveMax)
	total := max(n-reserve, n/2)
	return &fdBudget{
		max:         total,
		maxClients:  max(total/2, 1),
		maxOverflow: max(min(reserve/4, 256), 1),
		freed:       make(chan struct{}, 1),
	}
}

// DescriptorBudget is how the data path shares an open-file limit of limit descriptors: it
// holds at most dataPath of them, client connections at most clients, and leaves the rest
// (reserve) to the admin port, health checks, peering and the process's files. All 0 when
// limit is 0 (unknown: no budget).
func DescriptorBudget(limit uint64) (dataPath, clients, reserve int64) {
	b := newFDBudget(limit)
	if b == nil {
		return 0, 0, 0
	}
	return b.max, b.maxClients, int64(limit) - b.max
}

// processFDBudget is the budget for the process's current soft open-file limit.
func processFDBudget() *fdBudget {
	l, err := fdlimit.Current()
	if err != nil || l.Unknown {
		return nil
	}
	return newFDBudget(l.Soft)
}

// take reserves one descriptor of the budget; false when it is all in use.
func (b *fdBudget) take() bool {
	for {
		u := b.used.Load()
		if u >= b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+1) {
			return true
		}
	}
}

// give returns one descriptor taken by take.
func (b *fdBudget) give() {
	b.used.Add(-1)
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// takeOrReclaim is take; when nothing is left it closes the idle pooled backend connections
// and tries once more.
func (b *fdBudget) takeOrReclaim() bool {
	if b.take() {
		return true
	}
	if b.reclaim != nil {
		b.reclaim()
	}
	return b.take()
}

// takeBackend reserves the descriptor of a new backend connection.
func (b *fdBudget) takeBackend() bool {
	return b == nil || b.takeOrReclaim()
}

// giveBackend returns a backend connection's descriptor.
func (b *fdBudget) giveBackend() {
	if b != nil {
		b.give()
	}
}

// admission is what the budget decided for a connection about to be accepted.
type admission uint8

const (
	admitWait     admission = iota // nothing left: wait for a descriptor to come back
	admitServe                     // a client slot: serve it
	admitOverflow                  // over the clients' share: answer 503 and close
)

// takeClient reserves the descriptor of a client connection about to be accepted.
func (b *fdBudget) takeClient() admission {
	if b == nil {
		return admitServe
	}
	for {
		c := b.clients.Load()
		if c >= b.maxClients {
			break
		}
		if b.clients.CompareAndSwap(c, c+1) {
			if b.takeOrReclaim() {
				return admitServe
			}
			b.clients.Add(-1)
			break
		}
	}
	for {
		o := b.overflow.Load()
		if o >= b.maxOverflow {
			return admitWait
		}
		if b.overflow.CompareAndSwap(o, o+1) {
			return admitOverflow
		}
	}
}

// giveClient returns a client connection's descriptor.
func (b *fdBudget) giveClient(a admission) {
	if b == nil {
		return
	}
	switch a {
	case admitServe:
		b.clients.Add(-1)
		b.give()
	case admitOverflow:
		b.overflow.Add(-1)
		select {
		case b.freed <- struct{}{}:
		default:
		}
	}
}

// waitFreed waits until a descriptor may have come back, or at most d.
func (b *fdBudget) waitFreed(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-b.freed:
	case <-t.C:
	}
}

// overflowed answers a request on a connection accepted over the clients' share of the
// descriptor budget (retryListener): 503 with Retry-After and the cause, and the connection
// closed after it. It reports whether it did.
func (s *Server) overflowed(ctx *fasthttp.RequestCtx) bool {
	cc, ok := ctx.Conn().(*clientConn)
	if !ok || !cc.overflow() {
		return false
	}
	s.local.report(localFDBudget, "accept", errFDBudget)
	s.reject(ctx, fasthttp.StatusServiceUnavailable, "fd_budget", localKindMessages[localFDBudget])
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, retryAfterLocal)
	closeAfterRefusal(ctx)
	return true
}
