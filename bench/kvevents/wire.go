// Package kvevents speaks vLLM's KV-cache event stream (--kv-events-config publisher "zmq"),
// the feed a KV-event router such as NVIDIA Dynamo's indexes: the bench's simulated replicas
// publish it (Publisher), and the dynamo-kv peer consumes it (Subscriber) into an exact
// per-replica index of cached blocks (Index).
//
// The wire format is vLLM's (vllm/distributed/kv_events.py, ZmqEventPublisher): each batch is
// one ZMQ multipart message [topic, sequence number as 8 bytes big endian (from 0, +1 per
// batch), payload], the payload the msgpack of a KVEventBatch as msgspec encodes it with
// array_like=True and omit_defaults=True:
//
//	[ts float64, [event, ...], data_parallel_rank]
//	["BlockStored", [block_hash, ...], parent_block_hash|nil, [token_id, ...], block_size, lora_id|nil, medium|nil, lora_name|nil]
//	["BlockRemoved", [block_hash, ...], medium|nil]
//	["AllBlocksCleared"]
//
// (msgspec writes a tagged array_like struct as its tag followed by its fields in declaration
// order and leaves off trailing fields at their defaults: extra_keys, group_idx and the
// kv_cache_spec fields here.) Decoding also accepts the map form msgspec writes without
// array_like, and ignores trailing fields it does not know, as Dynamo's reader of vLLM events
// does (its RawKvEvent deserializer: position 5, lora_id, read and dropped).
package kvevents

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MediumGPU is vLLM's medium of blocks in the GPU KV cache (kv_events.MEDIUM_GPU).
const MediumGPU = "GPU"

// Kind is an event's msgspec tag.
type Kind uint8

const (
	KindBlockStored Kind = iota + 1
	KindBlockRemoved
	KindAllBlocksCleared
)

