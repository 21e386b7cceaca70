package report

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Tenant is one tenant's row of an arm of a multi-tenant workload. Every request the tenant
// sent is exactly one of Completed, Refused, Expired, Failed (loadgen.Result.Class). Times are
// wall-clock like the rest of the report (× the run's speedup for model time).
type Tenant struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	Requests int    `json:"requests"`
	// Completed streamed to the end; Refused got HTTP 429 or 503, counted by the error body's
	// reason (error.code, else error.type) in RefusedReasons; Expired: the client gave up
	// waiting for the first token (its patience) and cancelled; Failed: anything else, by
	// reason in FailedReasons.
	Completed      int            `json:"completed"`
	Refused        int            `json:"refused"`
	RefusedReasons map[string]int `json:"refused_reasons,omitempty"`
	Expired        int            `json:"expired"`
	Failed         int            `json:"failed"`
	FailedReasons  map[string]int `json:"failed_reasons,omitempty"`
	// TTFT is over the completed requests.
	TTFT Latency `json:"ttft"`
	// SLOMs is the tenant's TTFT SLO in wall milliseconds (its model-time SLO ÷ speedup);
	// WithinSLO counts the completed requests whose TTFT met it. Goodput is WithinSLO per
	// second of the arm (GoodputRPS) and as a share of the requests the tenant sent
	// (GoodputShare): an expired or refused request counts against it.
	SLOMs        float64 `json:"slo_ms"`
	WithinSLO    int     `json:"within_slo"`
	GoodputRPS   float64 `json:"goodput_rps"`
	GoodputShare float64 `json:"goodput_share"`
	// GPU work served: the prompt tokens the replicas computed (usage.prompt_tokens −
	// usage.prompt_tokens_details.cached_tokens) plus the tokens generated, over every request
	// that got a reply; GPUWorkShare is the tenant's share of all tenants' work in the arm.
	UncachedPromptTokens int64   `json:"uncached_prompt_tokens"`
	OutputTokens         int64   `json:"output_tokens"`
	GPUWorkTokens        int64   `json:"gpu_work_tokens"`
	GPUWorkShare         float64 `json:"gpu_work_share"`
}

// Fairness is Jain's index over the GPU-work shares of tenants of one priority, counted while
// all of them were backlogged. Backlogged is judged as a router's queue would see it: a tenant
// is backlogged while at least one of its requests has been sent and has not yet reached its
// first token (waitingSpan), i.e. while a router holding requests would have one of the
// tenant's to choose. Work is counted when the client sees it: a request's uncached prompt
// tokens at its first token, its generated tokens spread evenly over its content events. Jain is
// 1 when the shares are equal and 1/n when one tenant got all; it reaches 1 only if each tenant
// asked for at least an equal share in those intervals: a tenant that asks for less gets all it
// asks under a fair scheduler, and its share stays below equal.
type Fairness struct {
	Priority int      `json:"priority"`
	Tenants  []string `json:"tenants"`
	// Backlog names the definition of backlogged above (BacklogWaiting).
	Backlog     string  `json:"backlog"`
	BackloggedS float64 `json:"backlogged_s"`
	// WorkTokens and Shares are each tenant's work in those intervals and its share of the
	// group's; Jain is omitted when no work was seen in them.
	WorkTokens map[string]float64 `json:"work_tokens"`
	Shares     map[string]float64 `json:"shares"`
	Jain       *float64           `json:"jain,omitempty"`
}

// BacklogWaiting is Fairness.Backlog: a tenant is backlogged while one of its requests is sent
// and not yet at its first token.
const BacklogWaiting = "sent, not yet at first token"

