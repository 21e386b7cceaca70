package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// rawServer records every request body byte for byte and replies "ok<n>" in one content chunk.
type rawServer struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (s *rawServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	s.mu.Lock()
	s.bodies = append(s.bodies, b)
	n := len(s.bodies)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok%d\"}}]}\n\ndata: [DONE]\n\n", n)
}

// goldenMultiTurnBody is the third request of one 3-turn conversation with a system message, as
// the loadgen sent it before tool calls were added (captured from that code): the
// agentic workload's fields must not change other workloads' bytes.
const goldenMultiTurnBody = `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"first \"q\""},{"role":"assistant","content":"ok1"},{"role":"user","content":"second"},{"role":"assistant","content":"ok2"},{"role":"user","content":"third \u003cx\u003e"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true}`

func TestMultiTurnBodyBytesUnchanged(t *testing.T) {
	s := &rawServer{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	w := &workload.Workload{Name: "golden", API: workload.Chat, Loop: workload.Closed, Users: 1,
		Conversations: []*workload.Conversation{{System: "be brief", Turns: []workload.Turn{
			{User: "first \"q\"", MaxTokens: 3}, {User: "second", MaxTokens: 4}, {User: "third <x>", MaxTokens: 5}}}}}
	if _, err := Run(context.Background(), w, Options{Client: newTestClient(srv.URL), RequestTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if len(s.bodies) != 3 {
		t.Fatalf("%d requests, want 3", len(s.bodies))
	}
	if got := string(s.bodies[2]); got != goldenMultiTurnBody {
		t.Fatalf("body changed:\n got %s\nwant %s", got, goldenMultiTurnBody)
	}
}
