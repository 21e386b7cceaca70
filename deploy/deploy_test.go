package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/prefixlb/prefixlb/configs"
)

type manifest struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Replicas  int    `yaml:"replicas"`
		ClusterIP string `yaml:"clusterIP"`
		Template  struct {
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				Containers                    []struct {
					Args  []string `yaml:"args"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					Resources struct {
						Requests map[string]string `yaml:"requests"`
					} `yaml:"resources"`
					ReadinessProbe *probe `yaml:"readinessProbe"`
					LivenessProbe  *probe `yaml:"livenessProbe"`
					Lifecycle      struct {
						PreStop struct {
							Sleep struct {
								Seconds int `yaml:"seconds"`
							} `yaml:"sleep"`
						} `yaml:"preStop"`
					} `yaml:"lifecycle"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

func load(t *testing.T) map[string]manifest {
	t.Helper()
	files, _ := filepath.Glob("kubernetes/*.yaml")
	out := map[string]manifest{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m manifest
		if err := yaml.Unmarshal(data, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[m.Kind+"/"+m.Metadata.Name] = m
	}
	return out
}

func TestManifestsAreConsistent(t *testing.T) {
	ms := load(t)
	cm, ok := ms["ConfigMap/prefixlb"]
	if !ok {
		t.Fatal("no ConfigMap/prefixlb")
	}
	cfg, err := configs.Parse([]byte(cm.Data["prefixlb.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap prefixlb.yaml: %v", err)
	}
	d, ok := ms["Deployment/prefixlb"]
	if !ok {
		t.Fatal("no Deployment/prefixlb")
	}
	if d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", d.Spec.Replicas)
	}
	ps := d.Spec.Template.Spec
	c := ps.Containers[0]
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["admin"] != 9090 || ports["http"] != 8080 {
		t.Errorf("ports %v, want http 8080 and admin 9090 (the ConfigMap's listeners)", ports)
	}
	if cfg.AdminListen != "0.0.0.0:9090" || cfg.Listen != "0.0.0.0:8080" {
		t.Errorf("ConfigMap listeners %s / %s do not match the container ports", cfg.Listen, cfg.AdminListen)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port != "admin" {
		t.Errorf("readiness probe must GET /readyz on the admin port: %+v", c.ReadinessProbe)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.LivenessProbe.HTTPGet.Port != "admin" {
		t.Errorf("liveness probe must GET /healthz on the admin port: %+v", c.LivenessProbe)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" {
		t.Errorf("resource requests missing: %v", c.Resources.Requests)
	}
	grace := time.Duration(ps.TerminationGracePeriodSeconds) * time.Second
	need := cfg.Timeouts.ShutdownGrace.D() + time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second
	if c.Lifecycle.PreStop.Sleep.Seconds == 0 || grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v must exceed shutdown_grace + preStop = %v", grace, need)
	}
	if hs, ok := ms["Service/vllm"]; !ok || hs.Spec.ClusterIP != "None" {
		t.Errorf("the model-server example must be a headless Service (clusterIP: None)")
	}
	if _, ok := ms["Service/prefixlb"]; !ok {
		t.Error("no Service/prefixlb")
	}
}

// kubectl renders the kustomization offline when it is installed. (--dry-run=client needs an
// API server for discovery, which neither CI nor a laptop without a cluster has.)
func TestKubectlKustomize(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed; manifests checked by TestManifestsAreConsistent only")
	}
	out, err := exec.Command("kubectl", "kustomize", "kubernetes").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	var n int
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var m manifest
		if err := dec.Decode(&m); err != nil {
			break
		}
		n++
	}
	if n != 5 {
		t.Errorf("kustomize rendered %d objects, want 5", n)
	}
}
