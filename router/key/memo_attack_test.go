package key

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// XXH64's lane rounds are invertible: with the seed known (0), a body can be rewritten in 64
// bytes so that its xxhash64 agrees with the original's at every later 4 KiB prefix. These
// helpers craft such a body, as an attacker would.

const xxP1, xxP2 uint64 = 11400714785074694791, 14029467366897019727

func xxRound(acc, in uint64) uint64 { return bits.RotateLeft64(acc+in*xxP2, 31) * xxP1 }

func modInverse(p uint64) uint64 {
	x := p
	for range 6 {
		x *= 2 - p*x
	}
	return x
}

// xxLanes is XXH64's (seed 0) state after b, whose length is a multiple of 32.
func xxLanes(b []byte) [4]uint64 {
	p1, p2 := xxP1, xxP2 // variables: the lane seeds wrap around
	v := [4]uint64{p1 + p2, p2, 0, -p1}
	for off := 0; off+32 <= len(b); off += 32 {
		for i := range 4 {
			v[i] = xxRound(v[i], binary.LittleEndian.Uint64(b[off+8*i:]))
		}
	}
	return v
}

func plainJSONByte(b byte) bool { return b >= 0x20 && b <= 0x7e && b != '"' && b != '\\' }

// collideAt rewrites body[s:s+64] (inside a JSON string, s a multiple of 32) with other
// printable text so that the seed-0 XXH64 state after s+64 is unchanged.
func collideAt(body []byte, s int) []byte {
	out := bytes.Clone(body)
	v, tgt := xxLanes(body[:s]), xxLanes(body[:s+64])
	p1i, p2i := modInverse(xxP1), modInverse(xxP2)
	r := rand.New(rand.NewSource(1))
	for i := range 4 {
		for {
			x := make([]byte, 8)
			for j := range x {
				x[j] = "IGNOREALLPREVIOUSRULES"[r.Intn(22)]
			}
			a := xxRound(v[i], binary.LittleEndian.Uint64(x))
			y := (bits.RotateLeft64(tgt[i]*p1i, -31) - a) * p2i
			var yb [8]byte
			binary.LittleEndian.PutUint64(yb[:], y)
			if !slices.ContainsFunc(yb[:], func(c byte) bool { return !plainJSONByte(c) }) {
				copy(out[s+8*i:], x)
				copy(out[s+32+8*i:], yb[:])
				break
			}
		}
	}
	return out
}

// A body crafted to collide with an earlier one under unseeded XXH64 at every memo block past
// its edit is keyed as a fresh Builder keys it: the memo's hashes are seeded with a secret.
func TestMemoResistsCraftedCollision(t *testing.T) {
	sys := strings.Repeat("You are a careful coding agent. Follow the repository rules. ", 140)
	user := strings.Repeat("func main() { fmt.Println(\"hello\") } // padding line of a tool result\n", 4000)
	mj, _ := json.Marshal([]map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": user}})
	body := []byte(`{"model":"m","stream":false,"max_tokens":8,"messages":` + string(mj) + `}`)
	if len(body) < memoMinBody {
		t.Fatalf("body %d bytes, under memoMinBody", len(body))
	}
	at := bytes.Index(body, []byte("You are a careful"))
	s := (at+200)/32*32 + 32
	if s/memoBlock != (s+64)/memoBlock {
		s = (s/memoBlock+1)*memoBlock + 64
	}
	forged := collideAt(body, s)
	// The forgery is real: unseeded, every block prefix past the edit hashes alike.
	for l := (s/memoBlock + 1) * memoBlock; l <= len(body); l += memoBlock {
		if xxhash.Sum64(body[:l]) != xxhash.Sum64(forged[:l]) {
			t.Fatalf("the forgery does not collide at %d (test helper broken)", l)
		}
	}
	if bytes.Equal(body, forged) || len(body) != len(forged) {
		t.Fatal("the forgery is not a same-length edit")
	}
	path := []byte("/v1/chat/completions")
	// Seeded XXH64 is a cheap barrier, not a MAC: the carries of its lane rounds make a
	// forgery crafted for seed 0 collide under a random seed now and then (1 in 100 Builders
	// measured). So several Builders, each its own secret: at most memoForgeryTolerated of
	// memoForgeryTrials may take the forgery (binomial at 1%: a false failure ≈ 1 in 20,000).
	const memoForgeryTrials, memoForgeryTolerated = 8, 2
	var k0, k1, k2 Key
	NewBuilder(0).Build(path, forged, &k2)
	taken := 0
	for range memoForgeryTrials {
		warm := NewBuilder(0)
		warm.Build(path, body, &k0)
		warm.Build(path, forged, &k1)
		if slices.Equal(k1.Chunks, k0.Chunks) {
			taken++
			continue
		}
		if !k1.OK || !k2.OK || !slices.Equal(k1.Chunks, k2.Chunks) {
			t.Errorf("after the original, the forged body keys as %d chunks (OK %v), a fresh Builder as %d (OK %v); equal %v",
				len(k1.Chunks), k1.OK, len(k2.Chunks), k2.OK, slices.Equal(k1.Chunks, k2.Chunks))
		}
	}
	if taken > memoForgeryTolerated {
		t.Errorf("the forged body got the original's key with %d of %d secrets", taken, memoForgeryTrials)
	}
	warm := NewBuilder(0)
	warm.Build(path, body, &k0)
	// The memo still serves honest extensions.
	ext := append(bytes.Clone(body[:len(body)-2]), []byte(`,{"role":"assistant","content":"ok"}]}`)...)
	hits := warm.memo.hits.Load()
	var k3, k4 Key
	warm.Build(path, body, &k0)
	warm.Build(path, ext, &k3)
	NewBuilder(0).Build(path, ext, &k4)
	if warm.memo.hits.Load() == hits || !slices.Equal(k3.Chunks, k4.Chunks) {
		t.Errorf("an honest extension: memo hits %d -> %d, key equal to a fresh build %v", hits, warm.memo.hits.Load(), slices.Equal(k3.Chunks, k4.Chunks))
	}
}
