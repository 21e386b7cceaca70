package router

import "testing"

// capacityOf is the index capacity, in entries, of the backend named name.
func capacityOf(p *Prefix, name string) int64 {
	for _, s := range p.Index().Stats(nil) {
		if s.Name == name {
			return s.Capacity
		}
	}
	return -1
}

// SetBackends rebuilds the hash ring only when the backends or their weights change: a KV
// capacity reported by a scrape (the proxy hands the same backends again) keeps the ring and
// still reaches the index; a weight changed in place (a reload) or a backend added builds a
// new one.
func TestRingRebuiltOnlyOnMembershipOrWeight(t *testing.T) {
	bs := prefixBackends(t, 4)
	for _, b := range bs {
		b.SetWeight(1000)
	}
	p, _ := newTestPrefix(t, bs)
	ring := p.ring.Load()
	capBefore := capacityOf(p, bs[0].Name)

	for i := range 20 { // scrapes, each reporting another capacity
		bs[0].SetScrapedKVCacheTokens(int64(100_000 + i*16_000))
		p.SetBackends(bs)
	}
	if p.ring.Load() != ring {
		t.Error("a capacity change rebuilt the ring")
	}
	if got := capacityOf(p, bs[0].Name); got == capBefore {
		t.Errorf("the scraped capacity did not reach the index: %d entries, as before", got)
	}
	p.SetBackends(bs) // a reload that changes nothing
	if p.ring.Load() != ring {
		t.Error("setting the same backends again rebuilt the ring")
	}

	bs[2].SetWeight(500)
	p.SetBackends(bs)
	next := p.ring.Load()
	if next == ring || next.members[2].Weight != 500 {
		t.Fatalf("a weight change: ring rebuilt %v, member weight %d, want 500", next != ring, next.members[2].Weight)
	}
	more := append(bs, prefixBackends(t, 5)[4])
	p.SetBackends(more)
	if got := p.ring.Load(); got == next || len(got.ids) != 5 {
		t.Errorf("a backend added: ring rebuilt %v, %d members, want 5", got != next, len(got.ids))
	}
}

// BenchmarkSetBackendsOnScrape is what a scrape that reports a changed KV capacity costs the
// policy (proxy's refreshPolicy): 20 backends of weight 50, one capacity changed per call.
func BenchmarkSetBackendsOnScrape(b *testing.B) {
	bs := prefixBackends(b, 20)
	for _, be := range bs {
		be.SetWeight(50)
	}
	p, _ := newTestPrefix(b, bs)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		bs[i%len(bs)].SetScrapedKVCacheTokens(int64(100_000 + i%7*16_000))
		p.SetBackends(bs)
	}
}
