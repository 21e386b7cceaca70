package kvevents

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
)

// vllmBatch is a batch as vLLM's msgspec encoder writes it (array_like, omit_defaults,
// tag=True), byte by byte: [1.5, [BlockStored, BlockRemoved, AllBlocksCleared], 0].
var vllmBatch = strings.Join([]string{
	"93",                 // array of 3: ts, events, data_parallel_rank
	"cb3ff8000000000000", // float64 1.5
	"93",                 // 3 events
	"98",                 // BlockStored: tag + 7 fields
	"ab" + hex.EncodeToString([]byte("BlockStored")),
	"920102",     // block_hashes [1, 2]
	"07",         // parent_block_hash 7
	"9401020304", // token_ids [1, 2, 3, 4]
	"02",         // block_size 2
	"c0",         // lora_id None
	"a3475055",   // medium "GPU"
	"c0",         // lora_name None
	"93",         // BlockRemoved: tag + 2 fields
	"ac" + hex.EncodeToString([]byte("BlockRemoved")),
	"91cd012c", // block_hashes [300] (uint16)
	"a3475055", // medium "GPU"
	"91",       // AllBlocksCleared: tag only
	"b0" + hex.EncodeToString([]byte("AllBlocksCleared")),
	"00", // data_parallel_rank 0
}, "")

func sampleBatch() Batch {
	return Batch{TS: 1.5, Events: []Event{
		{Kind: KindBlockStored, BlockHashes: []uint64{1, 2}, Parent: 7, HasParent: true,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{300}, Medium: MediumGPU},
		{Kind: KindAllBlocksCleared},
	}}
}

func TestAppendBatchIsVLLMEncoding(t *testing.T) {
	b := sampleBatch()
	got := hex.EncodeToString(AppendBatch(nil, &b))
	if got != vllmBatch {
		t.Fatalf("encoded\n%s\nwant vLLM's\n%s", got, vllmBatch)
	}
}

func TestDecodeBatchRoundTrip(t *testing.T) {
	raw, _ := hex.DecodeString(vllmBatch)
	got, err := DecodeBatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	if want := sampleBatch(); !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
}

func TestDecodeBatchForms(t *testing.T) {
	tests := []struct {
		name string
		hex  string
		want Batch
	}{
		{"map form without array_like, unknown key skipped",
			"83" + "a27473" + "cb3ff0000000000000" + // ts 1.0
				"a6" + hex.EncodeToString([]byte("events")) + "91" +
				"83" + "a474797065" + "ac" + hex.EncodeToString([]byte("BlockRemoved")) + // type
				"ac" + hex.EncodeToString([]byte("block_hashes")) + "9105" +
				"a9" + hex.EncodeToString([]byte("group_idx")) + "00" +
				"a1" + "78" + "c0", // unknown key "x": nil
			Batch{TS: 1, Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{5}}}}},
		{"negative int64 hash, no parent, trailing extra_keys and group_idx skipped",
			"93" + "cb0000000000000000" + "91" +
				"9a" + "ab" + hex.EncodeToString([]byte("BlockStored")) +
				"91d3ffffffffffffffff" + // block_hashes [-1]
				"c0" + "920809" + "02" + "c0" + "c0" + "c0" +
				"91c0" + "00" + "00", // extra_keys [None], group_idx 0; dp rank 0
			Batch{Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{^uint64(0)}, TokenIDs: []uint32{8, 9}, BlockSize: 2}}}},
		{"no dp rank", "92" + "cb0000000000000000" + "90", Batch{Events: []Event{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := hex.DecodeString(tc.hex)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeBatch(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	for _, h := range []string{
		"",                                   // nothing
		"91cb0000000000000000",               // one field
		"93cb00000000000000009191a3466f6f00", // unknown tag "Foo"
		"93cb000000000000000091" + "92ab" + hex.EncodeToString([]byte("BlockStored")) + "a178", // hashes not an array
	} {
		raw, _ := hex.DecodeString(h)
		if _, err := DecodeBatch(raw); err == nil {
			t.Errorf("%s: decoded without error", h)
		}
	}
}

func TestAppendBatchAppends(t *testing.T) {
	b := Batch{TS: 2}
	out := AppendBatch([]byte("x"), &b)
	if !bytes.HasPrefix(out, []byte("x")) || len(out) != 1+1+9+1+1 {
		t.Fatalf("got % x", out)
	}
}
