package configs

import (
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestSettleWaitOption: absent takes peering's default (0 to peering.Options), 0 turns
// settling off (negative there), a duration is passed on.
func TestSettleWaitOption(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"listen: ':7946'\n", 0},
		{"settle_wait: 0s\n", -1},
		{"settle_wait: 5ms\n", 5 * time.Millisecond},
	} {
		var p Peering
		if err := yaml.Unmarshal([]byte(tc.yaml), &p); err != nil {
			t.Fatal(err)
		}
		if got := p.SettleWaitOption(); got != tc.want {
			t.Errorf("%q: SettleWaitOption %v, want %v", tc.yaml, got, tc.want)
		}
	}
}
