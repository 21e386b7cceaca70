package deploy

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/prefixlb/prefixlb/configs"
)

// chartCase is one way to install the chart and what its render must then hold.
type chartCase struct {
	name string
	rel  release
	// image and pullPolicy are what the Deployment must run.
	image, pullPolicy string
	// replicas is the Deployment's count (0: left to the HorizontalPodAutoscaler).
	replicas int32
	// podLabels: the chart makes the model servers' headless Service selecting these;
	// modelService: the DNS discovery follows this Service of the user's instead, in
	// modelNamespace (default: the release's).
	podLabels                    map[string]string
	modelService, modelNamespace string
	// backends is the number of static backends in the config.
	backends int
	// simulator: the chart runs this many simulated model servers (prefixlb sim) and routes
	// to them.
	simulator int32
	// peering on; existingSecret/Key: the Secret the user made (else the chart makes one).
	peering                   bool
	existingSecret, secretKey string
	networkPolicy, pdb        bool
	hpa, serviceMonitor       bool
	tracing                   string // the OTLP endpoint the config must carry, "" for tracing off
}

// chartCases: the default values with the one choice they require (where the model servers
// are), and the combinations an operator picks.
var chartCases = []chartCase{
	{
		name:  "simulated model servers",
		rel:   release{name: "prefixlb", namespace: "default", set: []string{"simulator.enabled=true"}},
		image: "prefixlb:dev", pullPolicy: "IfNotPresent", replicas: 2,
		simulator: 4, peering: true, networkPolicy: true, pdb: true,
	},
	{
		name:  "defaults with model-server pod labels",
		rel:   release{name: "prefixlb", namespace: "llm", set: []string{"modelServers.podLabels.app=vllm"}},
		image: "prefixlb:dev", pullPolicy: "IfNotPresent", replicas: 2,
		podLabels: map[string]string{"app": "vllm"},
		peering:   true, networkPolicy: true, pdb: true,
	},
	{
		name: "static backends, one replica, peering off",
		rel: release{name: "prefixlb", namespace: "default", set: []string{
			"backends[0].url=http://vllm-0.vllm:8000", "backends[0].kv_cache_tokens=400000",
			"backends[1].url=http://vllm-1.vllm:8000", "replicaCount=1", "peering.enabled=false"}},
		image: "prefixlb:dev", pullPolicy: "IfNotPresent", replicas: 1,
		backends: 2, networkPolicy: true, pdb: true,
	},
	{
		name: "own image and Service, ServiceMonitor, autoscaling",
		rel: release{name: "edge", namespace: "inference", set: []string{
			"modelServers.service=vllm", "modelServers.namespace=gpu", "modelServers.port=8001", "serviceMonitor.enabled=true", "autoscaling.enabled=true",
			"tracing.enabled=true", "tracing.endpoint=http://otel-collector.observability:4318", "tracing.sampleRatio=1",
			"image.repository=registry.example.com/team/prefixlb", "image.tag=v0.3.0", "image.pullPolicy=Always"}},
		image: "registry.example.com/team/prefixlb:v0.3.0", pullPolicy: "Always",
		modelService: "vllm", modelNamespace: "gpu", peering: true, networkPolicy: true, pdb: true, hpa: true, serviceMonitor: true,
		tracing: "http://otel-collector.observability:4318",
	},
	{
		name: "existing peering Secret, no NetworkPolicy or PodDisruptionBudget",
		rel: release{name: "prefixlb", namespace: "llm", set: []string{
			"modelServers.podLabels.app\\.kubernetes\\.io/name=sglang", "modelServers.port=30000",
			"peering.existingSecret=prefixlb-key", "peering.existingSecretKey=key",
			"networkPolicy.enabled=false", "podDisruptionBudget.enabled=false"}},
		image: "prefixlb:dev", pullPolicy: "IfNotPresent", replicas: 2,
		podLabels: map[string]string{"app.kubernetes.io/name": "sglang"},
		peering:   true, existingSecret: "prefixlb-key", secretKey: "key",
	},
}

