// Package deploy holds the Helm chart (deploy/helm/prefixlb) and the tests that render it with
// the real helm binary and check the manifests against prefixlb's own configuration schema,
// the Dockerfile and docs/kubernetes.md.
package deploy
