package bench

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's CPU times: USER_HZ, 100 ticks a second on every Linux
// architecture Go builds for (the kernel converts its own tick rate to it for user space).
const userHZ = 100

// MaxOtherShare is the CPU, as a share of the machine's cores, that other processes may use
// during an arm before the bench flags it: the bench's own timing (the sims' steps, the
// proxy, the load generator) shares the cores, and a compile or a test run beside it moved
// the approximate arms' Mooncake p95 4–9× while the stall check saw nothing (bench/RESULTS.md,
// the suite claim's notes). In 10 s samples over two hours of suite runs on the quiet 2-core
// machine, other processes used at most 0.03 cores in 95% of them (bench/README.md).
const MaxOtherShare = 0.10

// machineTimes is the machine's CPU time so far from /proc/stat's first ("cpu") line: busy is
// user, nice, system, irq and softirq summed over every core; steal is the time the
// hypervisor ran another guest while this one had work. ok is false when the line is
// missing or malformed.
func machineTimes(procStat []byte) (busy, steal time.Duration, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(procStat))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		// cpu user nice system idle iowait irq softirq steal ...
		if len(f) < 9 {
			return 0, 0, false
		}
		var v [8]int64
		for i := range v {
			n, err := strconv.ParseInt(f[i+1], 10, 64)
			if err != nil || n < 0 {
				return 0, 0, false
			}
			v[i] = n
		}
		tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
		return tick(v[0] + v[1] + v[2] + v[5] + v[6]), tick(v[7]), true
	}
	return 0, 0, false
}

// machineLoad is what the machine's other processes and its hypervisor took from the cores
// while an arm ran, beside the bench process: take a reading before the arm (readMachineLoad)
// and call others after it with the bench process's CPU over the same span.
type machineLoad struct {
	at          time.Time
	busy, steal time.Duration
	ok          bool
}

// readMachineLoad reads the machine's CPU times now (ok false where /proc/stat is not there).
func readMachineLoad() machineLoad {
	busy, steal, ok := machineCPU()
	return machineLoad{at: time.Now(), busy: busy, steal: steal, ok: ok}
}

// others is the CPU, in cores, that other processes used since l (the machine's busy time
// less own, the bench process's CPU over the same span, never below 0) and the hypervisor's
// steal in cores; ok is false without both readings.
func (l machineLoad) others(now machineLoad, own time.Duration) (otherCores, stealCores float64, ok bool) {
	wall := now.at.Sub(l.at).Seconds()
	if !l.ok || !now.ok || wall <= 0 {
		return 0, 0, false
	}
	return max(0, (now.busy-l.busy-own).Seconds()/wall), max(0, (now.steal-l.steal).Seconds()/wall), true
}
