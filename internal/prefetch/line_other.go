//go:build !amd64 && !arm64

package prefetch

// Line hints that the cache line holding addr will be read soon: nothing here, where the
// package has no assembly.
func Line(addr uintptr) {}
