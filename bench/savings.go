package bench

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/proxy"
)

// savingsSettle bounds the wait, after the load generator has its last response, for the
// arm's prefixlb replicas to finish counting their last requests (a request is counted just
// before its backend's in-flight count drops).
const savingsSettle = 5 * time.Second

// routerSavings reads the arm's prefixlb replicas' /metrics (their admin handler, in-process)
// once their requests are all counted, and sums what they spent routing and what they saved
// in prefill over the replicas: prefixlb_routing_seconds_total by stage,
// prefixlb_prefill_saved_seconds_total and prefixlb_backend_cached_tokens_total over the
// backends, and in shadow mode prefixlb_shadow_prefill_saved_seconds_total by choice.
func routerSavings(svs []*proxy.Serving) (*report.Savings, error) {
	deadline := time.Now().Add(savingsSettle)
	for _, sv := range svs {
		for inFlight(sv) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	sum := &report.Savings{}
	for _, sv := range svs {
		rec := httptest.NewRecorder()
		sv.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			return nil, fmt.Errorf("prefixlb /metrics: status %d", rec.Code)
		}
		if err := addSavings(sum, rec.Body.String()); err != nil {
			return nil, fmt.Errorf("prefixlb /metrics: %w", err)
		}
	}
	sum.RoutingSeconds = sum.KeySeconds + sum.PickSeconds
	return sum, nil
}

// inFlight is the requests sv has in flight over its backends.
func inFlight(sv *proxy.Serving) int64 {
	var n int64
	for _, b := range sv.Backends() {
		n += b.InFlight()
	}
	return n
}

// addSavings adds the savings families' samples of one Prometheus text page to sum.
func addSavings(sum *report.Savings, page string) error {
	sc := bufio.NewScanner(strings.NewReader(page))
	sc.Buffer(nil, 1<<20)
	shadow := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			return fmt.Errorf("line without a value: %q", line)
		}
		series := line[:sp]
		name, labels, _ := strings.Cut(series, "{")
		var dst *float64 // a sum in seconds; else count, a counter
		var count *int64
		switch {
		case name == "prefixlb_routing_seconds_total" && labels == `stage="key"}`:
			dst = &sum.KeySeconds
		case name == "prefixlb_routing_seconds_total" && labels == `stage="pick"}`:
			dst = &sum.PickSeconds
		case name == "prefixlb_prefill_saved_seconds_total":
			dst = &sum.SavedPrefillSeconds
		case name == "prefixlb_shadow_prefill_saved_seconds_total" && labels == `choice="shadow"}`:
			dst, shadow = &sum.ShadowSavedPrefillSeconds, true
		case name == "prefixlb_shadow_prefill_saved_seconds_total" && labels == `choice="actual"}`:
			dst, shadow = &sum.ShadowActualSavedPrefillSeconds, true
		case name == "prefixlb_flow_queue_wait_seconds_sum" && labels == `outcome="dispatched"}`:
			dst = &sum.QueueWaitSeconds
		case name == "prefixlb_backend_cached_tokens_total":
			count = &sum.CachedTokens
		case name == "prefixlb_flow_queued_total":
			count = &sum.Queued
		case name == "prefixlb_flow_refused_total":
			count = &sum.Refused
		case name == "prefixlb_flow_outcomes_total" && labels == `outcome="dispatched"}`:
			count = &sum.QueueDispatched
		default:
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return fmt.Errorf("%q: %w", line, err)
		}
		if dst != nil {
			*dst += v
		} else {
			*count += int64(v)
		}
	}
	sum.Shadow = sum.Shadow || shadow
	return sc.Err()
}
