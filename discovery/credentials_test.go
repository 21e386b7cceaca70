package discovery

import (
	"context"
	"net"
	"strings"
	"testing"
)

// A record that would make a backend URL with credentials, or anything but a plain
// http(s)://host:port, fails the resolution (the previous list keeps serving); the error
// names the record and does not repeat the secret.
func TestResolveRefusesBadRecords(t *testing.T) {
	const secret = "s3cret"
	cases := []struct {
		name string
		srv  []*net.SRV
		want string
	}{
		{"credentials", []*net.SRV{{Target: "vllm-0.vllm.", Port: 8000}, {Target: secret + "@evil.", Port: 8000}},
			`record 1: "http://xxxxx@evil:8000" has credentials`},
		{"path", []*net.SRV{{Target: "evil/v1.", Port: 8000}}, "record 0:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := DNS{Name: "_http._tcp.vllm", SRV: true, Resolver: &fakeResolver{srv: c.srv}}
			urls, err := d.Resolve(context.Background())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Resolve = %v, %v; want an error containing %q", urls, err, c.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error repeats the secret: %v", err)
			}
		})
	}
}
