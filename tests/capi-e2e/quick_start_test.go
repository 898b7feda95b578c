package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	"k8s.io/utils/ptr"

	clusterctlcluster "sigs.k8s.io/cluster-api/cmd/clusterctl/client/cluster"
	capie2e "sigs.k8s.io/cluster-api/test/e2e"
	"sigs.k8s.io/cluster-api/test/framework"
)

// resilienceChecks are the checks upstream's quick-start runs for its own infrastructure
// provider, with the Kairon kinds in place of the Docker/Dev ones.
func resilienceChecks(topology bool) func(proxy framework.ClusterProxy, namespace, clusterName string) {
	return func(proxy framework.ClusterProxy, namespace, clusterName string) {
		filter := clusterctlcluster.FilterClusterObjectsWithNameFilter(clusterName)
		By("Checking that owner references are resilient")
		framework.ValidateOwnerReferencesResilience(ctx, proxy, namespace, clusterName, filter,
			framework.CoreOwnerReferenceAssertion,
			framework.ExpOwnerReferenceAssertions,
			KaironOwnerReferenceAssertions(topology),
			framework.KubeadmBootstrapOwnerReferenceAssertions,
			framework.KubeadmControlPlaneOwnerReferenceAssertions(topology),
			framework.KubernetesReferenceAssertions,
		)
		By("Checking that owner references are updated to the correct API version")
		framework.ValidateOwnerReferencesOnUpdate(ctx, proxy, namespace, clusterName, filter,
			framework.CoreOwnerReferenceAssertion,
			framework.ExpOwnerReferenceAssertions,
			KaironOwnerReferenceAssertions(topology),
			framework.KubeadmBootstrapOwnerReferenceAssertions,
			framework.KubeadmControlPlaneOwnerReferenceAssertions(topology),
			framework.KubernetesReferenceAssertions,
		)
		core := framework.CoreFinalizersAssertionWithLegacyClusters
		if topology {
			core = framework.CoreFinalizersAssertionWithClassyClusters
		}
		By("Checking that finalizers are resilient")
		framework.ValidateFinalizersResilience(ctx, proxy, namespace, clusterName, filter,
			core,
			framework.KubeadmControlPlaneFinalizersAssertion,
			framework.ExpFinalizersAssertion,
			KaironFinalizersAssertion,
		)
		By("Checking that resourceVersions are stable")
		framework.ValidateResourceVersionStable(ctx, framework.ValidateResourceVersionStableInput{
			ClusterProxy:             proxy,
			Namespace:                namespace,
			OwnerGraphFilterFunction: filter,
			WaitToBecomeStable:       e2eConfig.GetIntervals("quick-start", "wait-resource-versions-become-stable"),
			WaitToRemainStable:       e2eConfig.GetIntervals("quick-start", "wait-resource-versions-remain-stable"),
		})
	}
}

var _ = Describe("When following the Cluster API quick-start", Label("quick-start"), func() {
	capie2e.QuickStartSpec(ctx, func() capie2e.QuickStartSpecInput {
		return capie2e.QuickStartSpecInput{
			E2EConfig:               e2eConfig,
			ClusterctlConfigPath:    clusterctlConfigPath,
			BootstrapClusterProxy:   bootstrapClusterProxy,
			ArtifactFolder:          artifactFolder,
			SkipCleanup:             skipCleanup,
			PostMachinesProvisioned: resilienceChecks(false),
		}
	})
})

var _ = Describe("When following the Cluster API quick-start with ClusterClass", Label("quick-start", "ClusterClass"), func() {
	capie2e.QuickStartSpec(ctx, func() capie2e.QuickStartSpecInput {
		return capie2e.QuickStartSpecInput{
			E2EConfig:               e2eConfig,
			ClusterctlConfigPath:    clusterctlConfigPath,
			BootstrapClusterProxy:   bootstrapClusterProxy,
			ArtifactFolder:          artifactFolder,
			SkipCleanup:             skipCleanup,
			Flavor:                  ptr.To("topology"),
			PostMachinesProvisioned: resilienceChecks(true),
		}
	})
})

// The ClusterClass `kairon-kcp-only` has no worker classes (tests/e2e/e2e_capi_suite.rs writes
// it and the flavor from the shipped topology flavor).
var _ = Describe("When following the Cluster API quick-start with ClusterClass without any worker definitions", Label("quick-start-kcp-only", "ClusterClass"), func() {
	capie2e.QuickStartSpec(ctx, func() capie2e.QuickStartSpecInput {
		return capie2e.QuickStartSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                ptr.To("topology-kcp-only"),
			WorkerMachineCount:    ptr.To[int64](0),
		}
	})
})
