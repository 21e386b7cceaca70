package peering

import (
	"encoding/binary"
	"slices"
	"testing"
)

// TestUpdateWire: an update's loads and groups decode as they were written: a learned group
// with its prefill work, a forget (which carries none), an empty group; a message of another
// wire version, or cut short, is an error and delivers no group.
func TestUpdateWire(t *testing.T) {
	type got struct {
		group
		hashes []uint64
	}
	buf := appendHeader(nil, kindUpdate, "r0")
	buf = appendLoads(buf, []peerLoad{{id: 3, inFlight: 2, prefill: 4096}})
	buf = appendGroup(buf, 3, 1000, 4200, classSent, []uint64{1, 2, 3})
	buf = appendForget(buf, 3, 900, []uint64{9})
	buf = appendGroup(buf, 4, 1001, 1, classFlexible, nil)
	buf = appendGroup(buf, 4, 1002, -5, classSent, []uint64{7})  // a negative work is written as 0
	buf = appendGroup(buf, 5, 1003, maxCount+9, classMatch, nil) // past maxCount: maxCount
	// A class past the known ones (a newer or buggy peer's) reads as classSent.
	buf = binary.LittleEndian.AppendUint64(buf, 6)
	buf = binary.LittleEndian.AppendUint64(buf, 1004)
	buf = binary.AppendUvarint(buf, 7<<classBits|3)
	buf = binary.AppendUvarint(buf, 0)
	decode := func(b []byte) (string, []peerLoad, []got, error) {
		var ls, gotLoads []peerLoad
		var hs []uint64
		var from string
		var gs []got
		err := decodeUpdate(b, &ls, &hs, func(s string, l []peerLoad) { from, gotLoads = s, slices.Clone(l) },
			func(g group, h []uint64) { gs = append(gs, got{g, slices.Clone(h)}) })
		return from, gotLoads, gs, err
	}
	from, ls, gs, err := decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := []got{
		{group{id: 3, stamp: 1000, work: 4200}, []uint64{1, 2, 3}},
		{group{id: 3, stamp: 900, forget: true}, []uint64{9}},
		{group{id: 4, stamp: 1001, work: 1, class: classFlexible}, []uint64{}},
		{group{id: 4, stamp: 1002}, []uint64{7}},
		{group{id: 5, stamp: 1003, work: maxCount, class: classMatch}, []uint64{}},
		{group{id: 6, stamp: 1004, work: 7}, []uint64{}},
	}
	if from != "r0" || len(ls) != 1 || ls[0] != (peerLoad{id: 3, inFlight: 2, prefill: 4096}) {
		t.Fatalf("sender %q loads %+v, want r0 and backend 3's", from, ls)
	}
	if !slices.EqualFunc(gs, want, func(a, b got) bool { return a.group == b.group && slices.Equal(a.hashes, b.hashes) }) {
		t.Fatalf("groups %+v, want %+v", gs, want)
	}
	for _, v := range []byte{1, 2} {
		old := slices.Clone(buf)
		old[0] = v // version 1: groups without their work; 2: without their class
		if _, _, gs, err := decode(old); err == nil || len(gs) > 0 {
			t.Fatalf("a version-%d update decoded (%d groups, error %v), want it refused", v, len(gs), err)
		}
	}
	for _, n := range []int{1, 5, len(buf) - 1} {
		if _, _, _, err := decode(buf[:n]); err == nil {
			t.Errorf("an update cut to %d of %d bytes decoded without error", n, len(buf))
		}
	}
}

// TestUpdateWireClampsCounts: counts past maxCount off the wire (a buggy peer's; our own
// writer cannot produce them) read as maxCount, never negative, so that the sums over peers
// and over the arrivals ring cannot wrap.
func TestUpdateWireClampsCounts(t *testing.T) {
	buf := appendHeader(nil, kindUpdate, "r0")
	buf = binary.AppendUvarint(buf, 1) // one load record
	buf = binary.LittleEndian.AppendUint64(buf, 3)
	buf = binary.AppendUvarint(buf, 1<<63+5)    // in flight
	buf = binary.AppendUvarint(buf, ^uint64(0)) // queued prefill
	buf = binary.LittleEndian.AppendUint64(buf, 3)
	buf = binary.LittleEndian.AppendUint64(buf, 1000) // stamp
	buf = binary.AppendUvarint(buf, ^uint64(0))       // work (4×work+class)
	buf = binary.AppendUvarint(buf, 0)                // no hashes
	var ls, got []peerLoad
	var hs []uint64
	var work int64 = -1
	err := decodeUpdate(buf, &ls, &hs, func(_ string, l []peerLoad) { got = slices.Clone(l) },
		func(g group, _ []uint64) { work = g.work })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].inFlight != maxCount || got[0].prefill != maxCount {
		t.Errorf("loads %+v, want in flight and prefill %d", got, int64(maxCount))
	}
	if work != maxCount {
		t.Errorf("work %d, want %d", work, int64(maxCount))
	}
}
