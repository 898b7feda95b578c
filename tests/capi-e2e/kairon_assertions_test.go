package e2e

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/test/framework"
)

// The provider's kinds, as the framework's owner-reference, finalizer and resourceVersion
// checks see them (by Kind). Kairon's own Machine (kairon.zyvor.dev) is not installed by
// clusterctl, so it is not part of clusterctl's object graph.
const (
	kaironClusterKind         = "KaironCluster"
	kaironClusterTemplateKind = "KaironClusterTemplate"
	kaironMachineKind         = "KaironMachine"
	kaironMachineTemplateKind = "KaironMachineTemplate"
	kaironMachinePoolKind     = "KaironMachinePool"
	// The shipped ClusterClass's pool class clones KaironMachinePools from one.
	kaironMachinePoolTemplateKind = "KaironMachinePoolTemplate"

	// The finalizers the provider's reconcilers add (src/api/mod.rs).
	kaironClusterFinalizer     = "kaironcluster.infrastructure.cluster.x-k8s.io"
	kaironMachineFinalizer     = "kaironmachine.infrastructure.cluster.x-k8s.io"
	kaironMachinePoolFinalizer = "kaironmachinepool.infrastructure.cluster.x-k8s.io"
)

var (
	coreAPIVersion        = clusterv1.GroupVersion.String()
	clusterOwner          = metav1.OwnerReference{Kind: "Cluster", APIVersion: coreAPIVersion}
	clusterController     = metav1.OwnerReference{Kind: "Cluster", APIVersion: coreAPIVersion, Controller: ptr.To(true)}
	clusterClassOwner     = metav1.OwnerReference{Kind: "ClusterClass", APIVersion: coreAPIVersion}
	machineController     = metav1.OwnerReference{Kind: "Machine", APIVersion: coreAPIVersion, Controller: ptr.To(true)}
	machinePoolController = metav1.OwnerReference{Kind: "MachinePool", APIVersion: coreAPIVersion, Controller: ptr.To(true)}
	// A pool's KaironMachine names its KaironMachinePool as a plain owner from creation; CAPI's
	// Machine controller then adds the Machine as its controller beside it
	// (src/controller/kairon_machine_pool/instances.rs).
	kaironMachinePoolOwner = metav1.OwnerReference{Kind: kaironMachinePoolKind, APIVersion: "infrastructure.cluster.x-k8s.io/v1alpha1"}
)

// KaironOwnerReferenceAssertions is the provider's counterpart of the framework's
// DevInfraOwnerReferenceAssertions. With a topology, the Cluster controls the KaironCluster;
// without one, the Cluster only owns it.
func KaironOwnerReferenceAssertions(topologyManaged bool) map[string]func(types.NamespacedName, []metav1.OwnerReference) error {
	clusterRef := clusterOwner
	if topologyManaged {
		clusterRef = clusterController
	}
	return map[string]func(types.NamespacedName, []metav1.OwnerReference) error{
		kaironClusterKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			return framework.HasExactOwners(owners, clusterRef)
		},
		kaironClusterTemplateKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			// Referenced by a ClusterClass, which owns it.
			return framework.HasExactOwners(owners, clusterClassOwner)
		},
		kaironMachineKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			// Created from a template by the Machine's owner, the Machine controls it; or made
			// by its KaironMachinePool for a VM of the pool, which stays an owner beside the
			// Machine CAPI makes for it (the pool's reference is written at creation only, so
			// after the owner references are removed the Machine's comes back alone).
			return framework.HasOneOfExactOwners(owners,
				[]metav1.OwnerReference{machineController},
				[]metav1.OwnerReference{machineController, kaironMachinePoolOwner})
		},
		kaironMachineTemplateKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			// Owned by the Cluster that uses it, or, the templates of a ClusterClass, by the ClusterClass.
			return framework.HasOneOfExactOwners(owners, []metav1.OwnerReference{clusterOwner}, []metav1.OwnerReference{clusterClassOwner})
		},
		kaironMachinePoolKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			// The MachinePool controls it; a topology's is also owned by its Cluster (CAPI's
			// topology controller writes that reference on the pools it makes).
			if topologyManaged {
				return framework.HasExactOwners(owners, machinePoolController, clusterOwner)
			}
			return framework.HasExactOwners(owners, machinePoolController)
		},
		kaironMachinePoolTemplateKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			// Referenced by a ClusterClass's machinePools class, which owns it.
			return framework.HasExactOwners(owners, clusterClassOwner)
		},
	}
}

// KaironFinalizersAssertion is the provider's counterpart of DevInfraFinalizersAssertion.
var KaironFinalizersAssertion = map[string]func(types.NamespacedName) []string{
	kaironClusterKind:     func(_ types.NamespacedName) []string { return []string{kaironClusterFinalizer} },
	kaironMachineKind:     func(_ types.NamespacedName) []string { return []string{kaironMachineFinalizer} },
	kaironMachinePoolKind: func(_ types.NamespacedName) []string { return []string{kaironMachinePoolFinalizer} },
}
