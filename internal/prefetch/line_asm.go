//go:build amd64 || arm64

package prefetch

// Line hints that the cache line holding addr will be read soon.
//
//go:noescape
func Line(addr uintptr)
