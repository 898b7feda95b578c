package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	capie2e "sigs.k8s.io/cluster-api/test/e2e"
)

// Specs other than the quick-start. Every spec creates its own cluster in its own namespace
// and deletes it; they run one after the other on the shared management cluster, with one
// control-plane Machine where the spec lets us choose.

var _ = Describe("When testing MachineDeployment scale out/in", Label("md-scale"), func() {
	capie2e.MachineDeploymentScaleSpec(ctx, func() capie2e.MachineDeploymentScaleSpecInput {
		return capie2e.MachineDeploymentScaleSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
		}
	})
})

var _ = Describe("When testing KCP and MachineDeployment rollout", Label("kcp-md-rollout"), func() {
	capie2e.KCPAndMachineDeploymentRolloutSpec(ctx, func() capie2e.KCPAndMachineDeploymentRolloutSpecInput {
		return capie2e.KCPAndMachineDeploymentRolloutSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			// The default flavor with Machine taints (tests/e2e/e2e_capi_suite.rs writes it).
			Flavor: "kcp-md-taints",
		}
	})
})

var _ = Describe("When testing MachineDeployment remediation", Label("md-remediation"), func() {
	capie2e.MachineDeploymentRemediationSpec(ctx, func() capie2e.MachineDeploymentRemediationSpecInput {
		return capie2e.MachineDeploymentRemediationSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			// The shipped md-remediation flavor with upstream's test condition in its
			// MachineHealthCheck (tests/e2e/e2e_capi_suite.rs writes it).
			Flavor: ptr.To("md-remediation-e2e"),
		}
	})
})

// Control-plane remediation, including of Machines stuck before kubeadm: the flavor gates
// kubeadm on a signal ConfigMap (a pre-kubeadm script the simulated guests run,
// kairon-sim --guest-scripts-dir); tests/e2e/e2e_capi_suite.rs writes it from the shipped default
// flavor.
var _ = Describe("When testing KCP remediation", Label("kcp-remediation"), func() {
	capie2e.KCPRemediationSpec(ctx, func() capie2e.KCPRemediationSpecInput {
		return capie2e.KCPRemediationSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                ptr.To("kcp-remediation"),
		}
	})
})

// KCP adopts a control-plane Machine made without it: tests/e2e/e2e_capi_suite.rs writes the
// two-step flavor from the shipped default flavor.
var _ = Describe("When testing KCP adoption", Label("kcp-adoption"), func() {
	capie2e.KCPAdoptionSpec(ctx, func() capie2e.KCPAdoptionSpecInput {
		return capie2e.KCPAdoptionSpecInput{
			E2EConfig:            e2eConfig,
			ClusterctlConfigPath: clusterctlConfigPath,
			// Its second step updates the Cluster while CAPI writes the Cluster's status
			// (conflict_proxy_test.go).
			BootstrapClusterProxy: conflictRetryingProxy{bootstrapClusterProxy},
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                ptr.To("kcp-adoption"),
		}
	})
})

func hasOwner(owners []metav1.OwnerReference, kinds ...string) bool {
	for _, o := range owners {
		for _, k := range kinds {
			if o.Kind == k {
				return true
			}
		}
	}
	return false
}

var _ = Describe("When performing cluster deletion with ClusterClass", Label("cluster-deletion", "ClusterClass"), func() {
	capie2e.ClusterDeletionSpec(ctx, func() capie2e.ClusterDeletionSpecInput {
		return capie2e.ClusterDeletionSpecInput{
			E2EConfig:                e2eConfig,
			ClusterctlConfigPath:     clusterctlConfigPath,
			BootstrapClusterProxy:    bootstrapClusterProxy,
			ArtifactFolder:           artifactFolder,
			SkipCleanup:              skipCleanup,
			ControlPlaneMachineCount: ptr.To[int64](1),
			Flavor:                   ptr.To("topology"),
			ClusterDeletionPhases: []capie2e.ClusterDeletionPhase{
				{
					// Workers first: their Machines, MachineSets and MachineDeployments.
					ObjectFilter: func(ref corev1.ObjectReference, owners []metav1.OwnerReference) bool {
						if ref.Kind == "Machine" && hasOwner(owners, "MachineDeployment", "MachineSet") {
							return true
						}
						return ref.Kind == "MachineDeployment" || ref.Kind == "MachineSet"
					},
					BlockingObjectFilter: func(ref corev1.ObjectReference, _ []metav1.OwnerReference) bool {
						return ref.Kind == "Machine"
					},
				},
				{
					// Then the control plane.
					ObjectFilter: func(ref corev1.ObjectReference, owners []metav1.OwnerReference) bool {
						if ref.Kind == "Machine" && hasOwner(owners, "KubeadmControlPlane") {
							return true
						}
						return ref.Kind == "KubeadmControlPlane"
					},
					BlockingObjectFilter: func(ref corev1.ObjectReference, _ []metav1.OwnerReference) bool {
						return ref.Kind == "Machine"
					},
				},
				{
					// Then the KaironCluster.
					ObjectFilter: func(ref corev1.ObjectReference, _ []metav1.OwnerReference) bool {
						return ref.Kind == kaironClusterKind
					},
					BlockingObjectFilter: func(ref corev1.ObjectReference, _ []metav1.OwnerReference) bool {
						return ref.Kind == kaironClusterKind
					},
				},
			},
		}
	})
})

var _ = Describe("When testing ClusterClass changes", Label("clusterclass-changes", "ClusterClass"), func() {
	capie2e.ClusterClassChangesSpec(ctx, func() capie2e.ClusterClassChangesSpecInput {
		return capie2e.ClusterClassChangesSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                "topology",
			ModifyControlPlaneFields: map[string]interface{}{
				"spec.kubeadmConfigSpec.verbosity": int64(4),
			},
			ModifyMachineDeploymentBootstrapConfigTemplateFields: map[string]interface{}{
				"spec.template.spec.verbosity": int64(4),
			},
			// A field of the KaironMachineTemplate that no ClusterClass patch sets: the
			// workers move to the hosts of zone-b (the simulator's hosts are labelled).
			ModifyMachineDeploymentInfrastructureMachineTemplateFields: map[string]interface{}{
				"spec.template.spec.placement.nodeSelector": map[string]interface{}{
					"topology.kairon.zyvor.dev/zone": "zone-b",
				},
			},
		}
	})
})

var _ = Describe("When testing ClusterClass rollouts", Label("clusterclass-rollout", "ClusterClass"), func() {
	capie2e.ClusterClassRolloutSpec(ctx, func() capie2e.ClusterClassRolloutSpecInput {
		return capie2e.ClusterClassRolloutSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			// The topology flavor with Machine taints (tests/e2e/e2e_capi_suite.rs writes it).
			Flavor: "topology-taints",
		}
	})
})