// Jain is Jain's fairness index (Σx)² ÷ (n·Σx²) of xs: 1 for equal values, 1/n when one holds
// everything; NaN for no values or all zero.
func Jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if len(xs) == 0 || sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// SummarizeTenants computes the tenants' rows of one arm (in tenants' order) and the fairness
// of every priority that two or more of them share. speedup converts the tenants' model-time
// SLOs to wall time (0: 1).
func SummarizeTenants(out *loadgen.Outcome, tenants []*workload.Tenant, speedup float64) ([]Tenant, []Fairness) {
	if len(tenants) == 0 {
		return nil, nil
	}
	if speedup <= 0 {
		speedup = 1
	}
	rows := make([]Tenant, len(tenants))
	idx := map[string]int{}
	ttft := make([]*Recorder, len(tenants))
	slo := make([]time.Duration, len(tenants))
	for i, t := range tenants {
		idx[t.Name] = i
		slo[i] = time.Duration(float64(t.SLO) / speedup)
		rows[i] = Tenant{Name: t.Name, Priority: t.Priority, SLOMs: float64(slo[i]) / float64(time.Millisecond)}
		ttft[i] = NewRecorder()
	}
	var total int64
	for k := range out.Results {
		r := &out.Results[k]
		i, ok := idx[r.Tenant]
		if !ok {
			continue
		}
		row := &rows[i]
		row.Requests++
		switch r.Class() {
		case loadgen.Completed:
			row.Completed++
			ttft[i].Record(r.TTFT)
			if r.TTFT <= slo[i] {
				row.WithinSLO++
			}
		case loadgen.Refused:
			row.Refused++
			row.RefusedReasons = bump(row.RefusedReasons, refusalReason(r))
		case loadgen.Expired:
			row.Expired++
		default:
			row.Failed++
			row.FailedReasons = bump(row.FailedReasons, r.Err)
		}
		u, o := work(r)
		row.UncachedPromptTokens += u
		row.OutputTokens += o
		row.GPUWorkTokens += u + o
		total += u + o
	}
	d := out.Duration().Seconds()
	for i := range rows {
		row := &rows[i]
		row.TTFT = ttft[i].Summary()
		if d > 0 {
			row.GoodputRPS = float64(row.WithinSLO) / d
		}
		if row.Requests > 0 {
			row.GoodputShare = float64(row.WithinSLO) / float64(row.Requests)
		}
		if total > 0 {
			row.GPUWorkShare = float64(row.GPUWorkTokens) / float64(total)
		}
	}
	return rows, fairness(out, tenants)
}

func bump(m map[string]int, k string) map[string]int {
	if m == nil {
		m = map[string]int{}
	}
	m[k]++
	return m
}

// refusalReason is "STATUS REASON" of a refusal, e.g. "429 queue_full" or "503 prefixlb_503".
func refusalReason(r *loadgen.Result) string {
	if r.ErrorCode == "" {
		return fmt.Sprint(r.Status)
	}
	return fmt.Sprintf("%d %s", r.Status, r.ErrorCode)
}

// work is the GPU work a request was served: its uncached prompt tokens (when its usage
// arrived) and the tokens generated, 0 for a request that got no first token.
func work(r *loadgen.Result) (uncached, output int64) {
	if r.TTFT <= 0 {
		return 0, 0
	}
	if r.UsageSeen {
		uncached = int64(max(r.PromptTokens-r.CachedTokens, 0))
	}
	return uncached, int64(r.OutputTokens)
}

// span is a half-open interval [from, to) of offsets from the run's start.
type span struct{ from, to time.Duration }

// merge sorts spans and joins overlapping or touching ones.
func merge(s []span) []span {
	slices.SortFunc(s, func(a, b span) int { return int(a.from - b.from) })
	var out []span
	for _, x := range s {
		if x.to <= x.from {
			continue
		}
		if n := len(out); n > 0 && x.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, x.to)
			continue
		}
		out = append(out, x)
	}
	return out
}

// intersect is the intersection of two merged span lists.
func intersect(a, b []span) []span {
	var out []span
	for i, j := 0, 0; i < len(a) && j < len(b); {
		from, to := max(a[i].from, b[j].from), min(a[i].to, b[j].to)
		if from < to {
			out = append(out, span{from, to})
		}
		if a[i].to < b[j].to {
			i++
		} else {
			j++
		}
	}
	return out
}

// contains reports whether t lies in one of the merged spans (ends included: the last token
// of a request arrives at the end of its own outstanding span).
func contains(s []span, t time.Duration) bool {
	i := sort.Search(len(s), func(i int) bool { return s[i].to >= t })
	return i < len(s) && s[i].from <= t
}

// waitingSpan is when r waited for its first token, from the run's start: from its send (its
// due time plus the client's lag in sending it) to its first token or, without one, to its end
// (its refusal, its failure, or its client giving up). Empty for a request that never ended.
func waitingSpan(r *loadgen.Result, start time.Time) span {
	from := r.Scheduled.Sub(start) + r.SendLag
	switch {
	case r.TTFT > 0:
		return span{from, r.Scheduled.Sub(start) + r.TTFT}
	case r.E2E > 0:
		return span{from, r.Scheduled.Sub(start) + r.E2E}
	}
	return span{from, from}
}

