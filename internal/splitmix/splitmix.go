// Package splitmix is splitmix64's mixing: the finaliser of Steele, Lea and Flood's SplitMix
// ("Fast splittable pseudorandom number generators", OOPSLA 2014) with the constants of
// Vigna's splitmix64.c. Mix is a bijection on 64-bit values whose every input bit flips about
// half of the output bits: cheap keys and tie-breaks from IDs, counters and stamps, and
// reproducible pseudo-random workloads. Not for anything an adversary chooses.
package splitmix

// gamma is splitmix64's increment, 2^64 divided by the golden ratio, rounded to odd.
const gamma = 0x9e3779b97f4a7c15

// Mix is the finaliser alone.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Next is one step of the generator from state x: Mix(x + gamma), the value splitmix64 returns
// after advancing from x.
func Next(x uint64) uint64 { return Mix(x + gamma) }
