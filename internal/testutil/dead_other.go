//go:build !unix

package testutil

import "testing"

// deadAddr is FreeAddr where binding without listening is not available (dead_unix.go).
func deadAddr(t testing.TB) string {
	t.Helper()
	return FreeAddr(t)
}
