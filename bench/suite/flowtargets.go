// Issue 56's flow-control targets: the overload workload's cells per tenant and judged, and
// the moonshot on the other cells.

package suite

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/prefixlb/prefixlb/bench/report"
)

// FlowPolicy is prefix mode with prefixlb's flow control; the targets compare it with
// PrefixPolicy (the same routing, every request forwarded at once).
const FlowPolicy = "prefix+fc"

// OverloadWorkload is the multi-tenant workload whose cells are judged here.
const OverloadWorkload = "overload"

// Issue 56's bounds. Light load: prefix+fc's TTFT p95 ÷ prefix's has an interval holding 1
// whose upper end is at most TargetLightP95. Overload (2× the capacity): the chat tenant's
// p95 at most TargetChatMultiple × its p95 in the light cell, at least TargetChatInSLO of its
// requests within its SLO, output tokens/s over all tenants at least TargetOutputTPS ×
// prefix's, no failed request. Fairness (fair10x): light's p95 with heavy at most
// TargetFairP95 × its p95 alone; Jain over the GPU-work shares while both are backlogged at
// least TargetJain. The moonshot: prefix+fc's p95 at most the oracle's, its p99 at most
// prefix's, nothing refused or expired.
const (
	TargetLightP95     = 1.03
	TargetChatMultiple = 2.0
	TargetChatInSLO    = 0.95
	TargetOutputTPS    = 0.95
	TargetFairP95      = 1.5
	TargetJain         = 0.95
	// ChatTenant and FairLightTenant are the tenants the targets follow.
	ChatTenant      = "chat"
	FairLightTenant = "light"
)

// TenantMedian is one tenant of one arm of an overload cell: each figure the median over the
// arm's rounds (report.Tenant's definitions; the TTFTs over the rounds in which the tenant
// completed a request, nil when none did), with the arm's Jain index (over the tenants of the
// tenant's priority, median over the rounds that have one; nil: none) and output tokens/s
// over all tenants.
type TenantMedian struct {
	Policy     string          `json:"policy"`
	Tenant     string          `json:"tenant"`
	Priority   int             `json:"priority"`
	Sent       float64         `json:"sent"`
	Done       float64         `json:"done"`
	Refused    float64         `json:"refused"`
	Expired    float64         `json:"expired"`
	Failed     float64         `json:"failed"`
	TTFT       *report.Latency `json:"ttft,omitempty"`
	InSLOShare float64         `json:"in_slo_share"`
	WorkShare  float64         `json:"work_share"`
	Jain       *float64        `json:"jain,omitempty"`
	OutputTPS  float64         `json:"output_tps"`
}

// TenantRatio is one tenant's figure (a ratio with its interval).
type TenantRatio struct {
	Tenant string         `json:"tenant"`
	Ratio  *RatioInterval `json:"ratio"`
}

// PolicyRatio is one arm's figure (a ratio, or a value, with its interval).
type PolicyRatio struct {
	Policy string         `json:"policy"`
	Ratio  *RatioInterval `json:"ratio"`
}

// FlowCheck is issue 56's targets on one overload cell, by its level. Every ratio pairs round
// i with round i (across two cells: round i of each), with its ~95% t-interval; a figure is nil
// (not judged) where an arm it needs is missing or flagged.
type FlowCheck struct {
	Level string `json:"level"`
	// Light cell: prefix+fc's TTFT p95 ÷ prefix's, overall and per tenant.
	LightP95       *RatioInterval `json:"light_p95_fc_over_prefix,omitempty"`
	LightTenantP95 []TenantRatio  `json:"light_tenant_p95_fc_over_prefix,omitempty"`
	// Overload cell: the chat tenant's p95 ÷ its p95 in the light cell, prefix+fc's (judged)
	// and prefix's (the multiple without flow control, stated); prefix+fc's chat in-SLO share
	// (its per-round values, MeanInterval); output tokens/s prefix+fc ÷ prefix; the most
	// requests one of prefix+fc's rounds failed (nil: no prefix+fc arm).
	ChatMultiple       *RatioInterval `json:"chat_p95_over_light,omitempty"`
	ChatMultiplePrefix *RatioInterval `json:"chat_p95_over_light_prefix,omitempty"`
	ChatInSLO          *RatioInterval `json:"chat_in_slo_share,omitempty"`
	OutputTPS          *RatioInterval `json:"output_tps_fc_over_prefix,omitempty"`
	Failed             *int           `json:"failed,omitempty"`
	// Fair cell: each arm's light-tenant p95 ÷ its p95 in the fair-alone cell. Fair-shares
	// cell: each arm's Jain index (its per-round values, MeanInterval).
	FairP95 []PolicyRatio `json:"light_p95_over_alone,omitempty"`
	Jain    []PolicyRatio `json:"jain,omitempty"`
}

