package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartRefusesBadValues: values that would start pods prefixlb refuses, that would be
// silently overridden or ignored, fail the render with a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"no model servers", nil, "set modelServers.podLabels"},
		{"pod labels and a Service", []string{"modelServers.podLabels.app=vllm", "modelServers.service=vllm"}, "not both"},
		{"config.peering", []string{"modelServers.service=vllm", "config.peering.listen=:7946"}, "config.peering is set by the chart: use the value peering"},
		{"config.backends", []string{"modelServers.service=vllm", "config.backends[0].url=http://a:8000"}, "config.backends is set by the chart: use the value backends"},
		{"config.admin_listen", []string{"modelServers.service=vllm", "config.admin_listen=127.0.0.1:9090"}, "use the value ports.admin"},
		{"config.timeouts.shutdown_grace", []string{"modelServers.service=vllm", "config.timeouts.shutdown_grace=10s"}, "use the value shutdownGraceSeconds"},
		{"namespace with pod labels", []string{"modelServers.podLabels.app=vllm", "modelServers.namespace=gpu"}, "only with modelServers.service"},
		{"simulator beside model servers", []string{"simulator.enabled=true", "modelServers.service=vllm"}, "leave modelServers and backends unset"},
		// values.schema.json: a misspelt key would otherwise be ignored (here: the chart would
		// generate a Secret instead of mounting the user's).
		{"misspelt key", []string{"modelServers.service=vllm", "peering.existingsecret=mine"}, "additional properties 'existingsecret' not allowed"},
		{"unknown top-level key", []string{"modelServer.podLabels.app=vllm"}, "additional properties 'modelServer' not allowed"},
		{"port out of range", []string{"modelServers.service=vllm", "modelServers.port=80000"}, "maximum"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rel := release{name: "prefixlb", namespace: "llm", set: c.set}
			out, err := runHelm(t, append([]string{"template"}, rel.args()...)...)
			if err == nil {
				t.Fatalf("rendered:\n%s", out)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// TestChartDashboard: with dashboard.enabled the chart renders the Grafana dashboard ConfigMap
// from files/prefixlb-dashboard.json, which must be deploy/grafana/prefixlb.json's copy
// (helm reads no file outside the chart); without the file, the render fails saying so.
func TestChartDashboard(t *testing.T) {
	src, srcErr := os.ReadFile("grafana/prefixlb.json")
	cp, cpErr := os.ReadFile(filepath.Join(chartDir, "files/prefixlb-dashboard.json"))
	rel := release{name: "prefixlb", namespace: "llm", set: []string{"modelServers.service=vllm", "dashboard.enabled=true"}}
	switch {
	case errors.Is(srcErr, fs.ErrNotExist) && errors.Is(cpErr, fs.ErrNotExist):
		_, err := runHelm(t, append([]string{"template"}, rel.args()...)...)
		if err == nil || !strings.Contains(err.Error(), "files/prefixlb-dashboard.json") {
			t.Errorf("dashboard.enabled without a dashboard: %v; want a failed render naming files/prefixlb-dashboard.json", err)
		}
		return
	case srcErr != nil || cpErr != nil:
		t.Fatalf("deploy/grafana/prefixlb.json: %v; the chart's copy: %v (both or neither)", srcErr, cpErr)
	case !bytes.Equal(src, cp):
		t.Fatalf("%s/files/prefixlb-dashboard.json differs from deploy/grafana/prefixlb.json: copy it", chartDir)
	}
	out, err := runHelm(t, append([]string{"template"}, rel.args()...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRendered(t, out)
	cm, ok := r.configMaps["prefixlb-dashboard"]
	if !ok {
		t.Fatal("no ConfigMap prefixlb-dashboard")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels %v: Grafana's sidecar loads ConfigMaps labelled grafana_dashboard", cm.Labels)
	}
	var a, b any
	if err := json.Unmarshal([]byte(cm.Data["prefixlb.json"]), &a); err != nil {
		t.Fatalf("the dashboard ConfigMap's JSON: %v", err)
	}
	_ = json.Unmarshal(src, &b)
	if ja, _ := json.Marshal(a); !bytes.Equal(ja, mustJSON(t, b)) {
		t.Error("the dashboard ConfigMap's JSON is not deploy/grafana/prefixlb.json")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
