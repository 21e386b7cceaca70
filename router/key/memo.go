package key

// The prefix memo: a coding agent sends each request of a session as the previous one plus a
// step (an assistant turn, a tool result), so all of a 1 MB body but its last few KB is a byte
// prefix of a body already keyed. Building the key of such a body again is mostly
// unescaping the tool results (the fast path's first pass); the memo skips that prefix
// instead (BenchmarkRoutingDecision in proxy/: body=1MB-agent against body=1MB-agent-full).
//
// After a chat body of at least memoMinBody (256 KiB) is keyed on the fast path, the memo keeps
// what its key's build held after its last message: the chunker's state (chained hash, the
// partial chunk, bytes written), the chunk hashes so far, and the positions of the top-level
// fields. It is filed under the hash of the body's first bytes up to the last multiple of
// memoBlock at or before that message's end (P), and holds the hash of the body up to P.
//
// The next body is hashed once (xxhash, ~70 µs per MB) with its digest noted at every
// multiple of memoBlock; a slot filed under one of those hashes whose prefix hash matches too
// names a P at which this body's first P bytes are those of the remembered one. The build then
// validates, indexes and renders only what follows P: the messages after it, and the
// top-level fields after the messages array. The remembered state rendered the header fields
// (tools, functions, response_format) and the seed (model, cache_salt) too, so it is used
// only when each of those is where it was: in the prefix and not repeated after it, or after
// it (a client that sends "tools" after "messages", as openai-python does) with the same raw
// bytes. Otherwise the body is built in full. Either way its key is bit for bit the full
// build's (TestMemoMatchesFullBuild).
//
// A false match needs two 64-bit hash collisions on the same prefix length. XXH64 is not a
// cryptographic hash: its rounds are invertible, so with a known seed a client can craft a
// body of the same length that agrees with another at every memoBlock prefix hash past an
// edit, and have it keyed as the other (the prefix before the edit then reads as the
// original's). The memo's hashes are therefore seeded with a random 64-bit key drawn per
// Builder from crypto/rand (memo.seed) and never exposed: crafting a collision then needs
// the key, and an accidental one costs one misrouted request, never a wrong answer, as any
// chunk-hash collision. (Seeded XXH64 is a cheap barrier, not a MAC: a forgery crafted for
// seed 0 still collides under about 1 in 100 random seeds, through the carries of its
// lane rounds (TestMemoResistsCraftedCollision), so a client sending many forgeries gets
// one of its own requests keyed as another body now and then — a misrouting of its own
// request, nothing more. The chunk hashes themselves are unseeded, as peers must agree on
// them.)
//
// The slots are direct-mapped (a slot is overwritten by the next checkpoint filed under it);
// each holds a copy of its chunk hashes, so memoSlots × 8 bytes × chunks is the memory: at
// most 32 MiB with 1 MiB bodies at the default chunk size, nothing while bodies are small.

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

const (
	// memoMinBody is the smallest body, in bytes, that the memo serves. Hashing a body for
	// the memo is paid for nothing by a body that extends none keyed before: a large share
	// of a small chat body's build without escapes, under 5% of a 256 KB agent body's
	// (BenchmarkRoutingDecision in proxy/, run with this lowered).
	memoMinBody = 256 << 10
	// memoBlock is the granularity of the prefix hashes, in bytes: a body of n bytes is
	// probed at n/memoBlock positions (256 per MiB).
	memoBlock = 4 << 10
	// memoSlots is the number of remembered bodies. Direct-mapped: with S sessions sending
	// large bodies at once, about S/memoSlots of their requests miss because another
	// session's took their slot (6% at 64 sessions).
	memoSlots = 1024
)

// memo remembers the key state at the end of recently keyed large chat bodies. It is safe
// for concurrent use.
type memo struct {
	seed  uint64 // the secret seed of every memo hash (see the package comment above)
	slots [memoSlots]slot
	hits  atomic.Uint64 // builds that resumed from a checkpoint (for tests)
}

