package peers

import (
	"fmt"
	"io"
	"testing"

	"github.com/prefixlb/prefixlb/router"
)

// TestPreviewRecordsNothing: each peer policy's Preview is the decision its next Pick makes
// and moves nothing (the tie-break's rotation, the running mean): with previews between the
// requests they go where they go without any.
func TestPreviewRecordsNothing(t *testing.T) {
	for _, name := range Names() {
		if NeedsKVEvents(name) {
			continue // needs replicas: TestDynamoKV
		}
		t.Run(name, func(t *testing.T) {
			run := func(previews int) []string {
				p, err := New(name, Options{})
				if err != nil {
					t.Fatal(err)
				}
				if c, ok := p.(io.Closer); ok {
					t.Cleanup(func() { _ = c.Close() })
				}
				bs := testBackends(t, 3)
				if s, ok := p.(router.Fleet); ok {
					s.SetBackends(bs)
				}
				var out []string
				for i := range 9 {
					k := keyOf(chain(fmt.Sprint("prompt ", i%4), 4+i))
					for range previews {
						if d, pick := p.Preview(k, bs), p.Preview(k, bs); d != pick {
							t.Fatalf("request %d: two previews differ: %s, %s", i, d.Backend.Name, pick.Backend.Name)
						}
					}
					var preview router.Decision
					if previews > 0 {
						preview = p.Preview(k, bs)
					}
					d := p.Pick(k, bs)
					if previews > 0 && preview != d {
						t.Errorf("request %d: preview %s (%v), the pick after it %s (%v)", i, preview.Backend.Name, preview, d.Backend.Name, d)
					}
					if l, ok := p.(router.Learner); ok {
						l.Learn(k, d.Backend, d.MatchedChunks)
					}
					out = append(out, d.Backend.Name)
				}
				return out
			}
			want, got := run(0), run(2)
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("request %d went to %s with previews, %s without", i, got[i], want[i])
				}
			}
		})
	}
}
