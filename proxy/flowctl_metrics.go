package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
)

// queueWaitBuckets, seconds: 1 ms … 10 min (a queue wait is bounded by max_queue_wait, at
// most an hour by the config).
var queueWaitBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// flowMetrics are flow control's families. Label sets are bounded: outcome and reason are
// fixed sets; priority is an integer within the classifier's ±1000 (in practice the few an
// operator configures); pool is a served model (the pools' queues). Flows are unbounded
// and labelled nowhere: /debug/queue shows them by their hashed IDs.
type flowMetrics struct {
	set      *metrics.Set
	queued   *metrics.Counter // requests pushed
	wait     [flowcontrol.Displaced + 1]*metrics.PrometheusHistogram
	outcomes [flowcontrol.Displaced + 1]*metrics.Counter
	// expiredSeen counts the expiries the dispatcher's timer found (their handlers count the
	// outcome); kept apart so a test sees the timer work.
	expiredSeen *metrics.Counter
	// returned counts dispatched requests put back at the head of their queue: a peered
	// prefixlb's request took their replica's slot first (redispatch).
	returned *metrics.Counter
	// ignored counts the classifier's ignored headers by reason (flowcontrol.IgnoredReasons'
	// order).
	ignored [4]*metrics.Counter

	mu      sync.Mutex
	refusal map[string]*metrics.Counter
	work    map[int]*metrics.Counter // served work by priority
}

func newFlowMetrics(s *metrics.Set) *flowMetrics {
	m := &flowMetrics{
		set:         s,
		queued:      s.NewCounter(`prefixlb_flow_queued_total`),
		expiredSeen: s.NewCounter(`prefixlb_flow_deadline_expiries_total`),
		returned:    s.NewCounter(`prefixlb_flow_returned_total`),
		refusal:     map[string]*metrics.Counter{},
		work:        map[int]*metrics.Counter{},
	}
	for o := flowcontrol.Dispatched; o <= flowcontrol.Displaced; o++ {
		l := fmt.Sprintf(`{outcome=%q}`, o)
		m.wait[o] = s.NewPrometheusHistogramExt(`prefixlb_flow_queue_wait_seconds`+l, queueWaitBuckets)
		m.outcomes[o] = s.NewCounter(`prefixlb_flow_outcomes_total` + l)
	}
	for i, r := range flowcontrol.IgnoredReasons[:len(m.ignored)] {
		m.ignored[i] = s.NewCounter(fmt.Sprintf(`prefixlb_flow_ignored_headers_total{reason=%q}`, r))
	}
	for _, r := range []string{"expired", "queue_full", "queue_bytes_full", "sheddable", "shed", "displaced", "shutdown"} {
		m.refusal[r] = s.NewCounter(fmt.Sprintf(`prefixlb_flow_refused_total{reason=%q}`, r))
	}
	return m
}

// outcome counts a queued request's outcome and its wait.
func (m *flowMetrics) outcome(o flowcontrol.Outcome, wait time.Duration) {
	if o < flowcontrol.Dispatched || o > flowcontrol.Displaced {
		return
	}
	m.outcomes[o].Inc()
	m.wait[o].Update(wait.Seconds())
}

// ignoredHeaders counts each reason in ig (a request with several counts under each).
func (m *flowMetrics) ignoredHeaders(ig flowcontrol.Ignored) {
	if ig == 0 {
		return
	}
	for i, r := range flowcontrol.IgnoredReasons[:len(m.ignored)] {
		if ig&r != 0 {
			m.ignored[i].Inc()
		}
	}
}

// refused counts a refusal by its reason (a fixed set).
func (m *flowMetrics) refused(reason string) {
	if c := m.refusal[reason]; c != nil {
		c.Inc()
	}
}

