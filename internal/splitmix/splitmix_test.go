package splitmix

import "testing"

// TestKnownValues: the first outputs of splitmix64 seeded with 0 and 1234567 (the reference
// generator's sequence, each Next of the state advanced by gamma), and Mix(0) = 0.
func TestKnownValues(t *testing.T) {
	for _, c := range []struct {
		seed uint64
		want []uint64
	}{
		{0, []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}},
		{1234567, []uint64{6457827717110365317, 3203168211198807973, 9817491932198370423}},
	} {
		state := c.seed
		for i, w := range c.want {
			if got := Next(state); got != w {
				t.Errorf("seed %d, output %d: %#x, want %#x", c.seed, i, got, w)
			}
			state += gamma
		}
	}
	if Mix(0) != 0 {
		t.Errorf("Mix(0) = %#x, want 0", Mix(0))
	}
}
