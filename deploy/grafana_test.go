package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	grafana "github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/prometheus/prometheus/promql/parser"
)

// dashboardPath is the Grafana dashboard (the Helm chart ships it as a ConfigMap).
const dashboardPath = "grafana/prefixlb.json"

// The dashboard's JSON model, the fields the checks read.
type (
	dashboard struct {
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []variable `json:"list"`
		} `json:"templating"`
	}
	panel struct {
		ID         int         `json:"id"`
		Type       string      `json:"type"`
		Title      string      `json:"title"`
		GridPos    *gridPos    `json:"gridPos"`
		Datasource *datasource `json:"datasource"`
		Targets    []struct {
			RefID      string      `json:"refId"`
			Expr       string      `json:"expr"`
			Datasource *datasource `json:"datasource"`
		} `json:"targets"`
		Panels []panel `json:"panels"` // a collapsed row's
	}
	gridPos    struct{ H, W, X, Y int }
	datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	variable struct {
		Type       string          `json:"type"`
		Name       string          `json:"name"`
		Query      json.RawMessage `json:"query"`
		Definition string          `json:"definition"`
		Datasource *datasource     `json:"datasource"`
	}
)

// scrapeLabels are the labels Prometheus adds to every series it scrapes (the target's, and
// those a Kubernetes ServiceMonitor adds), which prefixlb's own /metrics does not carry.
var scrapeLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// grafanaVars stand in for Grafana's variables so that a query parses as Prometheus receives
// it ($job, $model and $backend appear only inside label-matcher strings).
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__range", "6h", "$__interval", "30s")

// panelTypes are the panel plugins the dashboard uses (Grafana's own, in 10 and later).
var panelTypes = []string{"row", "timeseries", "stat", "state-timeline"}

// loadDashboard reads the dashboard, checking it against Grafana's dashboard schema first:
// the Grafana Foundation SDK's strict decoding (generated from Grafana's schemas) refuses
// unknown fields, missing required ones and wrong types in the dashboard, its variables, its
// panels' options and field config, and its Prometheus queries.
func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	plugins.RegisterDefaultPlugins()
	var strict grafana.Dashboard
	if err := strict.UnmarshalJSONStrict(b); err != nil {
		if errs, ok := err.(cog.BuildErrors); !ok || len(errs) > 0 {
			t.Errorf("%s does not decode as a Grafana dashboard:\n%v", dashboardPath, err)
		}
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

// queries are every panel target's and every query variable's expression; they also check
// the panels' structure: unique ids, a grid position inside the 24-column grid that overlaps
// no other panel, and for each panel that is not a row, the ${datasource} Prometheus data
// source on the panel and each of its targets, and targets with distinct refIds.
func (d dashboard) queries(t *testing.T) []query {
	t.Helper()
	var qs []query
	ids := map[int]string{}
	var placed []panel
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if p.ID <= 0 || ids[p.ID] != "" {
				t.Errorf("%s: id not positive or not unique (also %s)", where, ids[p.ID])
			}
			ids[p.ID] = where
			if g := p.GridPos; g == nil || g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v outside the 24-column grid", where, g)
			} else {
				for _, o := range placed {
					og := o.GridPos
					if g.X < og.X+og.W && og.X < g.X+g.W && g.Y < og.Y+og.H && og.Y < g.Y+g.H {
						t.Errorf("%s overlaps panel %d %q", where, o.ID, o.Title)
					}
				}
				placed = append(placed, p)
			}
			if !slices.Contains(panelTypes, p.Type) {
				t.Errorf("%s: panel type %q, not one of %v", where, p.Type, panelTypes)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Title == "" || !isPromDatasource(p.Datasource) || len(p.Targets) == 0 {
				t.Errorf("%s: want a title, the ${datasource} Prometheus data source and targets", where)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] || !isPromDatasource(tg.Datasource) || strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s target %q: want a unique refId, the ${datasource} data source and an expr", where, tg.RefID)
				}
				refs[tg.RefID] = true
				qs = append(qs, query{where + " target " + tg.RefID, tg.Expr})
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil || q.Query != v.Definition || !isPromDatasource(v.Datasource) {
			t.Errorf("variable %s: query %s, definition %q, data source %+v: want the definition as the query, on ${datasource}", v.Name, v.Query, v.Definition, v.Datasource)
		}
		// label_values(SELECTOR, LABEL): the selector is a query; the label must be on it.
		inner, ok := strings.CutPrefix(v.Definition, "label_values(")
		i := strings.LastIndexByte(inner, ',')
		if !ok || i < 0 || !strings.HasSuffix(inner, ")") {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		label := strings.TrimSpace(strings.TrimSuffix(inner[i+1:], ")"))
		qs = append(qs, query{"variable " + v.Name, "count by (" + label + ") (" + inner[:i] + ")"})
	}
	return qs
}

func isPromDatasource(d *datasource) bool {
	return d != nil && d.Type == "prometheus" && d.UID == "${datasource}"
}

