package backend

import "testing"

// A reload changes a backend's configured settings in place: weight (0 or below: the
// default) and KV capacity (negative: unset), which KVCapacity reads before a scraped one.
func TestSettingsChangeInPlace(t *testing.T) {
	b, err := New("http://127.0.0.1:8000", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Weight() != DefaultWeight || b.KVCacheTokens() != 0 {
		t.Fatalf("New with weight 0, no KV: weight %d, KV %d; want %d, 0", b.Weight(), b.KVCacheTokens(), DefaultWeight)
	}
	b.SetScrapedKVCacheTokens(50_000)
	tests := []struct {
		weight     int
		kv         int64
		wantWeight int
		wantCap    int64
	}{
		{3, 0, 3, 50_000},            // unset: the scraped capacity
		{1000, 20_000, 1000, 20_000}, // configured wins over scraped
		{0, -5, DefaultWeight, 50_000},
		{-2, 70_000, DefaultWeight, 70_000},
	}
	for _, tt := range tests {
		b.SetWeight(tt.weight)
		b.SetKVCacheTokens(tt.kv)
		if b.Weight() != tt.wantWeight || b.KVCapacity(1) != tt.wantCap {
			t.Errorf("SetWeight(%d), SetKVCacheTokens(%d): weight %d, capacity %d; want %d, %d",
				tt.weight, tt.kv, b.Weight(), b.KVCapacity(1), tt.wantWeight, tt.wantCap)
		}
	}
}
