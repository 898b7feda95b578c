package e2e

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capie2e "sigs.k8s.io/cluster-api/test/e2e"
	"sigs.k8s.io/cluster-api/test/framework"
)

// Node drain with the input of upstream's own Describe (node_drain_test.go): the topology
// flavor (3 control-plane Machines, 1 worker), Deployments with Pods and PodDisruptionBudgets
// on the workload cluster (its kube-controller-manager and kube-scheduler run on the
// simulated control-plane VMs, KWOK plays the kubelets), MachineDrainRules, and a
// VolumeAttachment per Node that blocks each Machine's deletion until the spec lets it go.
var _ = Describe("When testing Node drain", Label("node-drain", "ClusterClass"), func() {
	capie2e.NodeDrainTimeoutSpec(ctx, func() capie2e.NodeDrainTimeoutSpecInput {
		return capie2e.NodeDrainTimeoutSpecInput{
			E2EConfig:              e2eConfig,
			ClusterctlConfigPath:   clusterctlConfigPath,
			BootstrapClusterProxy:  bootstrapClusterProxy,
			ArtifactFolder:         artifactFolder,
			SkipCleanup:            skipCleanup,
			Flavor:                 ptr.To("topology"),
			VerifyNodeVolumeDetach: true,
			CreateAdditionalResources: func(ctx context.Context, clusterProxy framework.ClusterProxy, cluster *clusterv1.Cluster) {
				workloadClusterClient := clusterProxy.GetWorkloadCluster(ctx, cluster.Namespace, cluster.Name).GetClient()

				nodeList := &corev1.NodeList{}
				Expect(workloadClusterClient.List(ctx, nodeList)).To(Succeed())

				// A VolumeAttachment for each Node, without a CSI driver behind it (as upstream).
				for _, node := range nodeList.Items {
					va := volumeAttachment(node)
					Expect(workloadClusterClient.Create(ctx, va)).To(Succeed())
					// Attached: it blocks the deletion of the Node's Machine.
					va.Status.Attached = true
					Expect(workloadClusterClient.Status().Update(ctx, va)).To(Succeed())
				}
			},
		}
	})
})

// volumeAttachment is upstream's generateVolumeAttachment (node_drain_test.go, not exported).
func volumeAttachment(node corev1.Node) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("va-%s", node.GetName()),
			Finalizers: []string{
				"test.cluster.x-k8s.io/block",
			},
		},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: "manual",
			NodeName: node.GetName(),
			Source: storagev1.VolumeAttachmentSource{
				PersistentVolumeName: ptr.To("foo"),
			},
		},
	}
}
