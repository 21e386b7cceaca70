package deploy

import (
	"bytes"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// helmInstall is how .ci/run installs helm (the Go module proxy builds the real binary);
// TestCIInstallsHelm keeps the two equal. The chart works with Helm 3 too (tested by hand
// with v3.22.1).
const helmInstall = "go install helm.sh/helm/v4/cmd/helm@v4.3.2"

// chartDir is the chart, relative to this package.
const chartDir = "helm/prefixlb"

// helmBinary returns the helm to run: on PATH, else in GOPATH/bin (where go install puts it).
// Without one the test skips, except under CI=true, where .ci/run installs it and its absence
// is a failure.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	for _, dir := range filepath.SplitList(build.Default.GOPATH) {
		p := filepath.Join(dir, "bin", "helm")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	msg := "helm not installed (neither on PATH nor in GOPATH/bin): " + helmInstall
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; .ci/run installs it, so CI must have it")
	}
	t.Skip(msg + "; the chart is not rendered")
	return ""
}

// runHelm runs helm with args in this package's directory, with helm's cache, config and data
// directories in a temporary one (nothing in the user's home is read or written). It returns
// stdout, and stderr in the error.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return runHelmIn(t, "", args...)
}

// runHelmIn is runHelm in the directory dir.
func runHelmIn(t *testing.T, dir string, args ...string) ([]byte, error) {
	t.Helper()
	bin := helmBinary(t)
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.Bytes(), nil
}

// release is how the tests install the chart: a release name and namespace that are not the
// chart's defaults, so that a name written into a template instead of derived shows.
type release struct {
	name, namespace string
	set             []string // --set arguments
	setString       []string // --set-string arguments
}

func (r release) args() []string {
	args := []string{r.name, chartDir, "--namespace", r.namespace}
	for _, s := range r.set {
		args = append(args, "--set", s)
	}
	for _, s := range r.setString {
		args = append(args, "--set-string", s)
	}
	return args
}

// template renders the release (helm template) and decodes every object.
func (r release) template(t *testing.T) *rendered {
	t.Helper()
	out, err := runHelm(t, append([]string{"template"}, r.args()...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRendered(t, out)
}

// lint runs helm lint --strict with the release's values: warnings fail too.
func (r release) lint(t *testing.T) {
	t.Helper()
	args := append([]string{"lint", "--strict", chartDir, "--namespace", r.namespace}, r.args()[2:]...)
	if out, err := runHelm(t, args...); err != nil {
		t.Fatal(err)
	} else if !bytes.Contains(out, []byte("0 chart(s) failed")) {
		t.Fatalf("helm lint: %s", out)
	}
}

// serviceMonitor is the part of a monitoring.coreos.com/v1 ServiceMonitor the chart writes
// (prometheus-operator's types are not a dependency; the strict decoding below still refuses
// any field not listed here).
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is a chart's output, each object decoded into its Kubernetes API type.
type rendered struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	policies    map[string]*networkingv1.NetworkPolicy
	pdbs        map[string]*policyv1.PodDisruptionBudget
	hpas        map[string]*autoscalingv2.HorizontalPodAutoscaler
	monitors    map[string]*serviceMonitor
}

// decodeRendered decodes helm's output strictly: an object of a kind the chart should not
// make, an apiVersion other than the one the test knows, a field its API type does not have
// (a misspelt readOnlyRootFilesystem would be dropped by the API server without a word) or a
// duplicated field fails the test.
func decodeRendered(t *testing.T, out []byte) *rendered {
	t.Helper()
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		policies: map[string]*networkingv1.NetworkPolicy{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, monitors: map[string]*serviceMonitor{},
	}
	for i, doc := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(bytes.TrimPrefix(doc, []byte("---")))) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		var (
			obj any
			dup bool
		)
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			obj, dup = add(r.deployments, head.Metadata.Name)
		case "v1 Service":
			obj, dup = add(r.services, head.Metadata.Name)
		case "v1 ConfigMap":
			obj, dup = add(r.configMaps, head.Metadata.Name)
		case "v1 Secret":
			obj, dup = add(r.secrets, head.Metadata.Name)
		case "networking.k8s.io/v1 NetworkPolicy":
			obj, dup = add(r.policies, head.Metadata.Name)
		case "policy/v1 PodDisruptionBudget":
			obj, dup = add(r.pdbs, head.Metadata.Name)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			obj, dup = add(r.hpas, head.Metadata.Name)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			obj, dup = add(r.monitors, head.Metadata.Name)
		default:
			t.Fatalf("document %d: unexpected %s %s %q", i, head.APIVersion, head.Kind, head.Metadata.Name)
		}
		if dup {
			// The API server would answer the second with a conflict; the maps would hide it.
			t.Fatalf("two %s objects named %q", head.Kind, head.Metadata.Name)
		}
		// As the API server decodes: field names match case-sensitively (encoding/json alone
		// would take readOnlyRootFileSystem for readOnlyRootFilesystem).
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s %s: %v", head.Kind, head.Metadata.Name, err)
		}
		strict, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err != nil || len(strict) > 0 {
			t.Fatalf("%s %s: %v %v", head.Kind, head.Metadata.Name, err, strict)
		}
	}
	return r
}

// add puts a new object under name in m and returns it, and whether name was taken.
func add[T any](m map[string]*T, name string) (any, bool) {
	_, dup := m[name]
	v := new(T)
	m[name] = v
	return v, dup
}

// TestCIInstallsHelm: .ci/run installs the helm these tests name, so that a bump of one is a
// bump of both.
func TestCIInstallsHelm(t *testing.T) {
	data, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("\n"+helmInstall+"\n")) {
		t.Errorf(".ci/run does not run %q", helmInstall)
	}
}