// checkQuery parses q as Prometheus does and checks it against what prefixlb exports: every
// metric it selects is a sample name on /metrics (a histogram's _bucket, _sum or _count
// included); its label matchers and grouping labels are labels those samples carry (or
// Prometheus adds, or label_replace makes); histogram_quantile reads only le-bucketed
// histograms grouped by le (prefixlb's VictoriaMetrics vmrange histograms would give no
// quantile in Prometheus). It returns the metric names it selects.
func checkQuery(t *testing.T, e exported, q query) []string {
	t.Helper()
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(q.expr))
	if err != nil {
		t.Errorf("%s: %q does not parse as PromQL: %v", q.where, q.expr, err)
		return nil
	}
	var names []string
	known := slices.Clone(scrapeLabels)
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				t.Errorf("%s: a selector without a metric name: %s", q.where, n)
				return nil
			}
			names = append(names, n.Name)
			labels, ok := e[n.Name]
			if !ok {
				t.Errorf("%s: metric %s is not exported by prefixlb", q.where, n.Name)
				return nil
			}
			for l := range labels {
				known = append(known, l)
			}
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" && !labels[m.Name] && !slices.Contains(scrapeLabels, m.Name) {
					t.Errorf("%s: %s has no label %s", q.where, n.Name, m.Name)
				}
			}
		case *parser.Call:
			if n.Func.Name == "label_replace" && len(n.Args) > 1 {
				if s, ok := n.Args[1].(*parser.StringLiteral); ok {
					known = append(known, s.Val)
				}
			}
		}
		return nil
	})
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				if !slices.Contains(known, l) {
					t.Errorf("%s: grouped by %s, a label none of its metrics carries", q.where, l)
				}
			}
		case *parser.Call:
			if n.Func.Name != "histogram_quantile" {
				return nil
			}
			byLE := false
			parser.Inspect(n.Args[1], func(m parser.Node, _ []parser.Node) error {
				switch m := m.(type) {
				case *parser.AggregateExpr:
					byLE = byLE || (!m.Without && slices.Contains(m.Grouping, "le"))
				case *parser.VectorSelector:
					if !strings.HasSuffix(m.Name, "_bucket") || !e[m.Name]["le"] {
						t.Errorf("%s: histogram_quantile over %s, which has no le buckets", q.where, m.Name)
					}
				}
				return nil
			})
			if !byLE {
				t.Errorf("%s: histogram_quantile without grouping by le", q.where)
			}
		}
		return nil
	})
	return names
}

// TestDashboard: deploy/grafana/prefixlb.json is a Grafana dashboard whose every panel and
// variable query parses as PromQL and names only metrics and labels that prefixlb exports (read
// from the /metrics of running replicas: peered, shadowed, after traffic), on a ${datasource}
// Prometheus variable, with $job, $model and $backend variables; and it shows what the issue
// asks of it: errors, TTFT by model, routing reasons, cached tokens predicted and reported,
// backend load and health, peering health, the body budget and the savings.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want a uid, a title and a Grafana 10+ schema (≥ 36)", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("variable datasource: type %q query %s, want a Prometheus data source variable", v.Type, v.Query)
	}
	for _, name := range []string{"job", "model", "backend"} {
		if vars[name].Type != "query" {
			t.Errorf("no query variable %s", name)
		}
	}

	e := exportedMetrics(t)
	qs := d.queries(t)
	used := map[string]bool{}
	for _, q := range qs {
		for _, n := range checkQuery(t, e, q) {
			used[n] = true
		}
		for _, v := range []string{"job", "model", "backend"} {
			if strings.Contains(q.expr, "$"+v) && !strings.Contains(q.expr, `=~"$`+v+`"`) {
				t.Errorf("%s: $%s outside a regex matcher (a multi-value variable)", q.where, v)
			}
		}
	}
	if len(qs) < 30 {
		t.Errorf("%d queries: the dashboard lost its panels", len(qs))
	}
	for _, want := range []string{
		"prefixlb_requests_total", "prefixlb_stream_errors_total", "prefixlb_model_ttft_seconds_bucket",
		"prefixlb_backend_cached_tokens_total", "prefixlb_backend_predicted_cached_tokens_total",
		"prefixlb_backend_inflight", "prefixlb_backend_prefill_tokens", "prefixlb_backend_healthy",
		"prefixlb_peers_alive", "prefixlb_peer_send_errors_total", "prefixlb_peer_packets_rejected_total", "prefixlb_peer_streams_dropped_total",
		"prefixlb_buffered_request_body_bytes", "prefixlb_request_body_budget_exhausted_total",
		"prefixlb_routing_seconds_total", "prefixlb_prefill_saved_seconds_total", "prefixlb_shadow_prefill_saved_seconds_total",
	} {
		if !used[want] {
			t.Errorf("no panel queries %s", want)
		}
	}
}
