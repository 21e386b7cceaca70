package backend

// Senders is what a prefixlb replica has learned of who else sends requests to a backend:
// the health checker compares the requests the replica reports finished with those this
// proxy finished there (health/senders.go). The prefix policy's tie_break auto breaks
// near-ties by load only while every candidate is SendersAlone.
type Senders int32

const (
	// SendersUnknown: not judged yet, or the replica reports no request counter.
	SendersUnknown Senders = iota
	// SendersAlone: every request the replica finished lately came through this proxy.
	SendersAlone
	// SendersShared: the replica finished requests this proxy did not send (another
	// prefixlb replica, another client).
	SendersShared
)

// String is the verdict's name in logs and /debug: unknown, alone or shared.
func (s Senders) String() string {
	switch s {
	case SendersAlone:
		return "alone"
	case SendersShared:
		return "shared"
	}
	return "unknown"
}