// Indistinguishable judges "the interval holds 1 and its upper end is at most hi": Met then,
// NotMet when the whole interval is on one side of 1 (the arms differ), NotShown when it holds
// 1 but reaches past hi or there is no interval, Unjudged for nil.
func Indistinguishable(ri *RatioInterval, hi float64) Verdict {
	switch {
	case ri == nil:
		return Unjudged
	case !ri.HasInterval():
		return NotShown
	case ri.Lo > 1 || ri.Hi < 1:
		return NotMet
	case ri.Hi <= hi:
		return Met
	}
	return NotShown
}

// noneFailed is Met for no failed request, NotMet for some, Unjudged for nil.
func noneFailed(n *int) Verdict {
	switch {
	case n == nil:
		return Unjudged
	case *n == 0:
		return Met
	}
	return NotMet
}

// Verdicts are the cell's targets in order, by level: light: p95 overall, then each tenant's;
// overload: chat multiple, chat in-SLO share, output tok/s, none failed; fair: each arm's
// light p95 ratio; fair-shares: each arm's Jain.
func (f *FlowCheck) Verdicts() []Verdict {
	var vs []Verdict
	switch f.Level {
	case "light":
		vs = append(vs, Indistinguishable(f.LightP95, TargetLightP95))
		for _, t := range f.LightTenantP95 {
			vs = append(vs, Indistinguishable(t.Ratio, TargetLightP95))
		}
	case OverloadLevel:
		vs = append(vs, AtMost(f.ChatMultiple, TargetChatMultiple), AtLeast(f.ChatInSLO, TargetChatInSLO),
			AtLeast(f.OutputTPS, TargetOutputTPS), noneFailed(f.Failed))
	case FairLevel:
		for _, p := range f.FairP95 {
			vs = append(vs, AtMost(p.Ratio, TargetFairP95))
		}
	case FairSharesLevel:
		for _, p := range f.Jain {
			vs = append(vs, AtLeast(p.Ratio, TargetJain))
		}
	}
	return vs
}

// Moonshot is prefix+fc on a cell of another workload: its TTFT p95 ÷ the oracle's, its p99 ÷
// prefix's, and the most requests one of its rounds refused or saw expire (Shed).
type Moonshot struct {
	P95Oracle *RatioInterval `json:"p95_over_oracle,omitempty"`
	P99Prefix *RatioInterval `json:"p99_over_prefix,omitempty"`
	Shed      int            `json:"shed"`
}

// Verdicts are the moonshot's three targets: p95 ÷ oracle ≤ 1, p99 ÷ prefix's ≤ 1, nothing shed.
func (m *Moonshot) Verdicts() [3]Verdict {
	return [3]Verdict{AtMost(m.P95Oracle, 1), AtMost(m.P99Prefix, 1), noneFailed(&m.Shed)}
}

// MeanInterval is the arithmetic mean of values with its two-sided Student's t interval at
// IntervalLevel (as a RatioInterval: Rounds the values, Ratio the mean): for figures that are
// shares or indices in [0, 1], where a round's 0 is a value, not a missing ratio. One value
// has no interval; none gives nil.
func MeanInterval(values []float64) *RatioInterval {
	n := len(values)
	if n == 0 {
		return nil
	}
	var sum float64
	for _, v := range values {
		sum += v
	}
	m := sum / float64(n)
	ri := &RatioInterval{Rounds: values, Ratio: m}
	if n == 1 {
		return ri
	}
	var ss float64
	for _, v := range values {
		ss += (v - m) * (v - m)
	}
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(n - 1)}.Quantile(1 - (1-IntervalLevel)/2)
	half := t * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	ri.Lo, ri.Hi, ri.Level = m-half, m+half, IntervalLevel
	return ri
}

// roundModes are an arm's rounds' rows (its own row for one round; nil entries for rounds
// without one).
func roundModes(a *Arm) []*report.Mode {
	if len(a.Rounds) == 0 {
		return []*report.Mode{a.Mode}
	}
	ms := make([]*report.Mode, len(a.Rounds))
	for i := range a.Rounds {
		ms[i] = a.Rounds[i].Mode
	}
	return ms
}

