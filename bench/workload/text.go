package workload

import (
	"math/rand/v2"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Synthetic text.
//
// The router estimates tokens as bytes/4 and the simulator counts its own tokens (about one per
// word), so generated text must be about right for both: lowercase pseudo-English words
// separated by single spaces, whose mean length with the space is close to 4 bytes. One word is
// one simulator token; the router's estimate is within a few percent of the word count.
const (
	minWordLetters = 2
	maxWordLetters = 4
)

var (
	consonants = []byte("bcdfghklmnprstvwy")
	vowels     = []byte("aeiou")
)

// Seed derives a 64-bit seed from a base seed and a list of labels (kind, ids), so that every
// document, block and question has its own stable stream.
func Seed(base uint64, parts ...any) uint64 {
	d := xxhash.New()
	var b [8]byte
	put := func(v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		_, _ = d.Write(b[:])
	}
	put(base)
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			_, _ = d.WriteString(v)
			_, _ = d.Write([]byte{0})
		case int:
			put(uint64(v))
		case int64:
			put(uint64(v))
		case uint64:
			put(v)
		default:
			panic("workload.Seed: unsupported label type")
		}
	}
	return d.Sum64()
}

// NewRand returns a deterministic generator for seed (PCG, stable across Go releases).
func NewRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// Words returns n pseudo-random words of 2–4 letters seeded by seed, separated by single
// spaces, with no leading or trailing space. Equal (seed, n) give equal text, and
// Words(seed, n) is a prefix of Words(seed, m) for n < m.
func Words(seed uint64, n int) string {
	if n <= 0 {
		return ""
	}
	var sb strings.Builder
	sb.Grow(n * 4)
	appendWords(&sb, NewRand(seed), n)
	return sb.String()
}

func appendWords(sb *strings.Builder, r *rand.Rand, n int) {
	for i := 0; i < n; i++ {
		if i > 0 {
			sb.WriteByte(' ')
		}
		l := minWordLetters + r.IntN(maxWordLetters-minWordLetters+1)
		// Alternate consonants and vowels, starting with either, so words are pronounceable.
		c := r.IntN(2) == 0
		for j := 0; j < l; j++ {
			if c {
				sb.WriteByte(consonants[r.IntN(len(consonants))])
			} else {
				sb.WriteByte(vowels[r.IntN(len(vowels))])
			}
			c = !c
		}
	}
}

// CountWords counts whitespace-separated words: the token count the generated text was made
// for.
func CountWords(s string) int { return len(strings.Fields(s)) }

// ApproxTokens is the router's estimate: bytes / 4.
func ApproxTokens(s string) int { return len(s) / 4 }

// TruncateWords returns the first n words of s (single-space separated text as made by Words).
func TruncateWords(s string, n int) string {
	if n <= 0 {
		return ""
	}
	seen := 0
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			seen++
			if seen == n {
				return s[:i]
			}
		}
	}
	return s
}
