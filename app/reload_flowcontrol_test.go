package app

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// flow_control is reloadable: a reload that changes it is applied without a restart warning;
// one with an API key pasted where its hash goes is rejected naming the field, the key appears
// in no log line, and the previous config keeps serving.
func TestReloadFlowControl(t *testing.T) {
	const key = "sk-live-pasted-by-mistake-0123456789abcdefghijklmnopqrstuvwxyzAB" // 64 characters
	be, _ := testutil.StatusBackend(t, 200, "ok")
	f := newReloadFile(t)
	f.write(reloadConf(be.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 20 * time.Millisecond})

	f.write(reloadConf(be.URL) + "flow_control:\n  enabled: true\n  max_queued: 10\n  rules:\n    - {model: batch, priority: -1}\n")
	testutil.Eventually(t, testutil.Timeout, "the flow_control reload", func() bool {
		return logs.Count(func(e testutil.LogEntry) bool { return e.Message == "config reloaded" }) > 0
	})
	if n := logs.Count(func(e testutil.LogEntry) bool { return strings.Contains(e.Message, "restart") }); n > 0 {
		t.Errorf("a flow_control reload logged %d restart warnings:\n%s", n, logs.Text())
	}

	f.write(reloadConf(be.URL) + "flow_control:\n  rules:\n    - api_key_sha256: " + key + "\n      priority: 5\n")
	testutil.Eventually(t, testutil.Timeout, "the pasted key's rejection", func() bool {
		return reloadRejected(logs, "file changed", "flow_control.rules[0].api_key_sha256") > 0
	})
	if strings.Contains(logs.Text(), key) || strings.Contains(logs.Text(), "sk-live") {
		t.Errorf("the key reached the log:\n%s", logs.Text())
	}
	if status := testutil.PostJSON(t, h.base+"/v1/completions", `{"model":"m","prompt":"x"}`); status != 200 {
		t.Errorf("after the rejected reload: status %d", status)
	}
}
