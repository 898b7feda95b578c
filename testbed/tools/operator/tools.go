//go:build tools

// Package tools keeps the operator's main package, built by hack/capi-operator.sh, in go.mod.
package tools

import (
	_ "sigs.k8s.io/cluster-api-operator/cmd"
)
