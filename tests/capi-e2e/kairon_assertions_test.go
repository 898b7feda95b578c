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

	// The finalizers the provider's reconcilers add (src/api/mod.rs).
	kaironClusterFinalizer = "kaironcluster.infrastructure.cluster.x-k8s.io"
	kaironMachineFinalizer = "kaironmachine.infrastructure.cluster.x-k8s.io"
)

var (
	coreAPIVersion    = clusterv1.GroupVersion.String()
	clusterOwner      = metav1.OwnerReference{Kind: "Cluster", APIVersion: coreAPIVersion}
	clusterController = metav1.OwnerReference{Kind: "Cluster", APIVersion: coreAPIVersion, Controller: ptr.To(true)}
	clusterClassOwner = metav1.OwnerReference{Kind: "ClusterClass", APIVersion: coreAPIVersion}
	machineController = metav1.OwnerReference{Kind: "Machine", APIVersion: coreAPIVersion, Controller: ptr.To(true)}
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
			// Created from a template by the Machine's owner; the Machine controls it.
			return framework.HasExactOwners(owners, machineController)
		},
		kaironMachineTemplateKind: func(_ types.NamespacedName, owners []metav1.OwnerReference) error {
			// Owned by the Cluster that uses it, or, the templates of a ClusterClass, by the ClusterClass.
			return framework.HasOneOfExactOwners(owners, []metav1.OwnerReference{clusterOwner}, []metav1.OwnerReference{clusterClassOwner})
		},
	}
}

// KaironFinalizersAssertion is the provider's counterpart of DevInfraFinalizersAssertion.
var KaironFinalizersAssertion = map[string]func(types.NamespacedName) []string{
	kaironClusterKind: func(_ types.NamespacedName) []string { return []string{kaironClusterFinalizer} },
	kaironMachineKind: func(_ types.NamespacedName) []string { return []string{kaironMachineFinalizer} },
}
