// Package prefetch asks the CPU to start loading a cache line that the caller will read
// soon, so that several misses to memory overlap instead of each waiting for the one before.
// Go has no prefetch built in (the runtime's own is internal); these are one instruction each
// in assembly: PREFETCHT0 on amd64, PRFM PLDL1KEEP on arm64, nothing elsewhere.
//
// A prefetch is a hint: it never faults, whatever the address (a stale or unmapped one is
// dropped), and it reads nothing that the Go memory model or the race detector sees, so an
// address computed from a table that has since been replaced is harmless.
package prefetch