// TestChart lints and renders each case, and checks what the render must hold: the image,
// the Pod's security, probes, drain and sizing, a config that prefixlb's own configs package
// parses and validates, discovery of the model servers, peering, the NetworkPolicy, the
// PodDisruptionBudget, the ServiceMonitor and the HorizontalPodAutoscaler.
func TestChart(t *testing.T) {
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			c.rel.lint(t)
			r := c.rel.template(t)
			dep, cfg := checkWorkload(t, r, c)
			checkDiscovery(t, r, c, cfg)
			checkPeering(t, r, c, dep, cfg)
			checkNetworkPolicy(t, r, c, dep, cfg)
			checkScaling(t, r, c, dep, cfg)
		})
	}
}

// workload returns the one Deployment, its prefixlb container and the ConfigMap its config
// file comes from, with the file's path.
func workload(t *testing.T, r *rendered) (*appsv1.Deployment, *corev1.Container, *corev1.ConfigMap, string) {
	t.Helper()
	dep := runs(t, r, "serve")
	if dep == nil {
		t.Fatalf("no Deployment runs prefixlb serve")
	}
	ps := &dep.Spec.Template.Spec
	c := &ps.Containers[0]
	if len(c.Args) != 3 || c.Args[1] != "--config" {
		t.Fatalf("container args %q, want serve --config FILE", c.Args)
	}
	file := c.Args[2]
	dir, base := path.Split(file)
	var cm *corev1.ConfigMap
	for _, m := range c.VolumeMounts {
		if strings.TrimSuffix(m.MountPath, "/") != strings.TrimSuffix(dir, "/") {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("the config is mounted writable at %s", m.MountPath)
		}
		for _, v := range ps.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				cm = r.configMaps[v.ConfigMap.Name]
			}
		}
	}
	if cm == nil {
		t.Fatalf("no rendered ConfigMap is mounted at %s (the --config %s)", dir, file)
	}
	if _, ok := cm.Data[base]; !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm.Name, base)
	}
	return dep, c, cm, file
}

// runs returns the one Deployment whose one container runs the prefixlb subcommand cmd, or nil.
func runs(t *testing.T, r *rendered, cmd string) *appsv1.Deployment {
	t.Helper()
	var found *appsv1.Deployment
	for name, d := range r.deployments {
		cs := d.Spec.Template.Spec.Containers
		if len(cs) != 1 {
			t.Fatalf("Deployment %s has %d containers, want 1", name, len(cs))
		}
		if len(cs[0].Args) > 0 && cs[0].Args[0] == cmd {
			if found != nil {
				t.Fatalf("Deployments %s and %s both run prefixlb %s", found.Name, name, cmd)
			}
			found = d
		}
	}
	return found
}

// containerPorts are a container's ports by name.
func containerPorts(c *corev1.Container) map[string]corev1.ContainerPort {
	out := map[string]corev1.ContainerPort{}
	for _, p := range c.Ports {
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		out[p.Name] = p
	}
	return out
}

