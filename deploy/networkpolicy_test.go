package deploy

import (
	"fmt"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/prefixlb/prefixlb/configs"
)

// checkNetworkPolicy: the policy selects prefixlb's pods and leaves the data port open to
// every client; the admin port (/metrics and /debug/*, which shows backend addresses, health
// and routing decisions) admits only selected pods (Prometheus): no rule opens it to all
// sources, to all pods of a namespace or to an IP block; the peer port, over TCP and UDP,
// admits prefixlb's own pods only; no rule lists no ports (which would open every port).
func checkNetworkPolicy(t *testing.T, r *rendered, c chartCase, dep *appsv1.Deployment, cfg *configs.Config) {
	t.Helper()
	if len(r.policies) != b2i(c.networkPolicy) {
		t.Fatalf("%d NetworkPolicies, want %d", len(r.policies), b2i(c.networkPolicy))
	}
	_, ctr, _, _ := workload(t, r)
	ports := containerPorts(ctr)
	podLabels := dep.Spec.Template.Labels
	dataPort, adminPort := listenPort(t, cfg.Listen), listenPort(t, cfg.AdminListen)
	var peerPort int32 = -1
	if cfg.Peering != nil {
		peerPort = listenPort(t, cfg.Peering.Listen)
	}
	for name, np := range r.policies {
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s policyTypes %v: without Ingress it restricts nothing", name, np.Spec.PolicyTypes)
		}
		if len(np.Spec.PodSelector.MatchLabels) == 0 || !selects(np.Spec.PodSelector.MatchLabels, podLabels) {
			t.Errorf("NetworkPolicy %s podSelector %v: want prefixlb's pods (%v), not every pod of the namespace", name, np.Spec.PodSelector.MatchLabels, podLabels)
		}
		dataOpen, adminAllowed := false, false
		peerOpen := map[corev1.Protocol]bool{}
		for i, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 0 {
				t.Errorf("ingress[%d] lists no ports: it opens every port, the admin port included, to its sources", i)
				continue
			}
			for _, p := range rule.Ports {
				proto := corev1.ProtocolTCP
				if p.Protocol != nil {
					proto = *p.Protocol
				}
				n := p.Port.IntVal
				if p.Port.IntValue() == 0 {
					cp, ok := ports[p.Port.StrVal]
					if !ok {
						t.Errorf("ingress[%d] port %q names no container port", i, p.Port.StrVal)
						continue
					}
					if cp.Protocol != proto {
						t.Errorf("ingress[%d] port %q is %s in the Deployment, %s in the policy", i, p.Port.StrVal, cp.Protocol, proto)
					}
					n = cp.ContainerPort
				}
				where := fmt.Sprintf("ingress[%d] (port %d/%s)", i, n, proto)
				switch n {
				case dataPort:
					dataOpen = dataOpen || len(rule.From) == 0
				case adminPort:
					if len(rule.From) == 0 {
						t.Errorf("%s opens the admin port to every source", where)
					}
					for j, peer := range rule.From {
						switch {
						case peer.IPBlock != nil:
							t.Errorf("%s from[%d] admits the IP block %s to the admin port", where, j, peer.IPBlock.CIDR)
						case peer.PodSelector == nil || len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0:
							t.Errorf("%s from[%d] admits every pod (of the namespaces selected) to the admin port: select Prometheus's pods", where, j)
						default:
							adminAllowed = true
						}
					}
				case peerPort:
					if len(rule.From) == 0 {
						t.Errorf("%s opens the peer port to every source", where)
					}
					for j, peer := range rule.From {
						if peer.IPBlock != nil || peer.NamespaceSelector != nil || peer.PodSelector == nil ||
							len(peer.PodSelector.MatchExpressions) > 0 || !selects(peer.PodSelector.MatchLabels, podLabels) {
							t.Errorf("%s from[%d] admits more than prefixlb's pods (%v)", where, j, podLabels)
						}
					}
					peerOpen[proto] = len(rule.From) > 0
				default:
					t.Errorf("%s opens a port prefixlb does not listen on", where)
				}
			}
		}
		if !dataOpen {
			t.Errorf("NetworkPolicy %s: no rule opens the data port (%d) to every client", name, dataPort)
		}
		if !adminAllowed {
			t.Errorf("NetworkPolicy %s: no rule admits Prometheus to the admin port (%d): /metrics would go unscraped", name, adminPort)
		}
		if cfg.Peering != nil && (!peerOpen[corev1.ProtocolTCP] || !peerOpen[corev1.ProtocolUDP]) {
			t.Errorf("NetworkPolicy %s opens the peer port to prefixlb's pods over %v; want TCP and UDP (peers could not reach each other)", name, peerOpen)
		}
	}
}