func newMemo() *memo {
	m := new(memo)
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil { // never fails on Linux (getrandom); be safe
		panic("key: no randomness for the memo seed: " + err.Error())
	}
	m.seed = binary.LittleEndian.Uint64(b[:])
	return m
}

// memoSum is the seeded xxhash64 of b. It does not allocate.
func memoSum(seed uint64, b []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(b)
	return d.Sum64()
}

// checkpoint is the state of a build after a body's last message: everything a build of a
// body with the same first end bytes needs to resume there.
type checkpoint struct {
	end    int     // P: the position after the last message's '}'
	key    uint64  // the memo's seed (set by recall; allows hashes with it)
	hash   uint64  // seeded xxhash64 of body[:end]
	top    scanTop // positions (and ends) of the top-level fields; the prompt's unused (chat)
	raw    [topFieldCount]uint64
	seed   uint64
	prev   uint64
	ckSize int
	cur    int
	miss   int
	wrote  int
	part   []byte
	chunks []uint64
	short  bool // Key.ShortFirstTurn
}

type slot struct {
	key atomic.Uint64 // seeded xxhash64 of body[:cp.end/memoBlock*memoBlock]; 0: empty
	mu  sync.Mutex    // guards cp, and writes of key
	cp  checkpoint
}

// memoFields are the top-level fields the remembered state depends on: the seed's, the
// header's, and the messages themselves (a later duplicate replaces them).
var memoFields = [...]topField{topModel, topCacheSalt, topMessages, topTools, topFunctions, topResponseFormat}

// prefixSums hashes body in memoBlock steps: s.sums[j] is xxhash64 (seeded with seed) of
// body[:j*memoBlock] and s.digests[j] the digest there (j ≥ 1; index 0 unused).
func (s *state) prefixSums(seed uint64, body []byte) {
	n := len(body) / memoBlock
	if cap(s.sums) <= n { // sized at once: appending would allocate several times as much
		s.sums, s.digests = make([]uint64, 0, n+1), make([]xxhash.Digest, 0, n+1)
	}
	s.sums = s.sums[:0]
	s.digests = s.digests[:0]
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	s.sums = append(s.sums, 0)
	s.digests = append(s.digests, d)
	for j := 1; j <= n; j++ {
		_, _ = d.Write(body[(j-1)*memoBlock : j*memoBlock])
		s.sums = append(s.sums, d.Sum64())
		s.digests = append(s.digests, d)
	}
}

// recall hashes body's prefixes and looks for the longest one remembered; it sets s.hit (end
// 0 when there is none) and returns the position from which body is not known to be valid
// UTF-8: s.hit.end, or 0.
func (s *state) recall(m *memo, body []byte) int {
	s.hit.end, s.hit.key = 0, m.seed
	s.prefixSums(m.seed, body)
	for j := len(s.sums) - 1; j >= 1; j-- {
		g := s.sums[j]
		sl := &m.slots[g%memoSlots]
		if g == 0 || sl.key.Load() != g {
			continue
		}
		if s.take(sl, g, j, body) {
			return s.hit.end
		}
	}
	return 0
}

// take copies sl's checkpoint into s.hit if it is still filed under g and its prefix is
// body's (body[:end] hashes alike, from the digest at block j).
func (s *state) take(sl *slot, g uint64, j int, body []byte) bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	cp := &sl.cp
	if sl.key.Load() != g || cp.end < j*memoBlock || cp.end >= len(body) {
		return false
	}
	d := s.digests[j]
	_, _ = d.Write(body[j*memoBlock : cp.end])
	if d.Sum64() != cp.hash {
		return false
	}
	h := &s.hit
	h.end, h.hash, h.top, h.raw = cp.end, cp.hash, cp.top, cp.raw
	h.seed, h.prev, h.ckSize, h.cur, h.miss, h.wrote = cp.seed, cp.prev, cp.ckSize, cp.cur, cp.miss, cp.wrote
	h.part = append(h.part[:0], cp.part...)
	h.chunks = append(h.chunks[:0], cp.chunks...)
	h.short = cp.short
	return true
}

