// Package deploy holds the Kubernetes manifests (deploy/kubernetes) and the Grafana dashboard
// (deploy/grafana/prefixlb.json: import it, or provision it from a ConfigMap, and pick the
// Prometheus data source in its variable), with tests that keep them consistent with the
// configuration schema and with the metrics prefixlb exports.
package deploy
