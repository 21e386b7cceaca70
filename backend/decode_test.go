package backend

import "testing"

func TestDecodeWork(t *testing.T) {
	tests := []struct {
		name                         string
		decodes, ctx, ahead, work, w int64
	}{
		{"nothing decodes", 0, 0, 50_000, 1000, 0},
		{"one step: a token per sequence and its context's reads", 32, 32 * 4096, 0, 128, 32 + 32*4096/DecodeContextPerToken},
		{"a long queue spans more steps", 32, 32 * 4096, 3 * StepTokens, 100, 4 * (32 + 32*4096/DecodeContextPerToken)},
		{"negative counts (a racing read) count as none", -1, -5, 0, 10, 0},
		{"sequences without context", 4, 0, 0, StepTokens, 2 * 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DecodeWork(tt.decodes, tt.ctx, tt.ahead, tt.work); got != tt.w {
				t.Fatalf("DecodeWork(%d, %d, %d, %d) = %d, want %d", tt.decodes, tt.ctx, tt.ahead, tt.work, got, tt.w)
			}
		})
	}
}

// TestLeaseDecoding: a streamed request counts as decoding, with its prompt's tokens, from
// its first byte to its release; a non-streamed, refused or never-answered one never does;
// and a request dispatched while others decode teaches the prefill model its work with
// their DecodeWork added, as the estimate charged it.
func TestLeaseDecoding(t *testing.T) {
	b, _ := New("http://d:1", 0, 1)
	b.SharePrefillSamples(true)
	check := func(when string, seqs, ctx int64) {
		t.Helper()
		if s, c := b.Decoding(); s != seqs || c != ctx {
			t.Fatalf("%s: decoding %d sequences of %d tokens, want %d of %d", when, s, c, seqs, ctx)
		}
	}
	var a, unstreamed, refused, gone Lease
	a.Begin(b, 4000, 4096, true)
	unstreamed.Begin(b, 100, 3000, false)
	refused.Begin(b, 100, 5000, true)
	gone.Begin(b, 100, 7000, true)
	check("before any first byte", 0, 0)
	a.FirstByte()
	a.FirstByte()
	unstreamed.FirstByte()
	refused.Refused()
	refused.FirstByte()
	gone.Release()
	gone.FirstByte()
	check("one streamed request answering", 1, 4096)
	_ = b.TakePrefillSamples(nil)

	var next Lease
	next.Begin(b, 200, 300, true)
	next.FirstByte()
	check("two answering", 2, 4096+300)
	got := b.TakePrefillSamples(nil)
	if want := int64(200) + DecodeWork(1, 4096, 0, 200); len(got) != 1 || got[0].Work != want {
		t.Fatalf("sample %+v, want work %d (the prompt's 200 and one decode's)", got, want)
	}
	a.Release()
	a.Release()
	unstreamed.Release()
	refused.Release()
	check("one released", 1, 300)
	next.Release()
	check("all released", 0, 0)
}

// TestLeaseDecodingConcurrent: FirstByte, Refused and Release racing from several goroutines
// leave the decode counts at zero once every lease is released (run with -race).
func TestLeaseDecodingConcurrent(t *testing.T) {
	b, _ := New("http://d:2", 0, 1)
	const n = 200
	ls := make([]Lease, n)
	for i := range ls {
		ls[i].Begin(b, 100, int64(1000+i), i%3 != 0)
	}
	done := make(chan struct{})
	for w := range 3 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range ls {
				switch (i + w) % 3 {
				case 0:
					ls[i].FirstByte()
				case 1:
					ls[i].Refused()
				default:
					ls[i].Release()
				}
			}
		}()
	}
	for range 3 {
		<-done
	}
	for i := range ls {
		ls[i].Release()
	}
	if s, c := b.Decoding(); s != 0 || c != 0 || b.counts.decodeSeqs.Load() != 0 || b.counts.decodeCtx.Load() != 0 {
		t.Fatalf("after every release: %d sequences, %d tokens decoding (raw %d, %d)", s, c, b.counts.decodeSeqs.Load(), b.counts.decodeCtx.Load())
	}
}