// resumeTop fills top from the remembered fields in the prefix, then validates and indexes
// the rest of the body: the messages after P, then the top-level members after the array.
func (s *state) resumeTop(ep API, top *scanTop) bool {
	h := &s.hit
	*top = h.top
	for f := range top.at {
		if top.at[f] >= h.end { // after the prefix in the remembered body: read this body's
			top.at[f], top.end[f] = 0, 0
		}
	}
	top.messagesIndexed = true
	sc := &s.scanner
	clear(sc.messages)
	sc.messages = sc.messages[:0]
	sc.rest = 0
	end := sc.indexMessages(h.end, false)
	return end >= 0 && sc.members(ep, top, end, false)
}

// allows reports whether the remembered state holds for body, whose fields are in top: each
// of memoFields is where it was in the prefix, or after it in both bodies with the same raw
// bytes, or absent from both.
func (h *checkpoint) allows(body []byte, top *scanTop) bool {
	for _, f := range memoFields {
		was, is := h.top.at[f], top.at[f]
		switch {
		case was < h.end: // absent (0), or in the prefix
			if is != was {
				return false
			}
		case is < h.end || memoSum(h.key, body[is:top.end[f]]) != h.raw[f]:
			return false
		}
	}
	return true
}

// restore sets the chunker and k.Chunks to the remembered state, as begin and the rendering
// of the prefix would have.
func (h *checkpoint) restore(s *state, chunkTokens int, k *Key) {
	// h.ckSize is chunkTokens × BytesPerToken: one memo serves one Builder, whose chunk size
	// does not change.
	s.renderer.out = &s.chunker
	c := &s.chunker
	c.start(chunkTokens*BytesPerToken, h.seed, k)
	c.prev, c.curSize, c.missing, c.written = h.prev, h.cur, h.miss, h.wrote
	c.part = append(c.part[:0], h.part...)
	k.Chunks = append(k.Chunks[:0], h.chunks...)
	k.ShortFirstTurn = h.short
}

// remember files the state of a body just keyed on the fast path (s.top, the end of its last
// message, the chunker, k) when it can serve a later body: chat, long enough, its fields in
// place.
func (s *state) remember(m *memo, body []byte, k *Key) {
	end := s.scanner.lastEnd
	c := &s.chunker
	if end == 0 || c.curSize > maxPartBytes || len(s.sums) == 0 {
		return
	}
	j := end / memoBlock
	if j < 1 || j >= len(s.sums) {
		return
	}
	top := &s.top
	var raw [topFieldCount]uint64
	for _, f := range memoFields {
		if v := top.at[f]; v >= end {
			if f == topMessages { // the array ends after its last message: never here
				return
			}
			raw[f] = memoSum(m.seed, body[v:top.end[f]])
		}
	}
	d := s.digests[j]
	_, _ = d.Write(body[j*memoBlock : end])
	g := s.sums[j]
	if g == 0 {
		return
	}
	sl := &m.slots[g%memoSlots]
	sl.mu.Lock()
	defer sl.mu.Unlock()
	cp := &sl.cp
	cp.end, cp.hash, cp.top, cp.raw = end, d.Sum64(), *top, raw
	cp.top.promptBytes = nil
	cp.seed, cp.prev, cp.ckSize, cp.cur, cp.miss, cp.wrote = c.seed, c.prev, c.size, c.curSize, c.missing, c.written
	cp.part = append(cp.part[:0], c.part...)
	cp.chunks = append(cp.chunks[:0], k.Chunks...)
	cp.short = k.ShortFirstTurn
	sl.key.Store(g)
}
