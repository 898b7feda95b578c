package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	"k8s.io/utils/ptr"

	clusterctlcluster "sigs.k8s.io/cluster-api/cmd/clusterctl/client/cluster"
	capie2e "sigs.k8s.io/cluster-api/test/e2e"
	"sigs.k8s.io/cluster-api/test/framework"
)

// The Runtime SDK specs call the test Runtime Extension (tests/capi-e2e/extension), which
// tests/e2e/e2e_capi_suite.rs runs as a local process where upstream's ExtensionConfigs expect
// its Service. Their flavor, upgrades-runtimesdk, is a Cluster of the ClusterClass
// kairon-runtimesdk, whose machine images the extension patches by Kubernetes version
// (tests/e2e/e2e_capi_suite.rs writes both from the shipped topology flavor).

const (
	extensionServiceNamespace = "test-extension-system"
	extensionServiceName      = "test-extension-webhook-service"
)

// resourceVersionsStable is upstream's PostUpgrade check of the Runtime SDK specs: no
// continuous reconciles once the upgraded cluster is stable.
func resourceVersionsStable(proxy framework.ClusterProxy, namespace, clusterName string) {
	spec := "k8s-upgrade-with-runtimesdk"
	framework.ValidateResourceVersionStable(ctx, framework.ValidateResourceVersionStableInput{
		ClusterProxy:             proxy,
		Namespace:                namespace,
		OwnerGraphFilterFunction: clusterctlcluster.FilterClusterObjectsWithNameFilter(clusterName),
		WaitToBecomeStable:       e2eConfig.GetIntervals(spec, "wait-resource-versions-become-stable"),
		WaitToRemainStable:       e2eConfig.GetIntervals(spec, "wait-resource-versions-remain-stable"),
	})
}

var _ = Describe("When upgrading a workload cluster using ClusterClass with RuntimeSDK [ClusterClass]", Label("runtimesdk-upgrade", "ClusterClass"), func() {
	capie2e.ClusterUpgradeWithRuntimeSDKSpec(ctx, func() capie2e.ClusterUpgradeWithRuntimeSDKSpecInput {
		return capie2e.ClusterUpgradeWithRuntimeSDKSpecInput{
			E2EConfig:                 e2eConfig,
			ClusterctlConfigPath:      clusterctlConfigPath,
			BootstrapClusterProxy:     bootstrapClusterProxy,
			ArtifactFolder:            artifactFolder,
			SkipCleanup:               skipCleanup,
			PostUpgrade:               resourceVersionsStable,
			Flavor:                    ptr.To("upgrades-runtimesdk"),
			ExtensionServiceNamespace: extensionServiceNamespace,
			ExtensionServiceName:      extensionServiceName,
		}
	})
})

var _ = Describe("When upgrading a workload cluster using ClusterClass in a different NS with RuntimeSDK [ClusterClass]", Label("runtimesdk-upgrade-cross-ns", "ClusterClass"), func() {
	capie2e.ClusterUpgradeWithRuntimeSDKSpec(ctx, func() capie2e.ClusterUpgradeWithRuntimeSDKSpecInput {
		return capie2e.ClusterUpgradeWithRuntimeSDKSpecInput{
			E2EConfig:                             e2eConfig,
			ClusterctlConfigPath:                  clusterctlConfigPath,
			BootstrapClusterProxy:                 bootstrapClusterProxy,
			ArtifactFolder:                        artifactFolder,
			SkipCleanup:                           skipCleanup,
			PostUpgrade:                           resourceVersionsStable,
			Flavor:                                ptr.To("upgrades-runtimesdk"),
			DeployClusterClassInSeparateNamespace: true,
			ExtensionServiceNamespace:             extensionServiceNamespace,
			ExtensionServiceName:                  extensionServiceName,
			ExtensionConfigName:                   "k8s-upgrade-with-runtimesdk-cross-ns",
		}
	})
})

var _ = Describe("When following the Cluster API quick-start with v1beta1 ClusterClass [ClusterClass]", Label("quick-start-runtimesdk-v1beta1", "ClusterClass"), func() {
	capie2e.QuickStartSpec(ctx, func() capie2e.QuickStartSpecInput {
		return capie2e.QuickStartSpecInput{
			E2EConfig:                 e2eConfig,
			ClusterctlConfigPath:      clusterctlConfigPath,
			BootstrapClusterProxy:     bootstrapClusterProxy,
			ArtifactFolder:            artifactFolder,
			SkipCleanup:               skipCleanup,
			Flavor:                    ptr.To("topology-runtimesdk-v1beta1"),
			ExtensionServiceNamespace: extensionServiceNamespace,
			ExtensionServiceName:      extensionServiceName,
			PostMachinesProvisioned: func(proxy framework.ClusterProxy, namespace, clusterName string) {
				By("Checking that resourceVersions are stable")
				framework.ValidateResourceVersionStable(ctx, framework.ValidateResourceVersionStableInput{
					ClusterProxy:             proxy,
					Namespace:                namespace,
					OwnerGraphFilterFunction: clusterctlcluster.FilterClusterObjectsWithNameFilter(clusterName),
					WaitToBecomeStable:       e2eConfig.GetIntervals("quick-start", "wait-resource-versions-become-stable"),
					WaitToRemainStable:       e2eConfig.GetIntervals("quick-start", "wait-resource-versions-remain-stable"),
				})
			},
		}
	})
})

var _ = Describe("When testing KCP infra adoption [ClusterClass]", Label("kcp-infra-adoption", "ClusterClass"), func() {
	capie2e.KCPInfraAdoptionSpec(ctx, func() capie2e.KCPInfraAdoptionSpecInput {
		return capie2e.KCPInfraAdoptionSpecInput{
			E2EConfig:                 e2eConfig,
			ClusterctlConfigPath:      clusterctlConfigPath,
			BootstrapClusterProxy:     bootstrapClusterProxy,
			ArtifactFolder:            artifactFolder,
			SkipCleanup:               skipCleanup,
			Flavor:                    ptr.To("upgrades-runtimesdk"),
			ExtensionServiceNamespace: extensionServiceNamespace,
			ExtensionServiceName:      extensionServiceName,
		}
	})
})

var _ = Describe("When in-place updating a workload cluster using ClusterClass", Label("in-place-update", "ClusterClass"), func() {
	capie2e.ClusterInPlaceUpdateSpec(ctx, func() capie2e.ClusterInPlaceUpdateSpecInput {
		return capie2e.ClusterInPlaceUpdateSpecInput{
			E2EConfig:                 e2eConfig,
			ClusterctlConfigPath:      clusterctlConfigPath,
			BootstrapClusterProxy:     bootstrapClusterProxy,
			ArtifactFolder:            artifactFolder,
			SkipCleanup:               skipCleanup,
			Flavor:                    ptr.To("upgrades-runtimesdk"),
			ExtensionServiceNamespace: extensionServiceNamespace,
			ExtensionServiceName:      extensionServiceName,
			// Upstream's: KCP rolls out by scaling in, the MachineDeployment may take its one
			// worker down, so every change is done in place without new Machines.
			ClusterctlVariables: map[string]string{
				"KUBEADM_CONTROL_PLANE_MAX_SURGE": "0",
				"MD_MAX_SURGE":                    "1",
				"MD_MAX_UNAVAILABLE":              "1",
			},
		}
	})
})
