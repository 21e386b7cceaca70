package deploy

import (
	"net"
	"os"
	"slices"
	"strconv"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/prefixlb/prefixlb/configs"
)

// netPolicy is the part of a networking.k8s.io/v1 NetworkPolicy the test reads.
type netPolicy struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		PodSelector labelSelector `yaml:"podSelector"`
		PolicyTypes []string      `yaml:"policyTypes"`
		Ingress     []struct {
			From  []policyPeer `yaml:"from"`
			Ports []struct {
				Port     yaml.Node `yaml:"port"` // a number or a container port name
				Protocol string    `yaml:"protocol"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

type policyPeer struct {
	PodSelector       *labelSelector `yaml:"podSelector"`
	NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
	IPBlock           *struct {
		CIDR string `yaml:"cidr"`
	} `yaml:"ipBlock"`
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []yaml.Node       `yaml:"matchExpressions"`
}

func (s *labelSelector) selects() bool {
	return s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0)
}

// podTemplate is the part of the Deployment that the policy must match: pod labels and
// container ports by name.
type podTemplate struct {
	Spec struct {
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []struct {
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func decodeFile(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func listenPort(t *testing.T, hostPort string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The shipped NetworkPolicy selects prefixlb's pods, leaves the data port open to every
// client, and admits only selected pods (Prometheus) to the admin port, /debug/* included:
// no rule opens it to all sources, to all pods of a namespace or to an IP block, and no rule
// without ports (which would open every port) exists. kustomization.yaml applies it.
func TestNetworkPolicyRestrictsAdminPort(t *testing.T) {
	var np netPolicy
	decodeFile(t, "kubernetes/networkpolicy.yaml", &np)
	var dep podTemplate
	decodeFile(t, "kubernetes/deployment.yaml", &dep)
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	decodeFile(t, "kubernetes/configmap.yaml", &cm)
	cfg, err := configs.Parse([]byte(cm.Data["prefixlb.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap prefixlb.yaml: %v", err)
	}
	dataPort, adminPort := listenPort(t, cfg.Listen), listenPort(t, cfg.AdminListen)

	if np.Kind != "NetworkPolicy" || np.APIVersion != "networking.k8s.io/v1" {
		t.Fatalf("networkpolicy.yaml is %s %s, want networking.k8s.io/v1 NetworkPolicy", np.APIVersion, np.Kind)
	}
	if !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
		t.Errorf("policyTypes %v: without Ingress the policy restricts nothing", np.Spec.PolicyTypes)
	}
	podLabels := dep.Spec.Template.Metadata.Labels
	if len(np.Spec.PodSelector.MatchLabels) == 0 {
		t.Error("the policy's podSelector is empty: it would isolate every pod of the namespace")
	}
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("podSelector %s=%s does not match the Deployment's pods (%v)", k, v, podLabels)
		}
	}
	named := map[string]int{}
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			named[p.Name] = p.ContainerPort
		}
	}
	portOf := func(n *yaml.Node) int {
		if v, err := strconv.Atoi(n.Value); err == nil {
			return v
		}
		v, ok := named[n.Value]
		if !ok {
			t.Errorf("policy port %q names no container port of the Deployment", n.Value)
		}
		return v
	}

	dataOpen, adminAllowed := false, false
	for i, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("ingress[%d] lists no ports: it opens every port, the admin port included, to its sources", i)
			continue
		}
		for _, p := range r.Ports {
			switch portOf(&p.Port) {
			case dataPort:
				if len(r.From) == 0 {
					dataOpen = true
				}
			case adminPort:
				if len(r.From) == 0 {
					t.Errorf("ingress[%d] opens the admin port (%d) to every source", i, adminPort)
				}
				for j, peer := range r.From {
					switch {
					case peer.IPBlock != nil:
						t.Errorf("ingress[%d].from[%d] admits the IP block %s to the admin port", i, j, peer.IPBlock.CIDR)
					case !peer.PodSelector.selects():
						t.Errorf("ingress[%d].from[%d] admits every pod (of the namespaces selected) to the admin port: select Prometheus's pods", i, j)
					default:
						adminAllowed = true
					}
				}
			}
		}
	}
	if !dataOpen {
		t.Errorf("no rule opens the data port (%d) to every client", dataPort)
	}
	if !adminAllowed {
		t.Errorf("no rule admits Prometheus to the admin port (%d): /metrics would go unscraped", adminPort)
	}

	var k struct {
		Resources []string `yaml:"resources"`
	}
	decodeFile(t, "kubernetes/kustomization.yaml", &k)
	if !slices.Contains(k.Resources, "networkpolicy.yaml") {
		t.Errorf("kustomization.yaml resources %v do not include networkpolicy.yaml", k.Resources)
	}
}
