package index

import (
	"testing"

	"github.com/prefixlb/prefixlb/router/key"
)

// Options left at zero take the package's defaults (configs writes the same numbers into a
// loaded config, see configs.TestDefaultsAgreeWithPackages); set ones are kept, and a
// negative MaxEntries is no cap.
func TestZeroOptionsTakeDefaults(t *testing.T) {
	cases := []struct {
		name                string
		o                   Options
		chunkTokens, kv, mx int64
	}{
		{"zero", Options{}, key.DefaultChunkTokens, DefaultKVCacheTokens, DefaultMaxEntries},
		{"set", Options{ChunkTokens: 16, DefaultKVCacheTokens: 1000, MaxEntries: 10}, 16, 1000, 10},
		{"no cap", Options{MaxEntries: -1}, key.DefaultChunkTokens, DefaultKVCacheTokens, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := New(c.o)
			if x.chunkTokens != c.chunkTokens || x.defaultKV != c.kv || x.maxEntries != c.mx {
				t.Errorf("New(%+v): chunk tokens %d, default KV %d, max entries %d; want %d, %d, %d",
					c.o, x.chunkTokens, x.defaultKV, x.maxEntries, c.chunkTokens, c.kv, c.mx)
			}
		})
	}
}
