package key

import (
	"math/bits"

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
// persisted index) never match by accident. v3: chunks are hashed on their own and chained by
// a hash of (seed, previous, chunk hash), instead of one hash over seed ‖ previous ‖ chunk.
// v4: chunks past FineChunks are CoarseFactor times larger, and bit 0 of a hash marks them.
// v5: v4's first chunk (a quarter of the others) is cut in two, a sixteenth and the rest
// (4 + 12 tokens at the default size): HeadChunks.
const seedDomain = "prefixlb/key/v5"

// Deep chunks are coarse. A coding agent's 1 MB request would be ~3,500 chunks at the
// default size, and the index's work per request grows with the chunk count; it dominates the
// routing decision at 1 MB. Where the prompt diverges from others is what routing needs to
// resolve finely, and that is near its start; past FineChunks chunks (32 KiB of rendering, 8k
// tokens, at the default size) a chunk of CoarseFactor × ChunkTokens (512 tokens) loses at
// most that much of a match against prompts at least 16 times longer, and the index does an
// eighth of the work (BenchmarkRoutingDecision in proxy/ at 1 MB; docs/bench.md, "What
// prefixlb costs").
const (
	// FineChunks is how many leading chunks of a key are fine: the HeadChunks smaller ones,
	// then chunks of the configured size.
	FineChunks = 128
	// CoarseFactor is how many configured chunk sizes every later chunk spans.
	CoarseFactor = 8
)

// coarseMark is the bit of a chunk hash that is set for a coarse chunk (past FineChunks) and
// clear for a fine one, so that the index, which sees only hashes, can weigh an entry by the
// KV cache it stands for (IsCoarse).
const coarseMark = 1

// IsCoarse reports whether chunk hash h (an element of Key.Chunks) names a coarse chunk, one
// of CoarseFactor times the configured size.
func IsCoarse(h uint64) bool { return h&coarseMark != 0 }

// ChunkUnits is the size of chunks lo..hi-1 of a key in configured chunk sizes (0 when hi <=
// lo): 1 each for the first FineChunks (the HeadChunks smaller ones counted as one each: an
// index entry costs the same), CoarseFactor each after them.
func ChunkUnits(lo, hi int) int {
	lo = max(lo, 0)
	if hi <= lo {
		return 0
	}
	fine := max(min(hi, FineChunks)-lo, 0)
	coarse := hi - lo - fine
	return fine + coarse*CoarseFactor
}

// maxPartBytes is the largest chunk, in bytes, that the chunker buffers when it arrives in
// pieces; a larger one is hashed as a stream instead, so that a huge configured chunk size
// does not make the pooled buffer huge. 16 KiB covers the coarse chunks of ChunkTokens up to
// 512.
const maxPartBytes = 16 << 10

// chunker cuts a byte stream into chunks and appends one chained hash per full chunk to
// k.Chunks:
//
//	h_i = xxhash64(seed ‖ h_{i-1} ‖ xxhash64(chunk_i)), h_{-1} = 0
//
// the three uint64s little-endian (24 bytes). Hashing each chunk on its own lets a chunk that
// lies within one write be hashed in place by xxhash.Sum64 (assembly on amd64 and arm64), with
// no header to prepend; the chain costs one 24-byte hash. A chunk that straddles writes
// (framing bytes, text around a tag) is gathered in part and hashed when complete, or, past
// maxPartBytes, streamed through an xxhash.Digest; all give the same hash.
//
// The first HeadChunks chunks are smaller (see HeadChunks): a conversation whose first turn
// is a short question (most MT-Bench and chatbot first turns are under 64 tokens) still
// leaves a chunk in the index, so its second turn finds the replica that holds the first
// instead of being placed cold elsewhere. Chunks past FineChunks are CoarseFactor times the
// size, their hashes with coarseMark set; the others' have it clear.
type chunker struct {
	seed    uint64
	prev    uint64 // the hash of the chunks so far (0 before the first)
	size    int    // chunk size in bytes
	curSize int    // size of the current chunk in bytes (the first one is smaller)
	missing int    // bytes still missing from the current chunk
	written int    // total bytes written since start
	out     *Key
	part    []byte        // the current chunk's bytes so far, when curSize <= maxPartBytes
	digest  xxhash.Digest // the current chunk's bytes so far, when curSize > maxPartBytes
}

// start begins a stream whose chunks are size bytes (the HeadChunks first smaller, the
// coarse ones larger: chunkBytes), chained from seed, appended to k.Chunks.
func (c *chunker) start(size int, seed uint64, k *Key) {
	c.size, c.seed, c.prev, c.written, c.out = size, seed, 0, 0, k
	c.part = c.part[:0]
	c.curSize = chunkBytes(0, size)
	c.missing = c.curSize
}

// HeadChunks is how many leading chunks are smaller than the configured size: the first is
// a sixteenth of it (4 tokens at the default 64), the second the rest of a quarter (12), so
// that the two end where v4's first chunk did (16 tokens). A prompt shorter than its first
// chunk has no chunk, so the index learns nothing from it and its follow-up, which the
// replica's KV cache holds, is placed as if cold. With a 16-token first chunk, such threads
// were the gap between prefix mode's cached tokens and the oracle's on OpenAssistant threads
// (`prefixlb bench suite`, its OpenAssistant cells). The first chunk alone is about a role and
// a word of framing, which most chats share ("system", "You are"): the policy routes a
// prompt of fewer than HeadChunks chunks as it routes one of none, and counts a match of the
// first chunk alone as none but for a prompt whose own first turn was that short
// (Key.ShortFirstTurn; router's pickCost); the second keeps what a 16-token prefix told apart.
const HeadChunks = 2

// chunkBytes is the size in bytes of chunk i of a key with chunks of size bytes: a sixteenth
// and the rest of a quarter for the HeadChunks first (rounded down to whole tokens,
// BytesPerToken bytes, the size of one token id too; at least one token each), size up to
// FineChunks, CoarseFactor × size after.
func chunkBytes(i, size int) int {
	switch {
	case i == 0:
		return max(size/16/BytesPerToken*BytesPerToken, BytesPerToken)
	case i == 1:
		return max(size/4/BytesPerToken*BytesPerToken-chunkBytes(0, size), BytesPerToken)
	case i < FineChunks:
		return size
	}
	return size * CoarseFactor
}

// ChunkCount is how many full chunks a rendering of n bytes has with chunks of size bytes
// (and coarse ones of CoarseFactor × size past FineChunks).
func ChunkCount(n, size int) int {
	head := 0 // bytes of the head chunks
	for i := range HeadChunks {
		if head += chunkBytes(i, size); n < head {
			return i
		}
	}
	fine := head + (FineChunks-HeadChunks)*size // bytes of the fine chunks
	if n < fine {
		return HeadChunks + (n-head)/size
	}
	return FineChunks + (n-fine)/(size*CoarseFactor)
}

// PrefixTokens is how many approximate tokens (or token ids) the first n chunks of a key hold
// when it was built with chunks of chunkTokens tokens (chunkTokens as NewBuilder takes it:
// <= 0 is DefaultChunkTokens): the HeadChunks first a sixteenth and the rest of a quarter of
// chunkTokens (at least one token each), every later one chunkTokens up to FineChunks, then
// CoarseFactor × chunkTokens.
// n <= 0 holds none. A key of PromptTokens tokens has
// ChunkCount(PromptTokens×BytesPerToken, chunkTokens×BytesPerToken) chunks, and its chunk i
// ends at token PrefixTokens(i+1, chunkTokens).
func PrefixTokens(n, chunkTokens int) int {
	if n <= 0 {
		return 0
	}
	size := normChunkTokens(chunkTokens) * BytesPerToken
	head := 0
	for i := range min(n, HeadChunks) {
		head += chunkBytes(i, size)
	}
	return (head + ChunkUnits(HeadChunks, n)*size) / BytesPerToken
}

func (c *chunker) write(p []byte) {
	c.written += len(p)
	if c.missing < c.curSize { // the current chunk has begun
		if len(p) < c.missing {
			c.add(p)
			return
		}
		need := c.missing
		c.add(p[:need])
		p = p[need:]
		if c.curSize <= maxPartBytes {
			c.push(xxhash.Sum64(c.part))
			c.part = c.part[:0]
		} else {
			c.push(c.digest.Sum64())
		}
	}
	for len(p) >= c.missing {
		n := c.missing
		c.push(xxhash.Sum64(p[:n]))
		p = p[n:]
	}
	if len(p) > 0 {
		c.add(p)
	}
}

// add appends p (shorter than c.missing) to the current chunk.
func (c *chunker) add(p []byte) {
	if c.curSize <= maxPartBytes {
		c.part = append(c.part, p...)
	} else {
		if c.missing == c.curSize {
			c.digest.Reset()
		}
		_, _ = c.digest.Write(p)
	}
	c.missing -= len(p)
}

// push chains the hash of a completed chunk, records it (coarseMark set past FineChunks,
// clear before) and begins the next chunk.
func (c *chunker) push(h uint64) {
	n := len(c.out.Chunks)
	c.prev = chain(c.seed, c.prev, h) &^ coarseMark
	if n >= FineChunks {
		c.prev |= coarseMark
	}
	c.out.Chunks = append(c.out.Chunks, c.prev)
	c.curSize = chunkBytes(n+1, c.size)
	c.missing = c.curSize
}

// reset drops a part buffer that grew unusually large and the key reference.
func (c *chunker) reset() {
	c.out = nil
	if cap(c.part) > maxPartBytes {
		c.part = nil
	}
}

// XXH64 constants (github.com/Cyan4973/xxHash, as in github.com/cespare/xxhash/v2).
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

// chain is xxhash64 (seed 0) of the 24 bytes seed ‖ prev ‖ h, little-endian: xxhash.Sum64 of
// that buffer, without building it.
func chain(seed, prev, h uint64) uint64 {
	x := prime5 + 24 // under 32 bytes: no stripes, three 8-byte tail words
	x = xxhWord(x, seed)
	x = xxhWord(x, prev)
	x = xxhWord(x, h)
	x ^= x >> 33
	x *= prime2
	x ^= x >> 29
	x *= prime3
	x ^= x >> 32
	return x
}

func xxhWord(h, k uint64) uint64 {
	k *= prime2
	k = bits.RotateLeft64(k, 31) * prime1
	h ^= k
	return bits.RotateLeft64(h, 27)*prime1 + prime4
}
