package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	"k8s.io/utils/ptr"

	capie2e "sigs.k8s.io/cluster-api/test/e2e"
)

// MachinePools of KaironMachinePools (the shipped machinepool flavor): a pool of 2 scaled to
// 3, 1 and 0, its Nodes counted by CAPI from the pool's providerIDList.
var _ = Describe("When testing MachinePools", Label("machine-pool"), func() {
	capie2e.MachinePoolSpec(ctx, func() capie2e.MachinePoolInput {
		return capie2e.MachinePoolInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                ptr.To("machinepool"),
		}
	})
})
