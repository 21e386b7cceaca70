package peers

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/kvevents"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// PromptTokenizer returns a request body's prompt token ids as the replicas tokenize it
// (chat template included); api is the endpoint the body was sent to.
type PromptTokenizer func(body []byte, api key.API) ([]uint32, error)

// KVEventsOptions connect the dynamo-kv peer to its replicas' KV-event streams.
type KVEventsOptions struct {
	// Endpoints maps each backend's URL (backend.Backend.Name) to its replica's ZMQ endpoint.
	Endpoints map[string]string
	// BlockSize is the replicas' KV block size in tokens.
	BlockSize int
	// Tokenize is the model's tokenizer and chat template.
	Tokenize PromptTokenizer
}

// DynamoKV is NVIDIA Dynamo's KV router in its default mode: the cost of Dynamo (see Dynamo
// and dynamoCost, same defaults, same router-tracked active prefill tokens and blocks) with
// the overlap read from an exact index fed by the engines' KV events (use_kv_events true,
// Dynamo's default: lib/kv-router/src/indexer, one radix tree of block hashes over every
// worker). Each replica's vLLM-format event stream (package kvevents) is subscribed to; the
// request's prompt is tokenized as the replicas tokenize it (a deployment's router uses the
// model's tokenizer) and cut into the replicas' blocks, and a worker's overlap is the longest
// run of the prompt's leading blocks it holds now.
//
// What it does not have that Dynamo has: the replay socket to recover missed batches (a
// missed batch is counted, Stats); cache_salt and LoRA, which this index does not separate
// (the bench sends neither). Close stops the subscribers.
type DynamoKV struct {
	credit, scale float64
	rnd           func(n int) int // nil: ties
	ties          tieBreaker
	bs            int
	tokenize      PromptTokenizer
	idx           *kvevents.Index
	subs          []*kvevents.Subscriber
	act           dynamoActive

	mu     sync.Mutex
	hashes map[bodyID]picked // Pick's block hashes for Learn, by request body
}

// picked is a prompt's block hashes and token count.
type picked struct {
	hs  []uint64
	isl int
}

// bodyID names a request body while its request is being served (its bytes do not move).
type bodyID struct {
	p *byte
	n int
}

// maxPending bounds the block hashes kept between a Pick and its Learn (requests picked but
// never sent leave theirs behind).
const maxPending = 4096

// NewDynamoKV subscribes to every endpoint of kv and returns the policy; the error names an
// endpoint that could not be dialled. o tunes the cost as for Dynamo (o.Prefix is unused).
func NewDynamoKV(o DynamoOptions, kv KVEventsOptions) (*DynamoKV, error) {
	if kv.BlockSize <= 0 || kv.Tokenize == nil || len(kv.Endpoints) == 0 {
		return nil, errors.New("dynamo-kv needs the replicas' KV-event endpoints, block size and tokenizer")
	}
	if o.OverlapCredit <= 0 {
		o.OverlapCredit = DefaultDynamoOverlapCredit
	}
	if o.PrefillLoadScale <= 0 {
		o.PrefillLoadScale = DefaultDynamoPrefillLoadScale
	}
	p := &DynamoKV{credit: o.OverlapCredit, scale: o.PrefillLoadScale, rnd: o.Rand, bs: kv.BlockSize,
		tokenize: kv.Tokenize, idx: kvevents.NewIndex(), act: newDynamoActive(), hashes: map[bodyID]picked{}}
	for name, ep := range kv.Endpoints {
		s, err := kvevents.Subscribe(p.idx, name, ep)
		if err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("dynamo-kv: %s: %w", name, err)
		}
		p.subs = append(p.subs, s)
	}
	return p, nil
}

// Close stops the subscribers.
func (p *DynamoKV) Close() error {
	var errs []error
	for _, s := range p.subs {
		errs = append(errs, s.Close())
	}
	p.subs = nil
	return errors.Join(errs...)
}

