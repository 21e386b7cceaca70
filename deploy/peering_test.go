package deploy

import (
	"bytes"
	"path"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/peering"
)

// checkPeering: with peering on, the config's peering section validates on a port that is
// neither the data nor the admin port; the Deployment exposes it over TCP and UDP and mounts
// the shared secret read-only where peering.secret_file points; the headless Service that
// peering.dns names selects the Deployment's pods, not-ready ones included, on both
// protocols; the secret is the Secret the user named, or one the chart made whose value is a
// key prefixlb accepts. With peering off, none of it is rendered.
func checkPeering(t *testing.T, r *rendered, c chartCase, dep *appsv1.Deployment, cfg *configs.Config) {
	t.Helper()
	_, ctr, _, _ := workload(t, r)
	ports := containerPorts(ctr)
	ps := &dep.Spec.Template.Spec
	if !c.peering {
		if cfg.Peering != nil || len(r.secrets) != 0 {
			t.Errorf("peering off, yet the config has a peering section (%v) or a Secret is rendered (%d)", cfg.Peering != nil, len(r.secrets))
		}
		for name, s := range r.services {
			if s.Spec.PublishNotReadyAddresses {
				t.Errorf("peering off, yet the peers' Service %s is rendered", name)
			}
		}
		if _, ok := ports["peer"]; ok {
			t.Error("peering off, yet the container exposes the peer port")
		}
		return
	}
	if cfg.Peering == nil {
		t.Fatal("the config has no peering section: the Deployment's replicas would route unpeered")
	}
	peerPort := listenPort(t, cfg.Peering.Listen)
	if peerPort == listenPort(t, cfg.Listen) || peerPort == listenPort(t, cfg.AdminListen) {
		t.Errorf("peering.listen %s shares the data (%s) or admin (%s) port", cfg.Peering.Listen, cfg.Listen, cfg.AdminListen)
	}
	byProto := map[corev1.Protocol]string{} // protocol → the container port name serving peerPort
	for name, p := range ports {
		if p.ContainerPort == peerPort {
			byProto[p.Protocol] = name
		}
	}
	if byProto[corev1.ProtocolTCP] != "peer" || byProto[corev1.ProtocolUDP] == "" {
		t.Errorf("the container's ports for %d: %v; want one named peer (TCP) and one over UDP", peerPort, byProto)
	}

	// peering.dns: SERVICE.NAMESPACE.svc.DOMAIN of the headless Service over the replicas.
	name, rest, _ := strings.Cut(cfg.Peering.DNS, ".")
	if !strings.HasPrefix(rest, c.rel.namespace+".svc.") {
		t.Errorf("peering.dns %q: want NAME.%s.svc.DOMAIN", cfg.Peering.DNS, c.rel.namespace)
	}
	svc, ok := r.services[name]
	if !ok {
		t.Fatalf("peering.dns %q names no rendered Service", cfg.Peering.DNS)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: clusterIP %q publishNotReadyAddresses %v; want a headless Service that publishes not-ready pods (they join before they are ready)",
			name, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if labels := dep.Spec.Template.Labels; !selects(svc.Spec.Selector, labels) {
		t.Errorf("Service %s selector %v does not select the Deployment's pods (%v)", name, svc.Spec.Selector, labels)
	}
	served := map[corev1.Protocol]bool{}
	for _, p := range svc.Spec.Ports {
		target, ok := ports[p.TargetPort.String()]
		if p.TargetPort.IntValue() != 0 {
			target, ok = corev1.ContainerPort{ContainerPort: p.TargetPort.IntVal, Protocol: p.Protocol}, true
		}
		if p.Port != peerPort || !ok || target.ContainerPort != peerPort || target.Protocol != p.Protocol {
			t.Errorf("Service %s port %d → %q (%s) is not the peer port %d", name, p.Port, p.TargetPort.String(), p.Protocol, peerPort)
			continue
		}
		served[p.Protocol] = true
	}
	if !served[corev1.ProtocolTCP] || !served[corev1.ProtocolUDP] {
		t.Errorf("Service %s serves the peer port over %v; want TCP and UDP", name, served)
	}

	// The secret: a Secret volume mounted read-only at peering.secret_file's directory, its
	// file the key the chart made or the user named.
	dir, file := path.Split(cfg.Peering.SecretFile)
	var vol *corev1.SecretVolumeSource
	for _, m := range ctr.VolumeMounts {
		if strings.TrimSuffix(m.MountPath, "/") != strings.TrimSuffix(dir, "/") {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("the secret is mounted writable at %s", m.MountPath)
		}
		for _, v := range ps.Volumes {
			if v.Name == m.Name {
				vol = v.Secret
			}
		}
	}
	if vol == nil {
		t.Fatalf("peering.secret_file %s: no Secret volume mounted at %s", cfg.Peering.SecretFile, dir)
	}
	if vol.DefaultMode == nil || *vol.DefaultMode&0o007 != 0 {
		t.Errorf("the secret's file mode %v is readable by every user; want the pod's group only", vol.DefaultMode)
	}
	key := file
	for _, it := range vol.Items {
		if it.Path == file {
			key = it.Key
		}
	}
	if c.existingSecret != "" {
		if vol.SecretName != c.existingSecret || key != c.secretKey || len(r.secrets) != 0 {
			t.Errorf("secret %s key %s (%d rendered); want the user's Secret %s key %s and none of the chart's",
				vol.SecretName, key, len(r.secrets), c.existingSecret, c.secretKey)
		}
		return
	}
	sec, ok := r.secrets[vol.SecretName]
	if !ok || len(r.secrets) != 1 {
		t.Fatalf("the pods mount the Secret %s; the chart renders %d Secrets and not that one", vol.SecretName, len(r.secrets))
	}
	if _, err := peering.ParseSecret(sec.Data[key]); err != nil {
		t.Errorf("Secret %s key %s: prefixlb refuses it: %v", sec.Name, key, err)
	}
}

// TestChartPeeringSecretIsRandom: the Secret the chart makes holds a fresh key at each
// install (rendered twice, two keys), 32 bytes once prefixlb reads it: never a value
// published in the chart.
func TestChartPeeringSecretIsRandom(t *testing.T) {
	rel := chartCases[0].rel
	var keys [][]byte
	for range 2 {
		r := rel.template(t)
		if len(r.secrets) != 1 {
			t.Fatalf("%d Secrets rendered, want the peering one", len(r.secrets))
		}
		for _, s := range r.secrets {
			k, err := peering.ParseSecret(s.Data["secret"])
			if err != nil || len(k) != 32 {
				t.Fatalf("Secret %s: %d-byte key, %v; want 32 bytes", s.Name, len(k), err)
			}
			keys = append(keys, k)
		}
	}
	if bytes.Equal(keys[0], keys[1]) {
		t.Error("two installs render the same peering key: it is published with the chart")
	}
}
