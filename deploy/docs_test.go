package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/configs"
)

// shellCommands returns the commands of a Markdown file's ```sh blocks, one per line (lines
// ending in a backslash joined to the next), in order.
func shellCommands(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in, cont := false, ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in:
			if s, ok := strings.CutSuffix(line, `\`); ok {
				cont += s
				continue
			}
			if cmd := strings.TrimSpace(cont + line); cmd != "" {
				out = append(out, cmd)
			}
			cont = ""
		}
	}
	return out
}

// shellWords splits a command line as bash does (quotes, escapes, comments), without running
// it: bash prints the words of the line, each followed by NUL.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	if strings.ContainsAny(line, "`$;|&<>") {
		// Only commands whose words need no expansion are split (a $(...) would run).
		return nil
	}
	out, err := exec.Command("bash", "-c", `words() { printf '%s\0' "$@"; }; words `+line).Output()
	if err != nil {
		t.Fatalf("bash cannot split %q: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// TestDocsKubernetesCommands runs the Kubernetes commands of docs/kubernetes.md as far as they
// run without a cluster: each helm install is rendered with the same arguments (helm
// template; an upgrade with --reuse-values on top of the install before it) and checked as
// TestChart checks a render, prefixlb's config included; the image each install runs is the
// one the docs built, loaded or pushed just before; the deployment/ and service/ that kubectl
// commands name exist in the last render; a peering Secret the chart does not make was made
// by a kubectl command before.
func TestDocsKubernetesCommands(t *testing.T) {
	const doc = "../docs/kubernetes.md"
	var (
		built, last []string // images built (or loaded, pushed) so far; the last install's args
		secrets     []string // Secrets made by kubectl create secret
		r           *rendered
		installs    int
	)
	nameRe := regexp.MustCompile(`\b(deployment|service|svc)/([a-z0-9-]+)`)
	for _, line := range shellCommands(t, doc) {
		w := strings.Fields(line)
		switch {
		case len(w) == 5 && w[0] == "docker" && w[1] == "build" && w[2] == "-t" && w[4] == ".":
			built = append(built, w[3])
		case len(w) >= 3 && w[0] == "docker" && w[1] == "push", len(w) >= 4 && w[0] == "kind" && w[1] == "load" && w[2] == "docker-image":
			if img := w[len(w)-1]; !slices.Contains(built, img) {
				t.Errorf("%q: the docs did not build %s before", line, img)
			}
		case len(w) >= 5 && w[0] == "kubectl" && w[1] == "create" && w[2] == "secret":
			secrets = append(secrets, w[4])
		case w[0] == "kubectl":
			for _, m := range nameRe.FindAllStringSubmatch(line, -1) {
				if r == nil {
					t.Errorf("%q: no helm install before it", line)
					continue
				}
				if m[1] == "deployment" && r.deployments[m[2]] == nil || m[1] != "deployment" && r.services[m[2]] == nil {
					t.Errorf("%q: the release has no %s %s", line, m[1], m[2])
				}
			}
		case w[0] == "helm":
			args := shellWords(t, line)
			if len(args) < 4 || args[0] != "helm" || (args[1] != "install" && args[1] != "upgrade") {
				t.Errorf("%q: want helm install or helm upgrade RELEASE CHART [flags]", line)
				continue
			}
			flags := args[4:]
			if args[1] == "upgrade" {
				if !slices.Contains(flags, "--reuse-values") || last == nil {
					t.Errorf("%q: an upgrade in the docs reuses the values of an install before it", line)
					continue
				}
				flags = slices.Concat(last, slices.DeleteFunc(flags, func(f string) bool { return f == "--reuse-values" }))
			} else {
				installs++
				last = flags
			}
			// The docs run at the repository root.
			out, err := runHelmIn(t, "..", slices.Concat([]string{"template", args[2], args[3]}, flags)...)
			if err != nil {
				t.Errorf("%q: %v", line, err)
				continue
			}
			r = decodeRendered(t, out)
			dep, ctr, cm, file := workload(t, r)
			if _, err := configs.Parse([]byte(cm.Data[file[strings.LastIndex(file, "/")+1:]])); err != nil {
				t.Errorf("%q: prefixlb refuses the config: %v", line, err)
			}
			checkPodSecurity(t, dep)
			if !slices.Contains(built, ctr.Image) {
				t.Errorf("%q runs the image %s; the docs built %v before it", line, ctr.Image, built)
			}
			for _, v := range dep.Spec.Template.Spec.Volumes {
				if s := v.Secret; s != nil && r.secrets[s.SecretName] == nil && !slices.Contains(secrets, s.SecretName) {
					t.Errorf("%q mounts the Secret %s, which neither the chart nor the docs make", line, s.SecretName)
				}
			}
		}
	}
	if installs == 0 || len(built) == 0 {
		t.Errorf("%s: %d helm installs, %d docker builds; want the install in a few commands", doc, installs, len(built))
	}
}
