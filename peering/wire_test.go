package peering

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
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

// TestSnapshotWire: an aged snapshot carries each entry's age to the microsecond (a use
// after the snapshot was taken, or out of order, reads as the age before it; past
// maxAgeMicros as that); an older replica's snapshot decodes without ages; a cut or
// malformed one is an error, and the groups before the cut stand.
func TestSnapshotWire(t *testing.T) {
	taken := time.Unix(1_800_000_000, 0).UnixNano()
	hs := []uint64{1, 2, 3, 4, 5}
	used := []int64{taken + int64(time.Second), taken - 1500, taken - int64(time.Millisecond), taken - int64(2*time.Millisecond), taken - int64(100*24*time.Hour)}
	buf := appendHeader(nil, kindAgedSnapshot, "r0")
	buf = appendAgedGroup(buf, 7, hs, used, taken)
	buf = appendAgedGroup(buf, 8, nil, nil, taken)
	type got struct {
		id   uint64
		hs   []uint64
		ages []time.Duration
	}
	var sender string
	decode := func(buf []byte) ([]got, error) {
		var out []got
		err := decodeSnapshot(buf, func(s string) bool { sender = s; return s != "me" }, func(id uint64, hs []uint64, ages []time.Duration) {
			out = append(out, got{id, slices.Clone(hs), slices.Clone(ages)})
		})
		return out, err
	}
	out, err := decode(buf)
	if err != nil || len(out) != 2 || out[0].id != 7 || !slices.Equal(out[0].hs, hs) || out[1].id != 8 || len(out[1].hs) != 0 {
		t.Fatalf("decoded %+v, %v", out, err)
	}
	want := []time.Duration{0, time.Microsecond, time.Millisecond, 2 * time.Millisecond, maxAgeMicros * time.Microsecond}
	if !slices.Equal(out[0].ages, want) {
		t.Fatalf("ages %v, want %v", out[0].ages, want)
	}
	if out[1].ages == nil {
		t.Fatal("an aged snapshot's empty group read as an older replica's")
	}
	if sender != "r0" {
		t.Fatalf("sender %q", sender)
	}
	mine := appendAgedGroup(appendHeader(nil, kindAgedSnapshot, "me"), 7, hs, used, taken)
	if out, err := decode(mine); err != nil || len(out) != 0 {
		t.Fatalf("a snapshot whose sender was refused: %+v, %v", out, err)
	}
	old := appendGroup(appendHeader(nil, kindSnapshot, ""), 7, -1, 0, classSent, hs)
	if out, err := decode(old); err != nil || len(out) != 1 || !slices.Equal(out[0].hs, hs) || out[0].ages != nil {
		t.Fatalf("an older replica's snapshot: %+v, %v", out, err)
	}
	for cut := 6; cut < len(buf); cut++ { // 5: the header alone (with the sender), an empty snapshot
		out, err := decode(buf[:cut])
		if cut < len(buf)-9 && err == nil { // the last 9 bytes are group 8 (an id and n = 0)
			t.Fatalf("cut at %d of %d: no error", cut, len(buf))
		}
		if len(out) > 0 && !slices.Equal(out[0].ages, want) {
			t.Fatalf("cut at %d: a group delivered with ages %v", cut, out[0].ages)
		}
	}
	// Ages of 2^64−1 µs each: capped, not wrapped.
	huge := appendGroup(appendHeader(nil, kindAgedSnapshot, "r0"), 7, -1, 0, classSent, hs[:2])
	huge = binary.AppendUvarint(binary.AppendUvarint(huge, math.MaxUint64), math.MaxUint64)
	if out, err := decode(huge); err != nil || out[0].ages[1] != maxAgeMicros*time.Microsecond {
		t.Fatalf("huge ages: %+v, %v", out, err)
	}
	if _, err := decode([]byte{wireVersion, kindUpdate}); err == nil {
		t.Fatal("an update decoded as a snapshot")
	}
}

// TestSenderNameBounded: an update or leaving notice whose sender name is longer than any
// replica's (maxNameBytes) is refused before the name is taken.
func TestSenderNameBounded(t *testing.T) {
	long := string(make([]byte, maxNameBytes+1))
	for _, kind := range []byte{kindUpdate, kindLeaving} {
		buf := appendHeader(nil, kind, long)
		if kind == kindUpdate {
			buf = appendLoads(buf, nil)
		}
		var err error
		if kind == kindUpdate {
			var ls []peerLoad
			var hs []uint64
			err = decodeUpdate(buf, &ls, &hs, func(string, []peerLoad) { t.Fatal("loads delivered") }, func(group, []uint64) {})
		} else {
			_, err = decodeLeaving(buf)
		}
		if err == nil || !strings.Contains(err.Error(), "over 128") {
			t.Fatalf("kind %d: %v", kind, err)
		}
		if _, err := decodeLeaving(appendHeader(nil, kindLeaving, long[:maxNameBytes])); kind == kindLeaving && err != nil {
			t.Fatalf("a name of maxNameBytes refused: %v", err)
		}
	}
}
