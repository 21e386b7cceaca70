package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dockerfile is what the tests read of ../Dockerfile: the build command its header documents,
// the Go image of the build stage, and the final stage's user, entrypoint and command.
type dockerfile struct {
	buildTag      string // docker build -t TAG .
	goImage       string // the first FROM's image
	user          string // the final stage's USER
	entrypoint    []string
	cmd           []string
	finalFromLine string
}

var buildCommentRe = regexp.MustCompile(`^# Build: docker build -t (\S+) \.$`)

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := buildCommentRe.FindStringSubmatch(line); m != nil {
			d.buildTag = m[1]
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			if d.goImage == "" {
				d.goImage = strings.Fields(arg)[0]
			}
			d.finalFromLine, d.user, d.entrypoint, d.cmd = line, "", nil, nil // a new stage
		case "USER":
			d.user = arg
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(arg), &d.entrypoint); err != nil {
				t.Fatalf("ENTRYPOINT %s: want the exec (JSON) form: %v", arg, err)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(arg), &d.cmd); err != nil {
				t.Fatalf("CMD %s: want the exec (JSON) form: %v", arg, err)
			}
		}
	}
	return d
}

// TestImageMatchesChart: the image the Dockerfile's header says to build is the chart's
// default image, and the one docs/kubernetes.md builds; the Go image is go.mod's version
// (the official Go images do not fetch a newer toolchain); the final stage runs as the
// non-root user the chart's securityContext names, the entrypoint is the binary, and its
// default command reads the config where the chart mounts it.
func TestImageMatchesChart(t *testing.T) {
	d := readDockerfile(t)
	r := chartCases[0].rel.template(t)
	dep, ctr, _, _ := workload(t, r)
	if d.buildTag != ctr.Image {
		t.Errorf("the Dockerfile builds %q; the chart runs %q by default", d.buildTag, ctr.Image)
	}
	doc, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "docker build -t " + d.buildTag + " ."; !bytes.Contains(doc, []byte(want)) {
		t.Errorf("docs/kubernetes.md does not build the image with %q", want)
	}

	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if goVersion == nil || d.goImage != "golang:"+string(goVersion[1]) {
		t.Errorf("the build stage is FROM %s; go.mod wants go %s: want golang:%s", d.goImage, goVersion[1], goVersion[1])
	}

	uid, gid, ok := strings.Cut(d.user, ":")
	u, errU := strconv.ParseInt(uid, 10, 64)
	g, errG := strconv.ParseInt(gid, 10, 64)
	if !ok || errU != nil || errG != nil || u == 0 {
		t.Fatalf("the final stage's USER %q: want a numeric non-root uid:gid (the kubelet checks runAsNonRoot on numbers)", d.user)
	}
	psc := dep.Spec.Template.Spec.SecurityContext
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != u || psc.RunAsGroup == nil || *psc.RunAsGroup != g {
		t.Errorf("the image runs as %d:%d; the chart's securityContext says %v:%v", u, g, psc.RunAsUser, psc.RunAsGroup)
	}
	if !strings.Contains(d.finalFromLine, "distroless/static") {
		t.Errorf("final stage %q: the chart's preStop is the sleep action because the image has no shell; a base with one should say so", d.finalFromLine)
	}
	if !slices.Equal(d.entrypoint, []string{"/prefixlb"}) {
		t.Errorf("ENTRYPOINT %q, want [/prefixlb]", d.entrypoint)
	}
	if !slices.Equal(d.cmd, ctr.Args) {
		t.Errorf("CMD %q; the chart runs %q: the image's default must read the config where the chart mounts it", d.cmd, ctr.Args)
	}
}
