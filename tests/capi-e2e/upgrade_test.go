package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	"k8s.io/utils/ptr"

	capie2e "sigs.k8s.io/cluster-api/test/e2e"
)

// A Kubernetes upgrade of a Cluster of the shipped ClusterClass, whose patches give each
// machine the image of its version: KUBERNETES_VERSION_UPGRADE_FROM to _TO (see
// tests/e2e_capi_suite.rs). Upstream's input, conformance tests skipped as upstream does.
var _ = Describe("When upgrading a workload cluster using ClusterClass [ClusterClass]", Label("k8s-upgrade", "ClusterClass"), func() {
	capie2e.ClusterUpgradeConformanceSpec(ctx, func() capie2e.ClusterUpgradeConformanceSpecInput {
		return capie2e.ClusterUpgradeConformanceSpecInput{
			E2EConfig:                e2eConfig,
			ClusterctlConfigPath:     clusterctlConfigPath,
			BootstrapClusterProxy:    bootstrapClusterProxy,
			ArtifactFolder:           artifactFolder,
			SkipCleanup:              skipCleanup,
			Flavor:                   ptr.To("topology"),
			ControlPlaneMachineCount: ptr.To[int64](1),
			WorkerMachineCount:       ptr.To[int64](2),
			SkipConformanceTests:     true,
		}
	})
})