// fairness computes Fairness for each priority that two or more tenants share.
func fairness(out *loadgen.Outcome, tenants []*workload.Tenant) []Fairness {
	byPrio := map[int][]string{}
	var prios []int
	for _, t := range tenants {
		if byPrio[t.Priority] == nil {
			prios = append(prios, t.Priority)
		}
		byPrio[t.Priority] = append(byPrio[t.Priority], t.Name)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(prios)))
	waiting := map[string][]span{}
	for k := range out.Results {
		r := &out.Results[k]
		waiting[r.Tenant] = append(waiting[r.Tenant], waitingSpan(r, out.Start))
	}
	var fs []Fairness
	for _, p := range prios {
		names := byPrio[p]
		if len(names) < 2 {
			continue
		}
		var both []span
		for i, n := range names {
			m := merge(waiting[n])
			if i == 0 {
				both = m
			} else {
				both = intersect(both, m)
			}
		}
		f := Fairness{Priority: p, Tenants: names, Backlog: BacklogWaiting, WorkTokens: map[string]float64{}, Shares: map[string]float64{}}
		for _, s := range both {
			f.BackloggedS += (s.to - s.from).Seconds()
		}
		in := map[string]bool{}
		for _, n := range names {
			in[n] = true
			f.WorkTokens[n] = 0
		}
		for k := range out.Results {
			r := &out.Results[k]
			if in[r.Tenant] {
				f.WorkTokens[r.Tenant] += workIn(r, out.Start, both)
			}
		}
		xs := make([]float64, len(names))
		var sum float64
		for i, n := range names {
			xs[i] = f.WorkTokens[n]
			sum += xs[i]
		}
		if sum > 0 {
			for i, n := range names {
				f.Shares[n] = xs[i] / sum
			}
			j := Jain(xs)
			f.Jain = &j
		}
		fs = append(fs, f)
	}
	return fs
}

// workIn is the part of r's work (work) that the client saw within the spans: the uncached
// prompt at the first token, the generated tokens spread evenly over the content events.
func workIn(r *loadgen.Result, start time.Time, spans []span) float64 {
	u, o := work(r)
	if u+o == 0 {
		return 0
	}
	t := r.Scheduled.Sub(start) + r.TTFT
	var w float64
	if contains(spans, t) {
		w += float64(u)
	}
	per := float64(o) / float64(len(r.ITL)+1)
	if contains(spans, t) {
		w += per
	}
	for _, g := range r.ITL {
		t += g
		if contains(spans, t) {
			w += per
		}
	}
	return w
}

// TenantTable renders one row per (arm, tenant) and, under it, each arm's fairness and its
// refusal reasons; "" when no arm has tenants. TTFTs and SLOs are wall milliseconds.
func TenantTable(modes []Mode) string {
	if !slices.ContainsFunc(modes, func(m Mode) bool { return len(m.Tenants) > 0 }) {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("| mode | tenant | prio | sent | done | refused | expired | failed | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | SLO ms | in SLO /s | in SLO share | GPU work tok | work share |\n")
	sb.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notes []string
	for _, m := range modes {
		for _, t := range m.Tenants {
			p50, p95, p99 := "-", "-", "-"
			if t.Completed > 0 {
				p50, p95, p99 = fms(t.TTFT.P50), fms(t.TTFT.P95), fms(t.TTFT.P99)
			}
			fmt.Fprintf(&sb, "| %s | %s | %d | %d | %d | %d | %d | %d | %s | %s | %s | %s | %.2f | %.3f | %d | %.3f |\n",
				m.Mode+rateSuffix(m.Rate), t.Name, t.Priority, t.Requests, t.Completed, t.Refused, t.Expired, t.Failed,
				p50, p95, p99, fms(t.SLOMs), t.GoodputRPS, t.GoodputShare, t.GPUWorkTokens, t.GPUWorkShare)
			if len(t.RefusedReasons) > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s refused: %s.", m.Mode, t.Name, countList(t.RefusedReasons)))
			}
			if len(t.FailedReasons) > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s failed: %s.", m.Mode, t.Name, countList(t.FailedReasons)))
			}
		}
		for _, f := range m.Fairness {
			shares := make([]string, len(f.Tenants))
			for i, n := range f.Tenants {
				shares[i] = fmt.Sprintf("%s %.3f", n, f.Shares[n])
			}
			j := "- (no work seen while all were backlogged)"
			if f.Jain != nil {
				j = fmt.Sprintf("%.3f", *f.Jain)
			}
			notes = append(notes, fmt.Sprintf("%s: Jain's index over priority %d (%s) while all were backlogged (%.1f s, each with a request sent and not yet at its first token): %s; GPU-work shares %s; output %.0f tok/s over all tenants.",
				m.Mode+rateSuffix(m.Rate), f.Priority, strings.Join(f.Tenants, ", "), f.BackloggedS, j, strings.Join(shares, ", "), m.OutputTPS))
		}
	}
	for _, n := range notes {
		sb.WriteString("\n" + n)
	}
	if len(notes) > 0 {
		sb.WriteString("\n")
	}
	return sb.String()
}

// countList is "a: 2, b: 1" sorted by key.
func countList(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(keys, ", ")
}

// rateSuffix is " @ RATE" for a swept rate.
func rateSuffix(rate float64) string {
	if rate == 0 {
		return ""
	}
	return fmt.Sprintf(" @ %g", rate)
}
