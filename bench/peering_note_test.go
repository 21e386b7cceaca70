package bench

import (
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/peering"
)

// TestRouterReplicasNote: the report's note says the replicas shared one index only for a
// peered prefix arm, and that the other modes' replicas did not.
func TestRouterReplicasNote(t *testing.T) {
	for _, tc := range []struct {
		name    string
		peered  bool
		modes   []string
		want    []string
		wantNot []string
	}{
		{"unpeered", false, []string{"prefix", "round-robin"}, []string{"3 independent", "its own index"}, []string{"peered"}},
		{"peered prefix only", true, []string{"prefix"}, []string{"prefix×3+peer", "peered over 127.0.0.1", peering.DefaultFlushInterval.String()}, []string{"independent", "own index"}},
		{"peered with other modes", true, []string{"round-robin", "prefix"}, []string{"prefix×3+peer", "other modes' arms ran 3 independent"}, nil},
		{"peering asked, no prefix arm", true, []string{"round-robin"}, []string{"3 independent"}, []string{"peered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := routerReplicasNote(3, tc.peered, tc.modes)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("note %q lacks %q", got, w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(got, w) {
					t.Errorf("note %q says %q", got, w)
				}
			}
		})
	}
}
