package proxy

// The relay of a response's body to the client: fasthttp calls flow.Read until EOF, then
// flow.CloseWithError once (flow.go); an HTTP/1.0 client's relay runs on the hijacked
// connection (flow.relayClosing). Read is the relay's start, flow.read its reading of the
// backend's body; a panic in either is contained here (recover.go says where else a
// request's serving contains panics).

// Read relays the backend's body (read), with a panic in it contained: the flow is abandoned
// and the error ends the relay, so fasthttp closes the client's connection.
func (f *flow) Read(p []byte) (n int, err error) {
	defer f.containRead(&n, &err)
	if f.s.testPanic != nil && f.bytes > 0 {
		f.s.testPanic(stageRelay)
	}
	return f.read(p)
}

// containRead is Read's deferred recover.
func (f *flow) containRead(n *int, err *error) {
	if p := recover(); p != nil {
		*n, *err = 0, errPanicked
		f.panicked(p, logRelayPanic, "relay")
	}
}
