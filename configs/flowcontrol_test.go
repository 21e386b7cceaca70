package configs

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/proxy"
)

const fcBackend = "backends:\n  - url: http://a:8000\n"

// The section's defaults follow the body limits: max_queued_bytes is 64 MiB, raised to a
// larger max_request_body_bytes and lowered to half a smaller body budget, so that a config
// that leaves it out is always valid.
func TestFlowControlQueuedBytesDefault(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want int64
	}{
		{"", 64 << 20},
		{"max_request_body_bytes: 134217728\n", 128 << 20},
		{"max_request_body_bytes: 8388608\nlimits:\n  max_buffered_body_bytes: 33554432\n", 16 << 20},
		{"max_request_body_bytes: 16777216\nlimits:\n  max_buffered_body_bytes: 33554432\n", 16 << 20},
		{"flow_control:\n  max_queued_bytes: 1048576\nmax_request_body_bytes: 1048576\n", 1 << 20},
	} {
		c, err := Parse([]byte(tc.yaml + fcBackend))
		if err != nil {
			t.Errorf("%q: %v", tc.yaml, err)
			continue
		}
		if got := c.FlowControl.MaxQueuedBytes; got != tc.want {
			t.Errorf("%q: max_queued_bytes %d, want %d", tc.yaml, got, tc.want)
		}
	}
}