// Stats sums what the subscribers counted.
func (p *DynamoKV) Stats() kvevents.SubscriberStats {
	var t kvevents.SubscriberStats
	for _, s := range p.subs {
		st := s.Stats()
		t.Batches += st.Batches
		t.Missed += st.Missed
		t.BadBatches += st.BadBatches
		t.Index.Stored += st.Index.Stored
		t.Index.Removed += st.Index.Removed
		t.Index.UnknownParent += st.Index.UnknownParent
		t.Index.UnknownRemoved += st.Index.UnknownRemoved
		t.Index.Malformed += st.Index.Malformed
	}
	return t
}

// Index is the exact block index (for tests).
func (p *DynamoKV) Index() *kvevents.Index { return p.idx }

// blockHashes returns the block hashes of k's prompt (nil when it cannot be tokenized).
func (p *DynamoKV) blockHashes(k *key.Key) ([]uint64, int) {
	if k == nil || len(k.Body) == 0 {
		return nil, 0
	}
	toks, err := p.tokenize(k.Body, k.API)
	if err != nil {
		return nil, 0
	}
	return kvevents.SequenceHashes(nil, toks, p.bs), len(toks)
}

// Pick returns the candidate of lowest cost.
func (p *DynamoKV) Pick(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, true)
}

// Preview is the decision Pick would make now, recording nothing.
func (p *DynamoKV) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *DynamoKV) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	hs, isl := p.blockHashes(k)
	if commit && hs != nil {
		p.mu.Lock()
		if len(p.hashes) >= maxPending {
			clear(p.hashes)
		}
		p.hashes[idOf(k)] = picked{hs, isl}
		p.mu.Unlock()
	}
	weights := p.weights(len(hs))
	loads := make([]workerLoad, n)
	p.act.loads(cs, hs, weights, loads)
	costs := make([]float64, n)
	overlap := make([]int, n)
	for j, b := range cs {
		overlap[j] = p.idx.Overlap(b.Name, hs)
		costs[j] = dynamoCost(p.credit, p.scale, p.bs, isl, overlap[j]*p.bs, loads[j])
	}
	j := pickMin(costs, p.ties.draw(commit, p.rnd))
	r := router.ReasonLeastLoad
	if overlap[j] > 0 {
		r = router.ReasonMatch
	}
	return router.Decision{Backend: cs[j], Reason: r}
}

func (p *DynamoKV) weights(n int) []int32 {
	w := make([]int32, n)
	for i := range w {
		w[i] = int32(p.bs)
	}
	return w
}

func idOf(k *key.Key) bodyID { return bodyID{unsafe.SliceData(k.Body), len(k.Body)} }

// Learn records k's request as active on b: its prompt tokens not cached there now as
// active prefill tokens, its blocks as active blocks. The index itself learns only from
// events.
func (p *DynamoKV) Learn(k *key.Key, b *backend.Backend, _ int) router.Learned {
	if k == nil || !k.Routed || !k.OK || b == nil {
		return 0
	}
	p.mu.Lock()
	pk, ok := p.hashes[idOf(k)]
	delete(p.hashes, idOf(k))
	p.mu.Unlock()
	hs, isl := pk.hs, pk.isl
	if !ok {
		hs, isl = p.blockHashes(k)
	}
	cached := p.idx.Overlap(b.Name, hs) * p.bs
	return p.act.add(b, hs, p.weights(len(hs)), int64(isl-cached), 0)
}

// Unlearn ends a request b refused.
func (p *DynamoKV) Unlearn(_ *key.Key, _ *backend.Backend, l router.Learned) { p.act.remove(l) }

// Correct does nothing: the index is what the replicas published, not a guess to correct.
func (p *DynamoKV) Correct(*key.Key, *backend.Backend, router.Learned, router.CacheReport) int {
	return 0
}

// Prefilled ends the active prefill of request l.
func (p *DynamoKV) Prefilled(_ *key.Key, _ *backend.Backend, l router.Learned) { p.act.prefilled(l) }

// Finished ends request l.
func (p *DynamoKV) Finished(_ *key.Key, _ *backend.Backend, l router.Learned) { p.act.remove(l) }

var (
	_ router.Policy  = (*DynamoKV)(nil)
	_ router.Tracker = (*DynamoKV)(nil)
)
