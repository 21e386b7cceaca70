package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/prefixlb/prefixlb/bench/kvevents"
)

// DefaultModel is the model name the sim serves by default.
const DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"

// Config holds every constant of the replica model. DefaultConfig models Llama-3.1-8B (bf16) on
// one H100 SXM 80GB served by vLLM V1 with its defaults; each field says where its value comes
// from. All times are model (GPU) times; Speedup divides them when the sim sleeps.
type Config struct {
	// Model is the served model name (vLLM --served-model-name). Requests naming another model
	// get 404, as from vLLM; requests without a model get this one.
	Model string

	// Adapters are extra served model names, as LoRA adapters vLLM serves beside the base
	// model (--lora-modules name=path): listed in /v1/models with parent = Model, and accepted
	// in requests. An adapter's prefix cache is its own (vLLM's block hashes include the LoRA
	// id). Default none.
	Adapters []string

	// MaxModelLen caps prompt + max_tokens per request, as vLLM's --max-model-len (a request
	// over it gets 400). Default 131072: Llama-3.1-8B's max_position_embeddings (config.json).
	MaxModelLen int

	// BlockSize is the KV-cache block size in tokens. Default 16: vLLM's default block size on
	// CUDA (cache_config.block_size).
	BlockSize int

	// NumGPUBlocks is the KV-cache capacity in blocks (vLLM "# GPU blocks" / num_gpu_blocks).
	// Default 27000 blocks = 432,000 tokens, derived as vLLM sizes it: H100 80GB reports 79.2
	// GiB; × gpu_memory_utilization 0.9 = 71.3 GiB; minus the weights (14.99 GiB, vLLM log
	// "Loading model weights took 14.9888 GB" for Llama-3.1-8B, vllm#10517) and ≈3 GiB of
	// activations, CUDA graphs and non-torch memory ⇒ ≈53 GiB; one token's KV is 2 (K,V) × 32
	// layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB ⇒ ≈436k tokens ≈ 27.3k blocks.
	NumGPUBlocks int

	// MaxNumSeqs caps the requests running at once (vLLM --max-num-seqs). Default 1024: vLLM
	// EngineArgs.get_batch_defaults for the OpenAI server on GPUs with ≥70 GiB that are not
	// A100 (H100, H200, MI300X); smaller GPUs get 256.
	MaxNumSeqs int

	// MaxNumBatchedTokens is the token budget of one engine step, shared by prefill chunks and
	// decode tokens (vLLM --max-num-batched-tokens, chunked prefill is always on in V1).
	// Default 8192: the same get_batch_defaults table (OpenAI server, ≥70 GiB non-A100 GPU;
	// 2048 on smaller GPUs).
	MaxNumBatchedTokens int

	// StepBase is the fixed cost of one engine step (forward pass) whatever its batch: reading
	// the 16 GB of weights from HBM at 3.35 TB/s takes 4.8 ms, plus launch and sampling overhead.
	// Default 6ms, i.e. ~165 tokens/s for a single stream, the single-request decode speed
	// reported for Llama-3-8B on H100 with vLLM.
	StepBase time.Duration

	// PrefillPerToken is the compute cost of one prompt token in a step. Default 54µs (≈18.5k
	// tokens/s): 2 × 8.03e9 FLOP per token at ≈30% of the H100's 989 dense bf16 TFLOPS, within
	// the 10–20k tokens/s usually measured for 8B prefill on H100.
	PrefillPerToken time.Duration

	// PrefillPerTokenPerKContext is the extra attention cost of one prompt token per 1000 tokens
	// already in its context (causal attention is quadratic). Default 1.5µs: 4 × 4096 × 32 ≈
	// 0.52 MFLOP per (query, key) pair at ≈350 TFLOPS effective FlashAttention throughput.
	PrefillPerTokenPerKContext time.Duration

	// DecodePerSeq is the cost of one decoding sequence in a step (its MLP/projection compute,
	// sampling, detokenisation). Default 40µs: a 64-sequence step with 1k-token contexts then
	// takes ≈11 ms and a 256-sequence one ≈26 ms (≈10k output tokens/s), the range reported for
	// Llama-3-8B on one H100 with vLLM ≥0.6.
	DecodePerSeq time.Duration

	// DecodePerContextToken is the cost of reading one token's KV cache during decode. Default
	// 40ns: 128 KiB of KV per token ÷ 3.35 TB/s HBM bandwidth = 39 ns.
	DecodePerContextToken time.Duration

	// DefaultMaxTokens is the number of tokens generated when a request gives neither
	// max_tokens nor max_completion_tokens. Default 16 (the OpenAI completions default). The sim
	// always generates exactly max_tokens tokens (as with ignore_eos=true).
	DefaultMaxTokens int

	// GPUMemoryUtilization is only reported in vllm:cache_config_info. Default 0.9 (vLLM's).
	GPUMemoryUtilization float64

	// Speedup divides every model time when the sim sleeps: 10 runs the model ten times faster
	// than the modelled GPU. Metrics (TTFT) stay in model seconds.
	Speedup float64

	// MaxRequestBodyBytes caps a request body (413 above it). Default 64 MiB.
	MaxRequestBodyBytes int64

	// KVEventsEndpoint, when set, makes each replica publish its KV-cache events (blocks
	// cached and evicted) over ZMQ PUB in vLLM's wire format (package bench/kvevents), as
	// vLLM does with --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
	// "endpoint": ...}'. It must be tcp://127.0.0.1:PORT; in a cluster replica i binds
	// PORT+i (PORT 0: an ephemeral port each). Default "": off.
	KVEventsEndpoint string
}

