package key

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Prompt kinds, mixed into the seed so that different renderings never share a chunk hash.
const (
	kindChat = 'c' // chat messages and Responses API input: the framed rendering in render.go
	kindText = 'p' // completions text prompt: its raw UTF-8 bytes
	kindIDs  = 'i' // completions token-id prompt: one little-endian uint32 per id
)

// seedDomain versions the key format: change it whenever the rendering or chaining changes, so
// that keys from different prefixlb versions (e.g. during a rolling upgrade with a shared or
// persisted index) never match by accident.
const seedDomain = "prefixlb/key/v2"

// chunker cuts a byte stream into chunks and appends one chained hash per full chunk to
// k.Chunks: h_i = xxhash64(seed ‖ h_{i-1} ‖ chunk_i), h_{-1} = 0, the two uint64s
// little-endian. It hashes as bytes arrive and never buffers the stream.
//
// The first chunk is a quarter of the others (16 tokens at the default 64): a conversation
// whose first turn is a short question (most MT-Bench and chatbot first turns are under 64
// tokens) still leaves a chunk in the index, so its second turn finds the replica that holds
// the first instead of being placed cold elsewhere.
type chunker struct {
	d    xxhash.Digest
	seed uint64
	prev uint64
	size int // chunk size in bytes
	rem  int // bytes still missing from the current chunk
	n    int // total bytes written since start
	k    *Key
	hdr  [16]byte
}

func (c *chunker) start(size int, seed uint64, k *Key) {
	c.size, c.seed, c.prev, c.n, c.k = size, seed, 0, 0, k
	c.begin()
}

func (c *chunker) begin() {
	binary.LittleEndian.PutUint64(c.hdr[0:8], c.seed)
	binary.LittleEndian.PutUint64(c.hdr[8:16], c.prev)
	c.d.Reset()
	_, _ = c.d.Write(c.hdr[:])
	c.rem = c.size
	if len(c.k.Chunks) == 0 {
		c.rem = firstChunkBytes(c.size)
	}
}

// firstChunkBytes is the size of the first chunk for chunks of size bytes: a quarter, at
// least 4 bytes (one approximate token or one token id), and a multiple of 4.
func firstChunkBytes(size int) int {
	return max(size/4/4*4, 4)
}

// ChunkCount is how many full chunks a rendering of n bytes has with chunks of size bytes.
func ChunkCount(n, size int) int {
	f := firstChunkBytes(size)
	if n < f {
		return 0
	}
	return 1 + (n-f)/size
}

func (c *chunker) write(p []byte) {
	c.n += len(p)
	for len(p) >= c.rem {
		_, _ = c.d.Write(p[:c.rem])
		p = p[c.rem:]
		c.prev = c.d.Sum64()
		c.k.Chunks = append(c.k.Chunks, c.prev)
		c.begin()
	}
	_, _ = c.d.Write(p)
	c.rem -= len(p)
}