var kindTags = [...]string{KindBlockStored: "BlockStored", KindBlockRemoved: "BlockRemoved", KindAllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindTags) && kindTags[k] != "" {
		return kindTags[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Event is one KV-cache event. Which fields apply depends on Kind:
//
//   - BlockStored: BlockHashes (a chain of full blocks, each the next one's parent), Parent
//     (the engine hash of the first block's parent; HasParent false for the prompt's first
//     block), TokenIDs (BlockSize × len(BlockHashes) ids), BlockSize, LoraID (0 with
//     HasLoraID false: nil), Medium, LoraName ("" encodes as nil);
//   - BlockRemoved: BlockHashes (evicted), Medium;
//   - AllBlocksCleared: none.
//
// Hashes are the engine's, opaque to a consumer except as names of blocks.
type Event struct {
	Kind        Kind
	BlockHashes []uint64
	Parent      uint64
	HasParent   bool
	TokenIDs    []uint32
	BlockSize   int
	LoraID      int64
	HasLoraID   bool
	Medium      string
	LoraName    string
}

// Batch is one KVEventBatch: the events of one engine step, in order. TS is the wall time in
// seconds since the Unix epoch.
type Batch struct {
	TS     float64
	Events []Event
	DPRank int
}

// AppendBatch appends b's msgpack payload, as vLLM's publisher encodes it, to dst.
func AppendBatch(dst []byte, b *Batch) []byte {
	buf := bytes.NewBuffer(dst)
	enc := msgpack.NewEncoder(buf)
	// Errors of an Encoder writing to a bytes.Buffer can only be allocation failures.
	_ = enc.EncodeArrayLen(3)
	_ = enc.EncodeFloat64(b.TS)
	_ = enc.EncodeArrayLen(len(b.Events))
	for i := range b.Events {
		encodeEvent(enc, &b.Events[i])
	}
	_ = enc.EncodeInt(int64(b.DPRank))
	return buf.Bytes()
}

func encodeEvent(enc *msgpack.Encoder, e *Event) {
	optString := func(s string) {
		if s == "" {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeString(s)
		}
	}
	hashes := func() {
		_ = enc.EncodeArrayLen(len(e.BlockHashes))
		for _, h := range e.BlockHashes {
			_ = enc.EncodeUint(h)
		}
	}
	switch e.Kind {
	case KindBlockStored:
		_ = enc.EncodeArrayLen(8)
		_ = enc.EncodeString(kindTags[KindBlockStored])
		hashes()
		if e.HasParent {
			_ = enc.EncodeUint(e.Parent)
		} else {
			_ = enc.EncodeNil()
		}
		_ = enc.EncodeArrayLen(len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			_ = enc.EncodeUint(uint64(t))
		}
		_ = enc.EncodeInt(int64(e.BlockSize))
		if e.HasLoraID {
			_ = enc.EncodeInt(e.LoraID)
		} else {
			_ = enc.EncodeNil()
		}
		optString(e.Medium)
		optString(e.LoraName)
	case KindBlockRemoved:
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeString(kindTags[KindBlockRemoved])
		hashes()
		optString(e.Medium)
	default:
		_ = enc.EncodeArrayLen(1)
		_ = enc.EncodeString(kindTags[KindAllBlocksCleared])
	}
}

// DecodeBatch decodes one payload. It accepts the array form vLLM writes and the map form
// (keys ts, events, data_parallel_rank), skips fields it does not know, and fails on anything
// else with an error that says where.
func DecodeBatch(payload []byte) (Batch, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	var b Batch
	code, err := d.PeekCode()
	if err != nil {
		return b, fmt.Errorf("kv event batch: %w", err)
	}
	if msgpcode.IsFixedMap(code) || code == msgpcode.Map16 || code == msgpcode.Map32 {
		n, _ := d.DecodeMapLen()
		for range n {
			k, err := d.DecodeString()
			if err != nil {
				return b, fmt.Errorf("kv event batch key: %w", err)
			}
			switch k {
			case "ts":
				b.TS, err = d.DecodeFloat64()
			case "events":
				b.Events, err = decodeEvents(d)
			case "data_parallel_rank":
				b.DPRank, err = decodeOptInt(d)
			default:
				err = d.Skip()
			}
			if err != nil {
				return b, fmt.Errorf("kv event batch %s: %w", k, err)
			}
		}
		return b, nil
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, fmt.Errorf("kv event batch: %w", err)
	}
	if n < 2 {
		return b, fmt.Errorf("kv event batch: %d fields, want [ts, events, dp_rank]", n)
	}
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return b, fmt.Errorf("kv event batch ts: %w", err)
	}
	if b.Events, err = decodeEvents(d); err != nil {
		return b, err
	}
	if n >= 3 {
		if b.DPRank, err = decodeOptInt(d); err != nil {
			return b, fmt.Errorf("kv event batch data_parallel_rank: %w", err)
		}
	}
	for range n - 3 {
		if err := d.Skip(); err != nil {
			return b, err
		}
	}
	return b, nil
}

func decodeEvents(d *msgpack.Decoder) ([]Event, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	out := make([]Event, 0, max(n, 0))
	for i := range n {
		e, err := decodeEvent(d)
		if err != nil {
			return nil, fmt.Errorf("kv event %d: %w", i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// fieldNames are the fields of each kind in declaration order (the array form's positions
// after the tag).
var fieldNames = [...][]string{
	KindBlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
	KindBlockRemoved:     {"block_hashes", "medium"},
	KindAllBlocksCleared: {},
}

func kindOf(tag string) (Kind, error) {
	for k, t := range kindTags {
		if t != "" && t == tag {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("unknown event type %q", tag)
}

func decodeEvent(d *msgpack.Decoder) (Event, error) {
	var e Event
	code, err := d.PeekCode()
	if err != nil {
		return e, err
	}
	if msgpcode.IsFixedMap(code) || code == msgpcode.Map16 || code == msgpcode.Map32 {
		n, _ := d.DecodeMapLen()
		fields := map[string][]byte{}
		for range n {
			k, err := d.DecodeString()
			if err != nil {
				return e, err
			}
			raw, err := d.DecodeRaw()
			if err != nil {
				return e, err
			}
			fields[k] = raw
		}
		var tag string
		if err := msgpack.Unmarshal(fields["type"], &tag); err != nil {
			return e, fmt.Errorf("type: %w", err)
		}
		if e.Kind, err = kindOf(tag); err != nil {
			return e, err
		}
		for _, name := range fieldNames[e.Kind] {
			if raw, ok := fields[name]; ok {
				if err := e.decodeField(msgpack.NewDecoder(bytes.NewReader(raw)), name); err != nil {
					return e, fmt.Errorf("%s: %w", name, err)
				}
			}
		}
		return e, nil
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return e, err
	}
	if n < 1 {
		return e, errors.New("empty event")
	}
	tag, err := d.DecodeString()
	if err != nil {
		return e, fmt.Errorf("tag: %w", err)
	}
	if e.Kind, err = kindOf(tag); err != nil {
		return e, err
	}
	names := fieldNames[e.Kind]
	for i := 1; i < n; i++ {
		if i-1 >= len(names) {
			if err := d.Skip(); err != nil {
				return e, err
			}
			continue
		}
		if err := e.decodeField(d, names[i-1]); err != nil {
			return e, fmt.Errorf("%s %s: %w", tag, names[i-1], err)
		}
	}
	return e, nil
}

func (e *Event) decodeField(d *msgpack.Decoder, name string) error {
	var err error
	switch name {
	case "block_hashes":
		var n int
		if n, err = d.DecodeArrayLen(); err != nil {
			return err
		}
		e.BlockHashes = make([]uint64, 0, max(n, 0))
		for range n {
			h, err := decodeHash(d)
			if err != nil {
				return err
			}
			e.BlockHashes = append(e.BlockHashes, h)
		}
	case "parent_block_hash":
		if isNil(d) {
			return d.DecodeNil()
		}
		e.HasParent = true
		e.Parent, err = decodeHash(d)
	case "token_ids":
		var n int
		if n, err = d.DecodeArrayLen(); err != nil {
			return err
		}
		e.TokenIDs = make([]uint32, 0, max(n, 0))
		for range n {
			t, err := d.DecodeUint32()
			if err != nil {
				return err
			}
			e.TokenIDs = append(e.TokenIDs, t)
		}
	case "block_size":
		e.BlockSize, err = d.DecodeInt()
	case "lora_id":
		if isNil(d) {
			return d.DecodeNil()
		}
		e.HasLoraID = true
		e.LoraID, err = d.DecodeInt64()
	case "medium", "lora_name":
		var s string
		if isNil(d) {
			err = d.DecodeNil()
		} else {
			s, err = d.DecodeString()
		}
		if name == "medium" {
			e.Medium = s
		} else {
			e.LoraName = s
		}
	}
	return err
}

// decodeHash reads a block hash: an integer (vLLM's int hashes, signed or not, as Dynamo
// accepts both) or bytes (vLLM's sha256 block hashes), which are folded to 64 bits.
func decodeHash(d *msgpack.Decoder) (uint64, error) {
	code, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case code == msgpcode.Bin8 || code == msgpcode.Bin16 || code == msgpcode.Bin32:
		b, err := d.DecodeBytes()
		return xxhash.Sum64(b), err
	case msgpcode.IsFixedNum(code) && int8(code) < 0, code == msgpcode.Int8, code == msgpcode.Int16,
		code == msgpcode.Int32, code == msgpcode.Int64:
		v, err := d.DecodeInt64()
		return uint64(v), err
	}
	return d.DecodeUint64()
}

func decodeOptInt(d *msgpack.Decoder) (int, error) {
	if isNil(d) {
		return 0, d.DecodeNil()
	}
	return d.DecodeInt()
}

func isNil(d *msgpack.Decoder) bool {
	c, err := d.PeekCode()
	return err == nil && c == msgpcode.Nil
}