// DefaultConfig returns the model of Llama-3.1-8B-Instruct (bf16) on one H100 SXM 80GB under
// vLLM V1 defaults (gpu_memory_utilization 0.9, prefix caching and chunked prefill on).
func DefaultConfig() Config {
	return Config{
		Model:                      DefaultModel,
		MaxModelLen:                131072,
		BlockSize:                  16,
		NumGPUBlocks:               27000,
		MaxNumSeqs:                 1024,
		MaxNumBatchedTokens:        8192,
		StepBase:                   6 * time.Millisecond,
		PrefillPerToken:            54 * time.Microsecond,
		PrefillPerTokenPerKContext: 1500 * time.Nanosecond,
		DecodePerSeq:               40 * time.Microsecond,
		DecodePerContextToken:      40 * time.Nanosecond,
		DefaultMaxTokens:           16,
		GPUMemoryUtilization:       0.9,
		Speedup:                    1,
		MaxRequestBodyBytes:        64 << 20,
	}
}

// Validate reports the first field that cannot work, naming its flag.
func (c *Config) Validate() error {
	var errs []error
	pos := func(flag string, v int64) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be > 0, got %d", flag, v))
		}
	}
	nonneg := func(flag string, v time.Duration) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("--%s must be >= 0, got %s", flag, v))
		}
	}
	if c.Model == "" {
		errs = append(errs, errors.New("--model must not be empty"))
	}
	for i, a := range c.Adapters {
		if a == "" || a == c.Model || slices.Contains(c.Adapters[:i], a) {
			errs = append(errs, fmt.Errorf("--lora-names: %q is empty, the base model or listed twice", a))
		}
	}
	pos("max-model-len", int64(c.MaxModelLen))
	pos("block-size", int64(c.BlockSize))
	pos("num-gpu-blocks", int64(c.NumGPUBlocks))
	pos("max-num-seqs", int64(c.MaxNumSeqs))
	pos("max-num-batched-tokens", int64(c.MaxNumBatchedTokens))
	pos("default-max-tokens", int64(c.DefaultMaxTokens))
	pos("max-request-body-bytes", c.MaxRequestBodyBytes)
	nonneg("step-base", c.StepBase)
	nonneg("prefill-per-token", c.PrefillPerToken)
	nonneg("prefill-per-token-per-k-context", c.PrefillPerTokenPerKContext)
	nonneg("decode-per-seq", c.DecodePerSeq)
	nonneg("decode-per-context-token", c.DecodePerContextToken)
	if c.KVEventsEndpoint != "" {
		if err := kvevents.CheckEndpoint(c.KVEventsEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("--kv-events-endpoint: %w", err))
		}
	}
	if !(c.Speedup > 0) {
		errs = append(errs, fmt.Errorf("--speedup must be > 0, got %v", c.Speedup))
	}
	return errors.Join(errs...)
}

// KVCacheTokens is the KV-cache capacity in tokens (NumGPUBlocks × BlockSize).
func (c *Config) KVCacheTokens() int { return c.NumGPUBlocks * c.BlockSize }

// RegisterFlags binds every field of c to a flag of fs, with c's current values as defaults.
// The `prefixlb sim` command uses it; the bench can reuse it.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.StringSliceVar(&c.Adapters, "lora-names", c.Adapters, "extra served model names (LoRA-style adapters of --model), comma-separated")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "max prompt+output tokens per request (Llama-3.1-8B: 131072)")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV-cache block size in tokens (vLLM CUDA default 16)")
	fs.IntVar(&c.NumGPUBlocks, "num-gpu-blocks", c.NumGPUBlocks, "KV-cache capacity in blocks (8B bf16 on H100 80GB at 0.9: ~27k)")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "max running requests (vLLM default on H100: 1024)")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "token budget per step (vLLM default on H100: 8192)")
	fs.DurationVar(&c.StepBase, "step-base", c.StepBase, "fixed cost of one engine step")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", c.PrefillPerToken, "cost of one prompt token")
	fs.DurationVar(&c.PrefillPerTokenPerKContext, "prefill-per-token-per-k-context", c.PrefillPerTokenPerKContext, "extra cost of one prompt token per 1000 context tokens")
	fs.DurationVar(&c.DecodePerSeq, "decode-per-seq", c.DecodePerSeq, "cost of one decoding sequence per step")
	fs.DurationVar(&c.DecodePerContextToken, "decode-per-context-token", c.DecodePerContextToken, "cost of reading one context token's KV in decode")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", c.DefaultMaxTokens, "tokens generated when a request sets no max_tokens")
	fs.Float64Var(&c.GPUMemoryUtilization, "gpu-memory-utilization", c.GPUMemoryUtilization, "reported in vllm:cache_config_info only")
	fs.Float64Var(&c.Speedup, "speedup", c.Speedup, "divide all model times by this factor")
	fs.Int64Var(&c.MaxRequestBodyBytes, "max-request-body-bytes", c.MaxRequestBodyBytes, "max request body size")
	fs.StringVar(&c.KVEventsEndpoint, "kv-events-endpoint", c.KVEventsEndpoint, "publish KV-cache events in vLLM's ZMQ format on tcp://127.0.0.1:PORT (replica i: PORT+i; 0: ephemeral); empty: off")
}
