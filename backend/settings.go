// The configured settings: the replica's KV capacity and weight as the config gives them.

package backend

import "sync/atomic"

// Settings are the replica's configured settings (backends[].kv_cache_tokens and weight).
// New sets them; a config reload changes them in place (package proxy: SetKVCacheTokens,
// SetWeight), so that the backend keeps its health, ejection state, index entries and
// learned rates. Its configured models are the model set's (models.go).
type Settings struct {
	// KVCacheTokens is the configured KV-cache capacity in tokens (0: not configured; see
	// KVCapacity).
	KVCacheTokens int64
	// Weight scales the backend's share of the hash ring and of the bounded-load cap (1 =
	// normal; at least 1).
	Weight int
	// MaxConcurrency is the most requests the replica runs at once as configured
	// (backends[].max_concurrency, its engine's max_num_seqs; 0: not configured: a queue in
	// its last scrape is then the only sign of it, HealthReport.Waiting). Flow control judges
	// the replica saturated when it has this many (proxy/saturation.go).
	MaxConcurrency int64
}

// settingsState is Settings as atomics; only the config writes it (writers_test.go).
type settingsState struct {
	kvTokens atomic.Int64
	weight   atomic.Int64
	maxConc  atomic.Int64
}

// Settings reads the configured settings, each field once.
func (b *Backend) Settings() Settings {
	return Settings{KVCacheTokens: b.settings.kvTokens.Load(), Weight: int(b.settings.weight.Load()),
		MaxConcurrency: b.settings.maxConc.Load()}
}

// KVCacheTokens is Settings().KVCacheTokens.
func (b *Backend) KVCacheTokens() int64 { return b.settings.kvTokens.Load() }

// SetKVCacheTokens changes the configured KV-cache capacity (a config reload; negative
// counts as 0). The prefix index reads it when its backends are set again.
func (b *Backend) SetKVCacheTokens(tokens int64) { b.settings.kvTokens.Store(max(tokens, 0)) }

// Weight is Settings().Weight.
func (b *Backend) Weight() int { return int(b.settings.weight.Load()) }

// SetWeight changes the weight (a config reload); 0 or below takes DefaultWeight. The hash
// ring reads it when its backends are set again.
func (b *Backend) SetWeight(w int) {
	if w <= 0 {
		w = DefaultWeight
	}
	b.settings.weight.Store(int64(w))
}

// MaxConcurrency is Settings().MaxConcurrency.
func (b *Backend) MaxConcurrency() int64 { return b.settings.maxConc.Load() }

// SetMaxConcurrency changes the configured concurrency limit (a config reload; 0 or below:
// not configured).
func (b *Backend) SetMaxConcurrency(n int64) { b.settings.maxConc.Store(max(n, 0)) }

// KVCapacity is the replica's KV-cache capacity in tokens: the configured kv_cache_tokens
// (Settings), else what the replica reports (HealthReport: vLLM cache_config_info
// num_gpu_blocks × block_size, SGLang max_total_num_tokens), else def.
func (b *Backend) KVCapacity(def int64) int64 {
	if c := b.settings.kvTokens.Load(); c > 0 {
		return c
	}
	if s := b.report.load().KVCacheTokens; s > 0 {
		return s
	}
	return def
}
