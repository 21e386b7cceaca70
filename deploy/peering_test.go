package deploy

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/peering"
)

// The parts of the manifests the peering checks read.
type (
	peerDeployment struct {
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
							Protocol      string `yaml:"protocol"`
						} `yaml:"ports"`
						VolumeMounts []struct {
							Name      string `yaml:"name"`
							MountPath string `yaml:"mountPath"`
							ReadOnly  bool   `yaml:"readOnly"`
						} `yaml:"volumeMounts"`
					} `yaml:"containers"`
					Volumes []struct {
						Name   string `yaml:"name"`
						Secret *struct {
							SecretName string `yaml:"secretName"`
						} `yaml:"secret"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	peerService struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			ClusterIP                string            `yaml:"clusterIP"`
			PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
			Selector                 map[string]string `yaml:"selector"`
			Ports                    []struct {
				Port       int    `yaml:"port"`
				TargetPort string `yaml:"targetPort"`
				Protocol   string `yaml:"protocol"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	secretManifest struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		StringData map[string]string `yaml:"stringData"`
		Data       map[string]string `yaml:"data"`
	}
)

// containerPort is one container port of the Deployment, by name.
type containerPort struct {
	port     int
	protocol string // TCP when the manifest leaves it out
}

func (d *peerDeployment) ports() map[string]containerPort {
	out := map[string]containerPort{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = "TCP"
			}
			out[p.Name] = containerPort{p.ContainerPort, proto}
		}
	}
	return out
}

// selectsPods reports whether a selector (non-empty) matches pods with labels.
func selectsPods(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// peeringConfig is the ConfigMap's config (validated by configs.Parse) and its peer port.
func peeringConfig(t *testing.T) (*configs.Config, int) {
	t.Helper()
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	decodeFile(t, "kubernetes/configmap.yaml", &cm)
	cfg, err := configs.Parse([]byte(cm.Data["prefixlb.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap prefixlb.yaml: %v", err)
	}
	if cfg.Peering == nil {
		t.Fatal("the ConfigMap's config has no peering section: the Deployment's replicas would route unpeered")
	}
	return cfg, listenPort(t, cfg.Peering.Listen)
}

// TestPeeringManifests: the ConfigMap's config turns peering on (it validates) on a port that
// is neither the data nor the admin port; the Deployment exposes that port over TCP and UDP
// and mounts the Secret read-only where peering.secret_file points; the headless Service
// peering.dns names selects the Deployment's pods (as the data Service does), not-ready
// ones included, on both protocols; the Secret's placeholder is a value prefixlb refuses.
func TestPeeringManifests(t *testing.T) {
	cfg, peerPort := peeringConfig(t)
	if peerPort == listenPort(t, cfg.Listen) || peerPort == listenPort(t, cfg.AdminListen) {
		t.Errorf("peering.listen %s shares the data (%s) or admin (%s) port", cfg.Peering.Listen, cfg.Listen, cfg.AdminListen)
	}
	var dep peerDeployment
	decodeFile(t, "kubernetes/deployment.yaml", &dep)
	ports := dep.ports()
	byProto := map[string]string{} // protocol → the container port name serving peerPort
	for name, p := range ports {
		if p.port == peerPort {
			byProto[p.protocol] = name
		}
	}
	if byProto["TCP"] != "peer" || byProto["UDP"] == "" {
		t.Errorf("the Deployment's container ports for %d: %v; want one named peer (TCP) and one over UDP", peerPort, byProto)
	}

	var svc peerService
	decodeFile(t, "kubernetes/peers-headless.yaml", &svc)
	if svc.Kind != "Service" || svc.Spec.ClusterIP != "None" || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("peers-headless.yaml: kind %s clusterIP %q publishNotReadyAddresses %v; want a headless Service that publishes not-ready pods (they join before they are ready)",
			svc.Kind, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	var data peerService
	decodeFile(t, "kubernetes/service.yaml", &data)
	for _, s := range []peerService{svc, data} {
		if labels := dep.Spec.Template.Metadata.Labels; !selectsPods(s.Spec.Selector, labels) {
			t.Errorf("Service %s selector %v does not select the Deployment's pods (%v)", s.Metadata.Name, s.Spec.Selector, labels)
		}
	}
	served := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = "TCP"
		}
		target, ok := ports[p.TargetPort]
		if n, err := strconv.Atoi(p.TargetPort); err == nil {
			target, ok = containerPort{n, proto}, true
		}
		if p.Port != peerPort || !ok || target.port != peerPort || target.protocol != proto {
			t.Errorf("Service %s port %d → %q (%s) is not the peer port %d", svc.Metadata.Name, p.Port, p.TargetPort, proto, peerPort)
			continue
		}
		served[proto] = true
	}
	if !served["TCP"] || !served["UDP"] {
		t.Errorf("Service %s serves the peer port over %v; want TCP and UDP", svc.Metadata.Name, served)
	}
	if first, _, _ := strings.Cut(cfg.Peering.DNS, "."); first != svc.Metadata.Name {
		t.Errorf("peering.dns %q does not name the headless Service %s", cfg.Peering.DNS, svc.Metadata.Name)
	}
	if rest, ok := strings.CutPrefix(cfg.Peering.DNS, svc.Metadata.Name+"."); ok && !strings.Contains(rest, ".svc") {
		t.Errorf("peering.dns %q: want NAME, or NAME.NAMESPACE.svc[.cluster.local]", cfg.Peering.DNS)
	}

	var sec secretManifest
	decodeFile(t, "kubernetes/peering-secret.yaml", &sec)
	dir, file := path.Split(cfg.Peering.SecretFile)
	vol := ""
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == sec.Metadata.Name {
			vol = v.Name
		}
	}
	mounted := false
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == vol && strings.TrimSuffix(m.MountPath, "/") == strings.TrimSuffix(dir, "/") {
				mounted = true
				if !m.ReadOnly {
					t.Errorf("the Secret is mounted writable at %s", m.MountPath)
				}
			}
		}
	}
	if sec.Kind != "Secret" || vol == "" || !mounted {
		t.Errorf("peering.secret_file %s: want the Secret %s (kind %s) mounted at %s (volume %q)", cfg.Peering.SecretFile, sec.Metadata.Name, sec.Kind, dir, vol)
	}
	value, ok := sec.StringData[file]
	if !ok {
		t.Fatalf("the Secret has no key %q (peering.secret_file's name): %v", file, sec.StringData)
	}
	if _, err := peering.ParseSecret([]byte(value)); err == nil {
		t.Error("the Secret's placeholder is a valid key: every deployment that forgets to replace it would share a published secret")
	}
}