// tenantOf is the named tenant's row of m (nil: none).
func tenantOf(m *report.Mode, name string) *report.Tenant {
	if m == nil {
		return nil
	}
	if i := slices.IndexFunc(m.Tenants, func(t report.Tenant) bool { return t.Name == name }); i >= 0 {
		return &m.Tenants[i]
	}
	return nil
}

// tenantP95 is a row's tenant's TTFT p95 (0 when it completed nothing: no figure).
func tenantP95(name string) func(*report.Mode) float64 {
	return func(m *report.Mode) float64 {
		if t := tenantOf(m, name); t != nil && t.Completed > 0 {
			return t.TTFT.P95
		}
		return 0
	}
}

// jainOf is the Jain index of the priority group holding tenant in m (nil: none measured).
func jainOf(m *report.Mode, tenant string) *float64 {
	if m == nil {
		return nil
	}
	for _, f := range m.Fairness {
		if slices.Contains(f.Tenants, tenant) {
			return f.Jain
		}
	}
	return nil
}

// roundValues are f over the arm's rounds that have a row, skipping those where ok is false.
func roundValues(a *Arm, f func(*report.Mode) (float64, bool)) []float64 {
	var vs []float64
	for _, m := range roundModes(a) {
		if m == nil {
			continue
		}
		if v, ok := f(m); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// tenantMedians are the tenant rows of an overload cell's arms that ran (in arm order, each
// arm's tenants in report order).
func tenantMedians(arms []Arm) []TenantMedian {
	var out []TenantMedian
	for ai := range arms {
		a := &arms[ai]
		if a.Mode == nil {
			continue
		}
		ms := roundModes(a)
		tps := report.Median(roundValues(a, func(m *report.Mode) (float64, bool) { return m.OutputTPS, true }))
		for _, t := range a.Mode.Tenants {
			row := TenantMedian{Policy: a.Policy, Tenant: t.Name, Priority: t.Priority, OutputTPS: tps}
			var rs []*report.Tenant
			for _, m := range ms {
				if x := tenantOf(m, t.Name); x != nil {
					rs = append(rs, x)
				}
			}
			med := func(f func(*report.Tenant) float64, only func(*report.Tenant) bool) (float64, bool) {
				var xs []float64
				for _, x := range rs {
					if only == nil || only(x) {
						xs = append(xs, f(x))
					}
				}
				return report.Median(xs), len(xs) > 0
			}
			row.Sent, _ = med(func(x *report.Tenant) float64 { return float64(x.Requests) }, nil)
			row.Done, _ = med(func(x *report.Tenant) float64 { return float64(x.Completed) }, nil)
			row.Refused, _ = med(func(x *report.Tenant) float64 { return float64(x.Refused) }, nil)
			row.Expired, _ = med(func(x *report.Tenant) float64 { return float64(x.Expired) }, nil)
			row.Failed, _ = med(func(x *report.Tenant) float64 { return float64(x.Failed) }, nil)
			row.InSLOShare, _ = med(func(x *report.Tenant) float64 { return x.GoodputShare }, nil)
			row.WorkShare, _ = med(func(x *report.Tenant) float64 { return x.GPUWorkShare }, nil)
			done := func(x *report.Tenant) bool { return x.Completed > 0 }
			if p50, ok := med(func(x *report.Tenant) float64 { return x.TTFT.P50 }, done); ok {
				p95, _ := med(func(x *report.Tenant) float64 { return x.TTFT.P95 }, done)
				p99, _ := med(func(x *report.Tenant) float64 { return x.TTFT.P99 }, done)
				row.TTFT = &report.Latency{P50: p50, P95: p95, P99: p99}
			}
			if js := roundValues(a, func(m *report.Mode) (float64, bool) {
				j := jainOf(m, t.Name)
				return deref(j), j != nil
			}); len(js) > 0 {
				j := report.Median(js)
				row.Jain = &j
			}
			out = append(out, row)
		}
	}
	return out
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// validArm is the valid arm of policy among a cell's rows and arms (nil: none).
func validArm(rows []Row, arms []Arm, policy string) *Arm {
	if i := slices.IndexFunc(rows, func(r Row) bool { return r.Policy == policy && r.Valid() }); i >= 0 {
		return &arms[i]
	}
	return nil
}

// flowChecks sets each cell's Tenants, FlowControl and Moonshot (Analyze's last pass: an
// overload cell's targets read its sibling cells).
func flowChecks(b *Board) {
	r := b.Result
	sibling := func(level string) (rows []Row, arms []Arm) {
		for ci, c := range r.Cells {
			if c.Workload == OverloadWorkload && c.Level == level {
				return b.Rows[ci], c.Arms
			}
		}
		return nil, nil
	}
	for ci := range r.Cells {
		c := &r.Cells[ci]
		rows := b.Rows[ci]
		c.Tenants, c.FlowControl, c.Moonshot = nil, nil, nil
		if c.Workload != OverloadWorkload {
			c.Moonshot = moonshot(rows, c.Arms)
			continue
		}
		c.Tenants = tenantMedians(c.Arms)
		fc, pre := validArm(rows, c.Arms, FlowPolicy), validArm(rows, c.Arms, PrefixPolicy)
		p95 := func(m *report.Mode) float64 { return m.TTFT.P95 }
		switch c.Level {
		case "light":
			f := &FlowCheck{Level: c.Level}
			if fc != nil && pre != nil {
				f.LightP95 = pairedRatio(fc, pre, p95)
				for _, t := range pre.Mode.Tenants {
					f.LightTenantP95 = append(f.LightTenantP95, TenantRatio{t.Name, pairedRatio(fc, pre, tenantP95(t.Name))})
				}
			}
			c.FlowControl = f
		case OverloadLevel:
			f := &FlowCheck{Level: c.Level}
			lrows, larms := sibling("light")
			chat := tenantP95(ChatTenant)
			if fc != nil {
				if l := validArm(lrows, larms, FlowPolicy); l != nil {
					f.ChatMultiple = pairedRatio(fc, l, chat)
				}
				f.ChatInSLO = MeanInterval(roundValues(fc, func(m *report.Mode) (float64, bool) {
					t := tenantOf(m, ChatTenant)
					return shareOf(t), t != nil
				}))
				if pre != nil {
					f.OutputTPS = pairedRatio(fc, pre, func(m *report.Mode) float64 { return m.OutputTPS })
				}
			}
			if pre != nil {
				if l := validArm(lrows, larms, PrefixPolicy); l != nil {
					f.ChatMultiplePrefix = pairedRatio(pre, l, chat)
				}
			}
			if i := slices.IndexFunc(c.Arms, func(a Arm) bool { return a.Policy == FlowPolicy && a.Mode != nil }); i >= 0 {
				n := armFailed(&c.Arms[i])
				f.Failed = &n
			}
			c.FlowControl = f
		case FairLevel:
			f := &FlowCheck{Level: c.Level}
			arows, aarms := sibling(FairAloneLevel)
			light := tenantP95(FairLightTenant)
			for i, row := range rows {
				if !row.Valid() {
					continue
				}
				var ri *RatioInterval
				if alone := validArm(arows, aarms, row.Policy); alone != nil {
					ri = pairedRatio(&c.Arms[i], alone, light)
				}
				f.FairP95 = append(f.FairP95, PolicyRatio{row.Policy, ri})
			}
			c.FlowControl = f
		case FairSharesLevel:
			f := &FlowCheck{Level: c.Level}
			for i, row := range rows {
				if !row.Valid() {
					continue
				}
				f.Jain = append(f.Jain, PolicyRatio{row.Policy, MeanInterval(roundValues(&c.Arms[i], func(m *report.Mode) (float64, bool) {
					j := jainOf(m, FairLightTenant)
					return deref(j), j != nil
				}))})
			}
			c.FlowControl = f
		}
	}
}

// shareOf is a tenant's in-SLO share (0 for nil).
func shareOf(t *report.Tenant) float64 {
	if t == nil {
		return 0
	}
	return t.GoodputShare
}

// moonshot is the cell's moonshot check, nil without a prefix+fc arm that ran. Its ratios
// need the arm valid (a refused request fails bench's validity check on a workload without
// tenants, so Shed then says why).
func moonshot(rows []Row, arms []Arm) *Moonshot {
	i := slices.IndexFunc(arms, func(a Arm) bool { return a.Policy == FlowPolicy && a.Mode != nil })
	if i < 0 {
		return nil
	}
	m := &Moonshot{}
	for _, x := range roundModes(&arms[i]) {
		if x != nil {
			m.Shed = max(m.Shed, x.Refused+x.Expired)
		}
	}
	fc := validArm(rows, arms, FlowPolicy)
	if fc == nil {
		return m
	}
	if o := validArm(rows, arms, OraclePolicy); o != nil {
		m.P95Oracle = pairedP95Ratio(fc, o)
	}
	if p := validArm(rows, arms, PrefixPolicy); p != nil {
		m.P99Prefix = pairedRatio(fc, p, func(x *report.Mode) float64 { return x.TTFT.P99 })
	}
	return m
}
