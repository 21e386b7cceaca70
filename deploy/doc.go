// Package deploy holds the Kubernetes manifests (deploy/kubernetes) and a test that keeps
// them consistent with the configuration schema.
package deploy