// TestNetworkPolicyPeerPort: a rule opens the peer port over TCP and UDP to prefixlb's own
// pods, and every rule that opens it admits only pods that the Deployment's labels select
// (no IP block, no namespace-wide or all-sources rule).
func TestNetworkPolicyPeerPort(t *testing.T) {
	_, peerPort := peeringConfig(t)
	var np netPolicy
	decodeFile(t, "kubernetes/networkpolicy.yaml", &np)
	var dep peerDeployment
	decodeFile(t, "kubernetes/deployment.yaml", &dep)
	ports, labels := dep.ports(), dep.Spec.Template.Metadata.Labels
	open := map[string]bool{}
	for i, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = "TCP"
			}
			n, err := strconv.Atoi(p.Port.Value)
			if err != nil {
				cp, ok := ports[p.Port.Value]
				if !ok {
					t.Errorf("ingress[%d] port %q names no container port", i, p.Port.Value)
					continue
				}
				if cp.protocol != proto {
					t.Errorf("ingress[%d] port %q is %s in the Deployment, %s in the policy", i, p.Port.Value, cp.protocol, proto)
				}
				n = cp.port
			}
			if n != peerPort {
				continue
			}
			where := fmt.Sprintf("ingress[%d] (peer port %d/%s)", i, n, proto)
			if len(r.From) == 0 {
				t.Errorf("%s is open to every source", where)
			}
			for j, peer := range r.From {
				if peer.IPBlock != nil || peer.NamespaceSelector != nil || peer.PodSelector == nil ||
					len(peer.PodSelector.MatchExpressions) > 0 || !selectsPods(peer.PodSelector.MatchLabels, labels) {
					t.Errorf("%s from[%d] admits more than prefixlb's pods (%v)", where, j, labels)
				}
			}
			open[proto] = len(r.From) > 0
		}
	}
	if !open["TCP"] || !open["UDP"] {
		t.Errorf("the peer port is opened to prefixlb's pods over %v; want TCP and UDP", open)
	}
}
