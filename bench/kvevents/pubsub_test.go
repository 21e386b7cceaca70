package kvevents

import (
	"testing"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestPublisherCloseAfterSubscriberLeft: a publisher closed after its subscriber has gone
// returns no error. The socket's reader closes a connection its peer closed and the socket
// forgets it only later (asynchronously), so the socket's Close may close it a second time
// ("use of closed network connection"); that is not a failure of the publisher's Close.
// Pairs are repeated since the window between the two is narrow.
func TestPublisherCloseAfterSubscriberLeft(t *testing.T) {
	for i := range 100 {
		pub, err := NewPublisher("tcp://127.0.0.1:0", "", 0)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := Subscribe(NewIndex(), "w", pub.Endpoint())
		if err != nil {
			pub.Close()
			t.Fatal(err)
		}
		testutil.Eventually(t, testutil.Timeout, "the subscription to reach the publisher", pub.Subscribed)
		if err := sub.Close(); err != nil {
			t.Errorf("pair %d: subscriber's Close: %v", i, err)
		}
		if err := pub.Close(); err != nil {
			t.Fatalf("pair %d: publisher's Close after the subscriber left: %v", i, err)
		}
		if err := pub.Close(); err != nil {
			t.Fatalf("pair %d: second Close: %v", i, err)
		}
	}
}
