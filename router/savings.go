package router

// CachedPrefillWork is the prefill work that held prompt tokens found in a replica's KV cache
// spare it, in PrefillWork's units (tokens' worth at the start of a context, which the
// learned prefill rates are in): PrefillWork(p, 0) − PrefillWork(p, held) = held × (1 + held/2
// ÷ AttentionTokens) for any prompt of p ≥ held tokens, before PrefillWork's rounding. 0 for
// held ≤ 0.
func CachedPrefillWork(held int64) float64 {
	if held <= 0 {
		return 0
	}
	h := float64(held)
	return h * (1 + h/2/AttentionTokens)
}

// SavedPrefillSeconds is the prefill time, in seconds, that held cached prompt tokens spare a
// replica that prefills rate tokens a second (backend.Backend.LearnedPrefillRate): 0 when
// rate is not known (≤ 0).
func SavedPrefillSeconds(held int64, rate float64) float64 {
	if rate <= 0 {
		return 0
	}
	return CachedPrefillWork(held) / rate
}

// learnedRate is c's learned prefill rate in tokens per second, as
// backend.Backend.LearnedPrefillRate reads it: its own, else its pool's; 0 while neither has
// learned one.
func (c *cand) learnedRate() float64 {
	if c.rate > 0 {
		return c.rate
	}
	return c.fleetRate
}
