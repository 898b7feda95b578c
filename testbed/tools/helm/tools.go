//go:build tools

// Package tools keeps the main packages built by hack/test-tools.sh in go.mod.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
