package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	"k8s.io/utils/ptr"

	capie2e "sigs.k8s.io/cluster-api/test/e2e"
)

// Specs that cannot pass here (docs/capi-e2e.md says why). They carry the label
// "not-applicable", which the default filter of tests/e2e_capi_suite.rs leaves out;
// CAPKR_CAPI_E2E_FOCUS=node-drain runs one to see it fail.

var _ = Describe("When testing Node drain", Label("node-drain", "not-applicable"), func() {
	capie2e.NodeDrainTimeoutSpec(ctx, func() capie2e.NodeDrainTimeoutSpecInput {
		return capie2e.NodeDrainTimeoutSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                ptr.To("topology"),
		}
	})
})