// selects reports whether a selector (non-empty) matches pods with labels.
func selects(sel, labels map[string]string) bool {
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

func listenPort(t *testing.T, hostPort string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil {
		t.Fatalf("%q: %v", hostPort, err)
	}
	return int32(n)
}

// The sizing the chart's defaults follow (values.yaml, docs/kubernetes.md): process memory
// runs to about 1.1× limits.max_buffered_body_bytes under concurrent large uploads (README's
// guarantees), the prefix index takes about 80 B per entry when full (TestMemoryPerEntry in
// router/index bounds it at 100), and the runtime wants some room of its own.
const (
	bodyOvershoot     = 1.1
	indexBytesPerItem = 80
	runtimeHeadroom   = 64 << 20
)

// checkWorkload checks the Deployment and its config, and returns both.
func checkWorkload(t *testing.T, r *rendered, c chartCase) (*appsv1.Deployment, *configs.Config) {
	t.Helper()
	dep, ctr, cm, file := workload(t, r)
	text := cm.Data[path.Base(file)]
	cfg, err := configs.Parse([]byte(text))
	if err != nil {
		t.Fatalf("ConfigMap %s: prefixlb refuses its config: %v\n%s", cm.Name, err, text)
	}
	if tr := cfg.Tracing; tr.Enabled != (c.tracing != "") || tr.Endpoint != c.tracing {
		t.Errorf("config tracing: enabled %v, endpoint %q; want endpoint %q", tr.Enabled, tr.Endpoint, c.tracing)
	} else if c.tracing != "" && (tr.SampleRatio == nil || *tr.SampleRatio != 1) {
		t.Errorf("config tracing.sample_ratio: %v, want 1", tr.SampleRatio)
	}
	ps := &dep.Spec.Template.Spec
	podLabels := dep.Spec.Template.Labels
	if dep.Spec.Selector == nil || !selects(dep.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("the Deployment's selector %v does not select its pods (%v)", dep.Spec.Selector, podLabels)
	}
	switch {
	case c.hpa && dep.Spec.Replicas != nil:
		t.Errorf("replicas %d set beside the HorizontalPodAutoscaler: every helm upgrade would reset its count", *dep.Spec.Replicas)
	case !c.hpa && (dep.Spec.Replicas == nil || *dep.Spec.Replicas != c.replicas):
		t.Errorf("replicas %v, want %d", dep.Spec.Replicas, c.replicas)
	}

	if ctr.Image != c.image || string(ctr.ImagePullPolicy) != c.pullPolicy {
		t.Errorf("image %s (%s), want %s (%s)", ctr.Image, ctr.ImagePullPolicy, c.image, c.pullPolicy)
	}

	checkPodSecurity(t, dep)

	// Listeners: the config's ports are the container's, and the admin listener is reachable
	// by the kubelet and Prometheus (not loopback, prefixlb's own default).
	ports := containerPorts(ctr)
	if ports["http"].ContainerPort != listenPort(t, cfg.Listen) || ports["admin"].ContainerPort != listenPort(t, cfg.AdminListen) {
		t.Errorf("container ports http %d / admin %d; the config listens on %s / %s",
			ports["http"].ContainerPort, ports["admin"].ContainerPort, cfg.Listen, cfg.AdminListen)
	}
	if host, _, _ := net.SplitHostPort(cfg.AdminListen); host == "" || net.ParseIP(host) == nil || net.ParseIP(host).IsLoopback() {
		t.Errorf("admin_listen %s: the probes and Prometheus reach the pod's IP; want 0.0.0.0", cfg.AdminListen)
	}
	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"readiness", "/readyz", ctr.ReadinessProbe}, {"liveness", "/healthz", ctr.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "admin" {
			t.Errorf("%s probe %+v: want GET %s on the admin port", p.name, p.probe, p.path)
		}
	}

	// Drain: the kubelet waits for the preStop sleep and the streams' shutdown_grace.
	if ps.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	var sleep int64
	if l := ctr.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
		sleep = l.PreStop.Sleep.Seconds
	}
	need := int64(cfg.Timeouts.ShutdownGrace.D().Seconds()) + sleep
	if sleep == 0 || *ps.TerminationGracePeriodSeconds <= need {
		t.Errorf("terminationGracePeriodSeconds %d must exceed the preStop sleep (%d s) + timeouts.shutdown_grace (%s)",
			*ps.TerminationGracePeriodSeconds, sleep, cfg.Timeouts.ShutdownGrace.D())
	}

	// Sizing: requests for the scheduler (and the autoscaler's CPU), and a memory limit that
	// holds the body budget, the full index and the runtime.
	req, lim := ctr.Resources.Requests, ctr.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().IsZero() {
		t.Errorf("resource requests %v: want cpu and memory", req)
	}
	mem := lim.Memory()
	need = int64(bodyOvershoot*float64(cfg.Limits.MaxBufferedBodyBytes)) + indexBytesPerItem*int64(cfg.Prefix.MaxIndexEntries) + runtimeHeadroom
	if mem.IsZero() || mem.Value() < need {
		t.Errorf("memory limit %s is under %s: %.1f× limits.max_buffered_body_bytes (%d) + %d B × prefix.max_index_entries (%d) + %d MiB",
			mem, resource.NewQuantity(need, resource.BinarySI), bodyOvershoot, cfg.Limits.MaxBufferedBodyBytes,
			indexBytesPerItem, cfg.Prefix.MaxIndexEntries, runtimeHeadroom>>20)
	}

	// A changed config rolls the pods (most of it applies only at start).
	sum := sha256.Sum256([]byte(strings.TrimSuffix(text, "\n")))
	if got := dep.Spec.Template.Annotations["checksum/config"]; got != hex.EncodeToString(sum[:]) {
		t.Errorf("checksum/config %q is not the SHA-256 of the ConfigMap's config", got)
	}

	// The data Service selects the pods and targets the data port.
	data := 0
	for _, s := range r.services {
		for _, p := range s.Spec.Ports {
			if p.TargetPort.String() == "http" && selects(s.Spec.Selector, podLabels) {
				data++
			}
		}
	}
	if data != 1 {
		t.Errorf("%d Services target the data port of prefixlb's pods, want 1", data)
	}
	return dep, cfg
}

