package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// trackingPolicy is a router.Tracker that sends every request to its first candidate and
// records what the proxy tells it, with the stamp each call names.
type trackingPolicy struct {
	mu     sync.Mutex
	next   router.Learned
	events []string
}

func (p *trackingPolicy) note(e string, l router.Learned) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, fmt.Sprintf("%s %d", e, l))
}

func (p *trackingPolicy) Pick(_ *key.Key, cs []*backend.Backend) router.Decision {
	return router.Decision{Backend: cs[0], Reason: router.ReasonCold}
}
func (p *trackingPolicy) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.Pick(k, cs)
}
func (p *trackingPolicy) Learn(*key.Key, *backend.Backend, int) router.Learned {
	p.mu.Lock()
	p.next++
	l := p.next
	p.mu.Unlock()
	p.note("learn", l)
	return l
}
func (p *trackingPolicy) Unlearn(_ *key.Key, _ *backend.Backend, l router.Learned) {
	p.note("unlearn", l)
}
func (p *trackingPolicy) Correct(*key.Key, *backend.Backend, router.Learned, router.CacheReport) int {
	return 0
}
func (p *trackingPolicy) Prefilled(_ *key.Key, _ *backend.Backend, l router.Learned) {
	p.note("prefilled", l)
}
func (p *trackingPolicy) Finished(_ *key.Key, _ *backend.Backend, l router.Learned) {
	p.note("finished", l)
}

var _ router.Tracker = (*trackingPolicy)(nil)

// TestTrackerFollowsRequests: a Tracker hears, for each request it learned, that its first
// token arrived and that it ended (streamed and not); a refused request is unlearned and
// neither prefilled nor finished.
func TestTrackerFollowsRequests(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "refuse"):
			w.WriteHeader(http.StatusBadRequest)
		case strings.Contains(string(b), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}]}`)
		}
	}))
	defer ts.Close()
	pol := &trackingPolicy{}
	s, url := startProxy(t, "prefix", []string{ts.URL}, func(o *Options) { o.Policy = pol })
	for _, extra := range []string{`,"stream":true`, ``, `,"user":"refuse"`} {
		body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 50) + `"}]` + extra + `}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		waitInFlightZero(t, s)
	}
	want := "learn 1\nprefilled 1\nfinished 1\nlearn 2\nprefilled 2\nfinished 2\nlearn 3\nunlearn 3"
	pol.mu.Lock()
	got := strings.Join(pol.events, "\n")
	pol.mu.Unlock()
	if got != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got, want)
	}
}

// TestTrackerHearsPanickedRequestEnd: a request whose serving panicked once it was sent (the
// response head read, mid-relay, in the release) has ended on its backend as far as a Tracker
// is concerned: it hears Finished once, as for any request that failed, so that what it
// counts active there (Dynamo's active sequences) does not keep the request for ever.
func TestTrackerHearsPanickedRequestEnd(t *testing.T) {
	for _, c := range []struct {
		stage panicStage
		hold  bool
		want  string
	}{
		{stageHead, true, "learn 1\nfinished 1"},
		{stageRelay, true, "learn 1\nprefilled 1\nfinished 1"},
		{stageFinish, false, "learn 1\nprefilled 1\nfinished 1"},
	} {
		t.Run(c.stage.String(), func(t *testing.T) {
			r := newPanicReplica(t)
			pol := &trackingPolicy{}
			hook, armed := panicAt(c.stage)
			log, _ := recordingLogger()
			s, base := startProxy(t, "prefix", []string{r.srv.URL}, func(o *Options) { o.Policy, o.Log = pol, log }, hook)
			prompt := "first request"
			if c.hold {
				prompt = holdPrompt
			}
			armed.Store(true)
			resp, err := testClient().Post(base+"/v1/chat/completions", "application/json", strings.NewReader(panicChatBody(prompt)))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if armed.Load() {
				t.Fatal("the injected panic did not fire")
			}
			checkReleased(t, s)
			pol.mu.Lock()
			got := strings.Join(pol.events, "\n")
			pol.mu.Unlock()
			if got != c.want {
				t.Fatalf("events:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}