// served adds the settled work of a queued request to its priority's total.
func (m *flowMetrics) served(priority int, work int64) {
	m.mu.Lock()
	c := m.work[priority]
	if c == nil {
		c = m.set.NewCounter(`prefixlb_flow_served_work_total{priority="` + strconv.Itoa(priority) + `"}`)
		m.work[priority] = c
	}
	m.mu.Unlock()
	c.Add(int(work))
}

// writeFlowGauges writes each pool's queue, by priority, at scrape time.
func (s *Server) writeFlowGauges(w io.Writer) {
	now := time.Now()
	held := uint64(max(s.fc.held.Load(), 0))
	metrics.WriteGaugeUint64(w, `prefixlb_flow_held_requests`, held)
	for _, pq := range *s.fc.list.Load() {
		snap := pq.q.Snapshot(now)
		pool := `pool=` + labelValue(poolLabel(pq.name))
		for _, b := range snap.Bands {
			l := `{` + pool + `,priority="` + strconv.Itoa(b.Priority) + `"}`
			metrics.WriteGaugeUint64(w, `prefixlb_flow_queue_requests`+l, uint64(max(b.Queued, 0)))
			metrics.WriteGaugeUint64(w, `prefixlb_flow_queue_bytes`+l, uint64(max(b.Bytes, 0)))
			var age time.Duration
			for _, f := range b.Flows {
				age = max(age, f.HeadAge)
			}
			metrics.WriteGaugeFloat64(w, `prefixlb_flow_queue_oldest_seconds`+l, age.Seconds())
		}
	}
}

// poolLabel is a pool's name as shown: its model, "*" for all backends, "?" for the
// backends whose models are unknown.
func poolLabel(name string) string {
	switch name {
	case poolAll:
		return "*"
	case poolAnyModel:
		return "?"
	}
	return name
}

// QueueInfo is /debug/queue: flow control's configuration and each pool's queue, flows by
// a hash of their IDs (never a key, never prompt text).
type QueueInfo struct {
	Enabled      bool        `json:"enabled"`
	MaxQueueWait string      `json:"max_queue_wait"`
	Held         int64       `json:"held"`
	Pools        []PoolQueue `json:"pools"`
}

// PoolQueue is one pool's queue in QueueInfo: the pool's model ("*": every backend, "?":
// those whose models are unknown), whether every healthy replica of it is saturated now,
// and the queue's snapshot with each flow ID replaced by its hash.
type PoolQueue struct {
	Pool      string               `json:"pool"`
	Saturated bool                 `json:"saturated"`
	Queue     flowcontrol.Snapshot `json:"queue"`
}

// QueueInfo describes flow control's queues now.
func (s *Server) QueueInfo() QueueInfo {
	cfg := s.fc.config()
	info := QueueInfo{Enabled: cfg.Enabled, MaxQueueWait: cfg.MaxQueueWait.String(), Held: s.fc.held.Load(), Pools: []PoolQueue{}}
	now := time.Now()
	for _, pq := range *s.fc.list.Load() {
		cands, _ := backend.Healthy(nil, s.poolMembers(pq.name))
		snap := pq.q.Snapshot(now)
		for i := range snap.Bands {
			for j := range snap.Bands[i].Flows {
				snap.Bands[i].Flows[j].Flow = hashedFlow(snap.Bands[i].Flows[j].Flow)
			}
		}
		info.Pools = append(info.Pools, PoolQueue{Pool: poolLabel(pq.name), Saturated: s.poolSaturated(cfg, cands), Queue: snap})
	}
	return info
}

// hashedFlow shows a flow ID as its origin (the part before its first ':', as the
// classifier prefixes them: key, rule, hdr) and 16 hex digits of its xxhash.
func hashedFlow(id string) string {
	origin := "flow"
	if i := strings.IndexByte(id, ':'); i > 0 && i <= 8 {
		origin = id[:i]
	}
	return origin + ":" + strconv.FormatUint(xxhash.Sum64String(id), 16)
}

func (s *Server) debugQueue(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.QueueInfo())
}