// checkPodSecurity: the Pod Security Standards' restricted profile, a read-only root
// filesystem, and no API token.
func checkPodSecurity(t *testing.T, dep *appsv1.Deployment) {
	t.Helper()
	ps := &dep.Spec.Template.Spec
	psc := ps.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("Deployment %s: pod securityContext %+v: want runAsNonRoot, a non-zero runAsUser and seccomp RuntimeDefault", dep.Name, psc)
	}
	for _, c := range ps.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("Deployment %s container %s: securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, capabilities dropped (ALL)", dep.Name, c.Name, sc)
		}
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("Deployment %s mounts a service account token; prefixlb never calls the Kubernetes API", dep.Name)
	}
}

// checkDiscovery: the config finds the model servers as the case says, through a headless
// Service (the chart's, selecting the pods' labels, or the user's, by name).
func checkDiscovery(t *testing.T, r *rendered, c chartCase, cfg *configs.Config) {
	t.Helper()
	if len(cfg.Backends) != c.backends {
		t.Errorf("%d static backends, want %d", len(cfg.Backends), c.backends)
	}
	d := cfg.Discovery.DNS
	podLabels := c.podLabels
	sim := runs(t, r, "sim")
	if (sim != nil) != (c.simulator > 0) {
		t.Fatalf("simulator Deployment rendered: %v, want %v", sim != nil, c.simulator > 0)
	}
	if sim != nil {
		podLabels = sim.Spec.Template.Labels
		checkSimulator(t, r, c, sim, cfg)
	}
	if podLabels == nil && c.modelService == "" {
		if d != nil {
			t.Errorf("discovery.dns %+v without model servers to follow", d)
		}
		return
	}
	if d == nil {
		t.Fatal("no discovery.dns: the model servers are not followed")
	}
	wantNS := c.rel.namespace
	if c.modelNamespace != "" {
		wantNS = c.modelNamespace
	}
	svc, rest, _ := strings.Cut(d.Name, ".")
	if ns, _, _ := strings.Cut(rest, "."); ns != wantNS || !strings.HasPrefix(rest, ns+".svc.") {
		t.Errorf("discovery.dns.name %q: want SERVICE.%s.svc.DOMAIN", d.Name, wantNS)
	}
	made, ok := r.services[svc]
	if c.modelService != "" {
		if svc != c.modelService || ok {
			t.Errorf("discovery.dns.name %q (rendered: %v): want the user's Service %s, not one of the chart's", d.Name, ok, c.modelService)
		}
		return
	}
	if !ok {
		t.Fatalf("discovery.dns.name %q names no rendered Service", d.Name)
	}
	if made.Spec.ClusterIP != corev1.ClusterIPNone || made.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: clusterIP %q publishNotReadyAddresses %v; want headless, ready pods only (one backend per ready pod)",
			svc, made.Spec.ClusterIP, made.Spec.PublishNotReadyAddresses)
	}
	if !maps.Equal(made.Spec.Selector, podLabels) {
		t.Errorf("Service %s selects %v, want the model servers' labels %v", svc, made.Spec.Selector, podLabels)
	}
	if len(made.Spec.Ports) != 1 || made.Spec.Ports[0].Port != int32(d.Port) || made.Spec.Ports[0].TargetPort.IntValue() != d.Port {
		t.Errorf("Service %s ports %+v; discovery dials port %d", svc, made.Spec.Ports, d.Port)
	}
}

