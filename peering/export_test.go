package peering

// Crash stops n as a crash of its process would: no leave message to the peers (they
// declare it dead by probing), its peer port closed. For the external tests (restart_test.go).
func (n *Node) Crash() {
	n.stopOnce.Do(func() {
		close(n.stop)
		n.markReady()
		_ = n.ml.Shutdown()
	})
	n.wg.Wait()
}
