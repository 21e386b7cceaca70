package app

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// --backend flags are checked as the config file is: a URL with credentials is refused before
// anything listens, with an error that names the flag and does not repeat the secret.
func TestServeRefusesBackendFlagWithCredentials(t *testing.T) {
	const secret = "s3cret"
	cmd := ServeCommand()
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-level", "error",
		"--backend", "http://127.0.0.1:1", "--backend", "http://user:" + secret + "@127.0.0.1:2"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SilenceUsage = true
	// Accepted, the command would serve until ctx ends and return nil.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout/2)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	err := testutil.RecvWithin(t, done, testutil.Timeout, "prefixlb serve returns")
	const want = `--backend (#2): "http://xxxxx@127.0.0.1:2" has credentials`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("serve with a credentialed --backend: %v; want an error containing %q", err, want)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error repeats the secret: %v", err)
	}
}
