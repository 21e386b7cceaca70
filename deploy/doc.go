// Package deploy holds the Helm chart (deploy/helm/prefixlb) and the Grafana dashboard
// (deploy/grafana/prefixlb.json, also shipped by the chart), with the tests that render the
// chart with the real helm binary and check the manifests against prefixlb's own configuration
// schema, the Dockerfile and docs/kubernetes.md, and the dashboard's queries against the
// metrics prefixlb exports.
package deploy
