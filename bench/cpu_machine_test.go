package bench

import (
	"testing"
	"time"
)

func TestMachineTimes(t *testing.T) {
	for _, c := range []struct {
		name        string
		stat        string
		busy, steal time.Duration
		ok          bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"linux 5+", "cpu  100 20 30 9000 50 4 6 7 0 0\ncpu0 50 10 15 4500 25 2 3 4 0 0\nintr 1 2\n",
			1600 * time.Millisecond, 70 * time.Millisecond, true},
		{"idle and iowait are not busy", "cpu  0 0 0 123456 789 0 0 0\n", 0, 0, true},
		{"the summary line, not a core's", "intr 5\ncpu0 1 1 1 1 1 1 1 1\ncpu  200 0 0 0 0 0 0 0\n", 2 * time.Second, 0, true},
		{"too few fields (a kernel before steal)", "cpu  1 2 3 4 5 6 7\n", 0, 0, false},
		{"not a number", "cpu  1 x 3 4 5 6 7 8\n", 0, 0, false},
		{"negative", "cpu  1 -2 3 4 5 6 7 8\n", 0, 0, false},
		{"no cpu line", "intr 1\nctxt 2\n", 0, 0, false},
		{"empty", "", 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			busy, steal, ok := machineTimes([]byte(c.stat))
			if busy != c.busy || steal != c.steal || ok != c.ok {
				t.Fatalf("got busy %v steal %v ok %v, want %v %v %v", busy, steal, ok, c.busy, c.steal, c.ok)
			}
		})
	}
}

func TestMachineLoadOthers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64, busy, steal time.Duration) machineLoad {
		return machineLoad{at: t0.Add(time.Duration(s * float64(time.Second))), busy: busy, steal: steal, ok: true}
	}
	for _, c := range []struct {
		name          string
		from, to      machineLoad
		own           time.Duration
		other, stolen float64
		ok            bool
	}{
		{"others used a core for 10 s beside the bench's 1.5", at(0, time.Minute, 0), at(10, time.Minute+25*time.Second, 2*time.Second), 15 * time.Second, 1, 0.2, true},
		{"a quiet machine: only the bench", at(0, 0, 0), at(10, 15*time.Second, 0), 15 * time.Second, 0, 0, true},
		{"own CPU counted past the machine's ticks: never below 0", at(0, 0, 0), at(10, 14*time.Second, 0), 15 * time.Second, 0, 0, true},
		{"no reading before", machineLoad{}, at(10, time.Second, 0), 0, 0, 0, false},
		{"no reading after", at(0, 0, 0), machineLoad{at: t0.Add(time.Second)}, 0, 0, 0, false},
		{"no time passed", at(5, 0, 0), at(5, time.Second, 0), 0, 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			other, stolen, ok := c.from.others(c.to, c.own)
			if ok != c.ok || !near(other, c.other) || !near(stolen, c.stolen) {
				t.Fatalf("got %.3f, %.3f, %v; want %.3f, %.3f, %v", other, stolen, ok, c.other, c.stolen, c.ok)
			}
		})
	}
}

// near is equality within rounding of float seconds.
func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
