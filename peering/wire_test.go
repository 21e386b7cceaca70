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
	type group struct {
		id, stamp, work int64
		forget          bool
		hashes          []uint64
	}
	buf := appendHeader(nil, kindUpdate, "r0")
	buf = appendLoads(buf, []peerLoad{{id: 3, inFlight: 2, prefill: 4096}})
	buf = appendGroup(buf, 3, 1000, 4200, []uint64{1, 2, 3})
	buf = appendForget(buf, 3, 900, []uint64{9})
	buf = appendGroup(buf, 4, 1001, 1, nil)
	buf = appendGroup(buf, 4, 1002, -5, []uint64{7}) // a negative work is written as 0
	decode := func(b []byte) (string, []peerLoad, []group, error) {
		var ls, gotLoads []peerLoad
		var hs []uint64
		var from string
		var gs []group
		err := decodeUpdate(b, &ls, &hs, func(s string, l []peerLoad) { from, gotLoads = s, slices.Clone(l) },
			func(id uint64, stamp, work int64, forget bool, h []uint64) {
				gs = append(gs, group{int64(id), stamp, work, forget, slices.Clone(h)})
			})
		return from, gotLoads, gs, err
	}
	from, ls, gs, err := decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := []group{{3, 1000, 4200, false, []uint64{1, 2, 3}}, {3, 900, 0, true, []uint64{9}}, {4, 1001, 1, false, []uint64{}}, {4, 1002, 0, false, []uint64{7}}}
	if from != "r0" || len(ls) != 1 || ls[0] != (peerLoad{id: 3, inFlight: 2, prefill: 4096}) {
		t.Fatalf("sender %q loads %+v, want r0 and backend 3's", from, ls)
	}
	if !slices.EqualFunc(gs, want, func(a, b group) bool {
		return a.id == b.id && a.stamp == b.stamp && a.work == b.work && a.forget == b.forget && slices.Equal(a.hashes, b.hashes)
	}) {
		t.Fatalf("groups %+v, want %+v", gs, want)
	}
	old := slices.Clone(buf)
	old[0] = 1 // version 1: groups without their work
	if _, _, gs, err := decode(old); err == nil || len(gs) > 0 {
		t.Fatalf("a version-1 update decoded (%d groups, error %v), want it refused", len(gs), err)
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
	buf = binary.AppendUvarint(buf, ^uint64(0))       // work
	buf = binary.AppendUvarint(buf, 0)                // no hashes
	var ls, got []peerLoad
	var hs []uint64
	var work int64 = -1
	err := decodeUpdate(buf, &ls, &hs, func(_ string, l []peerLoad) { got = slices.Clone(l) },
		func(_ uint64, _, w int64, _ bool, _ []uint64) { work = w })
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
