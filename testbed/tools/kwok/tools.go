//go:build tools

// Package tools keeps KWOK's controller (the simulated kubelets of the workload clusters)
// in go.mod. Built by hack/test-tools.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