// Every wrong value is an error naming its field; none quotes an api_key_sha256 value.
func TestFlowControlErrors(t *testing.T) {
	const rawKey = "sk-proj-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST" // 64 characters
	for _, tc := range []struct{ yaml, want string }{
		{"  max_queue_wait: -1s\n", "flow_control.max_queue_wait: -1s is outside 0..1h0m0s"},
		{"  max_queue_wait: 2h\n", "flow_control.max_queue_wait: 2h0m0s is outside"},
		{"  max_queue_wait: soon\n", "flow_control.max_queue_wait: line 2:"},
		{"  max_queued: -1\n", "flow_control.max_queued: -1 is outside 1..1048576"},
		{"  max_queued_bytes: 1073741824\n", "flow_control.max_queued_bytes: 1073741824 is over half of limits.max_buffered_body_bytes (1073741824 / 2)"},
		{"  max_queued_bytes: 1048576\n", "flow_control.max_queued_bytes: 1048576 is below max_request_body_bytes (67108864)"},
		{"  max_queued_bytes: -1\n", "flow_control.max_queued_bytes: -1 is below max_request_body_bytes"},
		{"  min_band_share: 0.6\n", "flow_control.min_band_share: 0.6 is outside 0..0.5"},
		{"  min_band_share: -0.1\n", "flow_control.min_band_share: -0.1 is outside"},
		{"  min_band_share: .nan\n", "flow_control.min_band_share: NaN is outside"},
		{"  lifo_after: -1s\n", "flow_control.lifo_after: -1s is outside 0..1h0m0s"},
		{"  burst_credit: -1\n", "flow_control.burst_credit: -1 is outside 0..4294967296"},
		{"  prefill_saturation: 2h\n", "flow_control.prefill_saturation: 2h0m0s is outside 0..1h0m0s"},
		{"  reserve_prefill: -5ms\n", "flow_control.reserve_prefill: -5ms is outside 0..1h0m0s"},
		{"  max_request_work: 0.5\n", "flow_control.max_request_work: line 2: want an integer"},
		{"  max_request_work: -3\n", "flow_control.max_request_work: -3 is outside 1..4294967296"},
		{"  default_priority: 1001\n", "flow_control.default_priority: 1001 is outside -1000..1000"},
		{"  objectives: {critical: 2000}\n", "flow_control.objectives.critical: 2000 is outside"},
		{"  objectives: {critical: high}\n", "flow_control.objectives.critical: line 2: want an integer"},
		{"  objectives: [critical]\n", "flow_control.objectives: line 2: want a mapping, got a list"},
		{"  rules:\n    - {model: m, flow: a}\n    - {api_key_sha256: " + rawKey + ", priority: 1}\n", "flow_control.rules[1].api_key_sha256: not hex digits"},
		{"  rules:\n    - {api_key_sha256: sk-abc, priority: 1}\n", "flow_control.rules[0].api_key_sha256: 6 characters, want the 64 hex digits"},
		{"  rules:\n    - {path: v1/chat/completions, priority: 1}\n", "flow_control.rules[0].path: \"v1/chat/completions\" must start with /"},
		{"  rules:\n    - {model: m, priority: 5000}\n", "flow_control.rules[0].priority: 5000 is outside"},
		{"  rules:\n    - {model: m, flow: two words}\n", "flow_control.rules[0].flow: \"two words\" holds a space"},
		{"  rules:\n    - {model: m}\n", "flow_control.rules[0]: sets neither priority nor flow"},
		{"  rules:\n    - {model: m, key: x, flow: a}\n", "flow_control.rules[0].key: line 3: unknown field"},
		{"  trusted_headers: yes please\n", "flow_control.trusted_headers: line 2: want true or false"},
	} {
		_, err := Parse([]byte("flow_control:\n" + tc.yaml + fcBackend))
		if err == nil || !strings.HasPrefix(strings.TrimPrefix(err.Error(), "config: "), tc.want) {
			t.Errorf("%q: error %v, want one starting %q", tc.yaml, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "sk-") {
			t.Errorf("%q: error %q quotes what may be a key", tc.yaml, err)
		}
	}
}

// A parsed section builds the queue and the classifier it describes: min_band_share 0 is
// strict bands (not the default), rules match by the key's hash.
func TestFlowControlBuilds(t *testing.T) {
	c, err := Parse([]byte(`flow_control:
  enabled: true
  max_queued: 10
  max_queued_bytes: 100000000
  min_band_share: 0
  max_request_work: 1000
  lifo_after: 0
  burst_credit: 0
  prefill_saturation: 0
  reserve_prefill: 0
  default_priority: -1
  objectives: {critical: 9}
  trusted_headers: true
  rules:
    - api_key_sha256: ` + strings.ToUpper(flowcontrol.HashKey("sk-chat")) + `
      priority: 5
    - model: batch
      path: /v1/completions
      flow: batch
` + fcBackend))
	if err != nil {
		t.Fatal(err)
	}
	q, err := flowcontrol.New(c.FlowControl.QueueConfig())
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Config(); got.MaxItems != 10 || got.MaxBytes != 100000000 || got.MinBandShare != 0 || got.MaxRequestWork != 1000 {
		t.Errorf("queue config %+v", got)
	}
	if got := q.Config().LIFOAfter; got >= 0 {
		t.Errorf("lifo_after 0 reaches the queue as %v, want negative (arrival order always)", got)
	}
	if got := q.Config().BurstCredit; got != 0 {
		t.Errorf("burst_credit 0 reaches the queue as %v, want 0 (none)", got)
	}
	if got := c.FlowControl.PrefillSaturationOption(); got >= 0 {
		t.Errorf("prefill_saturation 0 reaches the proxy as %v, want negative (the rule off)", got)
	}
	if got := c.FlowControl.ReservePrefillOption(); got >= 0 {
		t.Errorf("reserve_prefill 0 reaches the proxy as %v, want negative (the rule off)", got)
	}
	d, _ := Parse([]byte(fcBackend))
	if d.FlowControl.QueueConfig().MinBandShare != flowcontrol.DefaultMinBandShare {
		t.Errorf("default min_band_share reaches the queue as %g", d.FlowControl.QueueConfig().MinBandShare)
	}
	if got := d.FlowControl.QueueConfig().LIFOAfter; got != flowcontrol.DefaultLIFOAfter {
		t.Errorf("default lifo_after reaches the queue as %v", got)
	}
	if got := d.FlowControl.QueueConfig().BurstCredit; got != flowcontrol.DefaultBurstCredit {
		t.Errorf("default burst_credit reaches the queue as %v", got)
	}
	if got := d.FlowControl.PrefillSaturationOption(); got != proxy.DefaultPrefillSaturation {
		t.Errorf("default prefill_saturation reaches the proxy as %v", got)
	}
	if got := d.FlowControl.ReservePrefillOption(); got != proxy.DefaultReservePrefill {
		t.Errorf("default reserve_prefill reaches the proxy as %v", got)
	}
	if e, err := Parse([]byte("flow_control:\n  lifo_after: 3s\n  burst_credit: 65536\n  prefill_saturation: 500ms\n" + fcBackend)); err != nil ||
		e.FlowControl.QueueConfig().LIFOAfter != 3*time.Second || e.FlowControl.QueueConfig().BurstCredit != 65536 ||
		e.FlowControl.PrefillSaturationOption() != 500*time.Millisecond {
		t.Errorf("lifo_after 3s, burst_credit 65536, prefill_saturation 500ms: %v", err)
	}
	cl, err := flowcontrol.NewClassifier(c.FlowControl.ClassifierConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{"Authorization": "Bearer sk-chat", "X-Llm-D-Inference-Objective": "critical"}
	for _, tc := range []struct {
		req  flowcontrol.Request
		prio int
		flow string
	}{
		// The key's rule matches first and alone: it sets no flow, so the flow is the key's.
		{flowcontrol.Request{Path: "/v1/completions", Model: "batch", Headers: getter(h)}, 5, "key:" + flowcontrol.HashKey("sk-chat")[:16]},
		{flowcontrol.Request{Path: "/v1/completions", Model: "batch"}, -1, "rule:batch"},
		{flowcontrol.Request{Path: "/v1/chat/completions", Headers: getter{"X-Llm-D-Inference-Objective": "critical"}}, 9, flowcontrol.AnonymousFlow},
	} {
		if got := cl.Classify(tc.req); got.Priority != tc.prio || got.Flow != tc.flow {
			t.Errorf("%+v: %+v, want priority %d flow %s", tc.req, got, tc.prio, tc.flow)
		}
	}
}

type getter map[string]string

func (g getter) Get(name string) string { return g[name] }