// checkSimulator: the simulated model servers run the chart's image, one replica a pod
// listening on every interface at the port discovery dials, as restricted as prefixlb's pods,
// and never among the pods prefixlb's own selectors pick.
func checkSimulator(t *testing.T, r *rendered, c chartCase, sim *appsv1.Deployment, cfg *configs.Config) {
	t.Helper()
	checkPodSecurity(t, sim)
	ctr := sim.Spec.Template.Spec.Containers[0]
	if sim.Spec.Replicas == nil || *sim.Spec.Replicas != c.simulator || ctr.Image != c.image {
		t.Errorf("simulator: %v replicas of %s, want %d of %s", sim.Spec.Replicas, ctr.Image, c.simulator, c.image)
	}
	want := []string{"sim", "--replicas=1", "--host=0.0.0.0", "--base-port=" + strconv.Itoa(cfg.Discovery.DNS.Port)}
	if !slices.Equal(ctr.Args, want) {
		t.Errorf("simulator args %q, want %q", ctr.Args, want)
	}
	if sim.Spec.Selector == nil || !selects(sim.Spec.Selector.MatchLabels, sim.Spec.Template.Labels) {
		t.Errorf("simulator selector %v does not select its pods", sim.Spec.Selector)
	}
	serve := runs(t, r, "serve")
	if selects(serve.Spec.Selector.MatchLabels, sim.Spec.Template.Labels) {
		t.Errorf("prefixlb's selector %v also picks the simulator's pods %v", serve.Spec.Selector.MatchLabels, sim.Spec.Template.Labels)
	}
}

// checkScaling: the PodDisruptionBudget lets one pod go at a time, the autoscaler scales the
// Deployment, and the ServiceMonitor scrapes the admin port's /metrics of prefixlb's pods.
func checkScaling(t *testing.T, r *rendered, c chartCase, dep *appsv1.Deployment, cfg *configs.Config) {
	t.Helper()
	podLabels := dep.Spec.Template.Labels
	if len(r.pdbs) != b2i(c.pdb) {
		t.Fatalf("%d PodDisruptionBudgets, want %d", len(r.pdbs), b2i(c.pdb))
	}
	for name, p := range r.pdbs {
		if p.Spec.Selector == nil || !selects(p.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("PodDisruptionBudget %s selects %v, not prefixlb's pods", name, p.Spec.Selector)
		}
		if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 || p.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget %s: want maxUnavailable 1 (minAvailable blocks drains of a single replica)", name)
		}
	}

	if len(r.hpas) != b2i(c.hpa) {
		t.Fatalf("%d HorizontalPodAutoscalers, want %d", len(r.hpas), b2i(c.hpa))
	}
	for name, h := range r.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != dep.Name || h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			t.Errorf("HorizontalPodAutoscaler %s: target %s/%s, replicas %v..%d", name, ref.Kind, ref.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
	}

	if len(r.monitors) != b2i(c.serviceMonitor) {
		t.Fatalf("%d ServiceMonitors, want %d", len(r.monitors), b2i(c.serviceMonitor))
	}
	_, ctr, _, _ := workload(t, r)
	ports := containerPorts(ctr)
	for name, m := range r.monitors {
		if !slices.Equal(m.Spec.NamespaceSelector.MatchNames, []string{c.rel.namespace}) || len(m.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor %s: namespaces %v, %d endpoints", name, m.Spec.NamespaceSelector.MatchNames, len(m.Spec.Endpoints))
		}
		ep := m.Spec.Endpoints[0]
		scraped := 0
		for _, s := range r.services {
			if !selects(m.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			for _, p := range s.Spec.Ports {
				if p.Name == ep.Port && selects(s.Spec.Selector, podLabels) &&
					ports[p.TargetPort.String()].ContainerPort == listenPort(t, cfg.AdminListen) {
					scraped++
				}
			}
		}
		if scraped != 1 || ep.Path != "/metrics" {
			t.Errorf("ServiceMonitor %s: %d Services lead its port %q to the admin port; path %q", name, scraped, ep.Port, ep.Path)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
