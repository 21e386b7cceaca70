package proxy

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var modelLabelRe = regexp.MustCompile(`^prefixlb_model_[a-z_]+\{model="((?:[^"\\]|\\.)*)"`)

// modelLabels returns the distinct model label values sm's registry exposes.
func modelLabels(t *testing.T, sm *serverMetrics) []string {
	t.Helper()
	var buf bytes.Buffer
	sm.set.WritePrometheus(&buf)
	seen := map[string]bool{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if m := modelLabelRe.FindStringSubmatch(line); m != nil {
			seen[m[1]] = true
		}
	}
	out := make([]string, 0, len(seen))
	for l := range seen {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// A backend listing many models, new ones on every read, neither grows the model label set
// past maxModelLabels (+ "other") nor keeps the series of models no longer served.
func TestModelSeriesBounded(t *testing.T) {
	sm := newServerMetrics("prefix")
	const perRead = 5 * maxModelLabels
	for read := range 4 {
		served := make([]string, perRead)
		for i := range served {
			served[i] = fmt.Sprintf("read%d-model%04d", read, i)
		}
		sm.setModels(served)
		for _, id := range served {
			f := &flow{bytes: 1}
			f.k.Model = []byte(id)
			sm.observeModel(f, 200)
			sm.observeModel(f, 500)
		}
		got := modelLabels(t, sm)
		want := append(slices.Clone(served[:maxModelLabels]), modelLabelOther)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("read %d: %d model labels exposed (%v…), want the first %d served + %q",
				read, len(got), got[:min(len(got), 3)], maxModelLabels, modelLabelOther)
		}
	}
	// The models beyond the label set counted as "other" (never dropped): perRead-64 per read.
	var buf bytes.Buffer
	sm.set.WritePrometheus(&buf)
	want := fmt.Sprintf(`prefixlb_model_requests_total{model="other",status="200"} %d`, 4*(perRead-maxModelLabels))
	if !strings.Contains(buf.String(), want) {
		t.Errorf("missing %q", want)
	}
}

// A model that is served again after being dropped gets its series back, from zero.
func TestModelSeriesReServed(t *testing.T) {
	sm := newServerMetrics("prefix")
	f := &flow{}
	f.k.Model = []byte("a")
	sm.setModels([]string{"a"})
	sm.observeModel(f, 200)
	sm.setModels([]string{"b"})
	sm.observeModel(f, 200) // now "other"
	sm.setModels([]string{"a", "b"})
	sm.observeModel(f, 200)
	var buf bytes.Buffer
	sm.set.WritePrometheus(&buf)
	for _, want := range []string{`prefixlb_model_requests_total{model="a",status="200"} 1`, `prefixlb_model_requests_total{model="other",status="200"} 1`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %q in\n%s", want, buf.String())
		}
	}
}

// Label values are written as the Prometheus text format reads them: \\, \" and \n escaped,
// everything else raw UTF-8 (invalid bytes as U+FFFD), not Go's %q (\t, \x.., \u....).
func TestLabelValueEscaping(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain/model-1", `"plain/model-1"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"line\nbreak", `"line\nbreak"`},
		{"tab\there", "\"tab\there\""},
		{"ünïcode 模型", `"ünïcode 模型"`},
		{"bad\xffutf8", "\"bad\uFFFDutf8\""},
		{"\x00ctl\x7f", "\"\x00ctl\x7f\""},
	}
	for _, c := range cases {
		if got := labelValue(c.in); got != c.want {
			t.Errorf("labelValue(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// End to end: the model label and the backend label, as /metrics writes them.
	sm := newServerMetrics("prefix")
	name := "m\"\\\n\té\xff"
	sm.setModels([]string{name})
	f := &flow{}
	f.k.Model = []byte(name)
	sm.observeModel(f, 200)
	bm := sm.forBackend("http://h\t/é")
	bm.promptTokens.Inc()
	var buf bytes.Buffer
	sm.set.WritePrometheus(&buf)
	for _, want := range []string{
		"prefixlb_model_requests_total{model=\"m\\\"\\\\\\n\té\uFFFD\",status=\"200\"} 1",
		"prefixlb_backend_prompt_tokens_total{backend=\"http://h\t/é\"} 1",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %q in\n%s", want, buf.String())
		}
	}
}

func TestServedSummary(t *testing.T) {
	many := make([]string, maxServedEcho+7)
	for i := range many {
		many[i] = fmt.Sprintf("m%02d", i)
	}
	cases := []struct {
		served []string
		want   string
	}{
		{nil, ""},
		{[]string{"a", "b"}, "a, b"},
		{many[:maxServedEcho], strings.Join(many[:maxServedEcho], ", ")},
		{many, strings.Join(many[:maxServedEcho], ", ") + " and 7 more (GET /v1/models lists them)"},
	}
	for _, c := range cases {
		if got := servedSummary(c.served); got != c.want {
			t.Errorf("servedSummary(%d models) = %q, want %q", len(c.served), got, c.want)
		}
	}
}
