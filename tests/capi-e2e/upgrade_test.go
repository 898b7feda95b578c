package e2e

import (
	"context"
	"errors"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capie2e "sigs.k8s.io/cluster-api/test/e2e"
	"sigs.k8s.io/cluster-api/test/framework"
	"sigs.k8s.io/cluster-api/util/conditions"
)

// A Kubernetes upgrade of a Cluster of the shipped ClusterClass, whose patches give each
// machine the image of its version: KUBERNETES_VERSION_UPGRADE_FROM to _TO (see
// tests/e2e/e2e_capi_suite.rs). Upstream's input, conformance tests skipped as upstream does.
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

// KCP's pre-drain hook holds each old control-plane Machine until the workload cluster is
// stable (every Node Ready, a Ready kube-proxy Pod per Node); the spec's caller releases it.
// tests/e2e/e2e_capi_suite.rs writes the flavor: the shipped topology flavor with the hook's
// annotation on the control plane.
var _ = Describe("When upgrading a workload cluster using ClusterClass with a HA control plane [ClusterClass]", Label("k8s-upgrade-ha", "ClusterClass"), func() {
	controlPlaneMachineCount := int64(3)
	capie2e.ClusterUpgradeConformanceSpec(ctx, func() capie2e.ClusterUpgradeConformanceSpecInput {
		return capie2e.ClusterUpgradeConformanceSpecInput{
			E2EConfig:                e2eConfig,
			ClusterctlConfigPath:     clusterctlConfigPath,
			BootstrapClusterProxy:    bootstrapClusterProxy,
			ArtifactFolder:           artifactFolder,
			SkipCleanup:              skipCleanup,
			SkipConformanceTests:     true,
			ControlPlaneMachineCount: ptr.To(controlPlaneMachineCount),
			WorkerMachineCount:       ptr.To[int64](1),
			Flavor:                   ptr.To("kcp-pre-drain"),
			PreWaitForControlPlaneToBeUpgraded: func(proxy framework.ClusterProxy, namespace, name string) {
				cluster := &clusterv1.Cluster{}
				Expect(proxy.GetClient().Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cluster)).To(Succeed())
				Eventually(func() (int64, error) {
					return releaseStableControlPlaneDeletion(ctx, proxy, cluster)
				}, e2eConfig.GetIntervals("k8s-upgrade-and-conformance", "wait-machine-upgrade")...).Should(Equal(controlPlaneMachineCount),
					"the control-plane Machines of Cluster %s/%s upgraded to %s", namespace, name, cluster.Spec.Topology.Version)
			},
		}
	})
})

// KCP rolls out by removing a Machine before creating its replacement (maxSurge 0): the flavor
// is the shipped topology flavor on a copy of the class that sets it (tests/e2e/e2e_capi_suite.rs).
var _ = Describe("When upgrading a workload cluster using ClusterClass with a HA control plane using scale-in rollout [ClusterClass]", Label("k8s-upgrade-scale-in", "ClusterClass"), func() {
	capie2e.ClusterUpgradeConformanceSpec(ctx, func() capie2e.ClusterUpgradeConformanceSpecInput {
		return capie2e.ClusterUpgradeConformanceSpecInput{
			E2EConfig:                e2eConfig,
			ClusterctlConfigPath:     clusterctlConfigPath,
			BootstrapClusterProxy:    bootstrapClusterProxy,
			ArtifactFolder:           artifactFolder,
			SkipCleanup:              skipCleanup,
			SkipConformanceTests:     true,
			ControlPlaneMachineCount: ptr.To[int64](3),
			WorkerMachineCount:       ptr.To[int64](1),
			Flavor:                   ptr.To("kcp-scale-in"),
		}
	})
})

const kcpReadyCheckHook = "pre-drain.delete.hook.machine.cluster.x-k8s.io/kcp-ready-check"

// releaseStableControlPlaneDeletion counts the control-plane Machines of the Cluster's version
// with a healthy Node, once none is left of another. A deleting Machine held by the pre-drain
// hook is released when the workload cluster is stable; at most one may be deleting at a time.
func releaseStableControlPlaneDeletion(ctx context.Context, proxy framework.ClusterProxy, cluster *clusterv1.Cluster) (int64, error) {
	machines := framework.GetControlPlaneMachinesByCluster(ctx, framework.GetControlPlaneMachinesByClusterInput{
		Lister:      proxy.GetClient(),
		ClusterName: cluster.Name,
		Namespace:   cluster.Namespace,
	})
	var upgraded int64
	var deleting []clusterv1.Machine
	for _, m := range machines {
		if m.Spec.Version == cluster.Spec.Topology.Version && conditions.IsTrue(&m, clusterv1.MachineNodeHealthyCondition) {
			upgraded++
		}
		if !m.DeletionTimestamp.IsZero() {
			deleting = append(deleting, m)
		}
	}
	if err := workloadStable(ctx, proxy.GetWorkloadCluster(ctx, cluster.Namespace, cluster.Name).GetClient()); err != nil {
		return 0, fmt.Errorf("holding the control plane's rollout: %w", err)
	}
	switch {
	case len(deleting) > 1:
		return 0, fmt.Errorf("%d control-plane Machines deleting at once, expected at most 1", len(deleting))
	case len(deleting) == 1:
		m := deleting[0]
		if m.Annotations[kcpReadyCheckHook] != "true" {
			return 0, fmt.Errorf("Machine %s is deleting without the pre-drain hook %s", m.Name, kcpReadyCheckHook)
		}
		before := m.DeepCopy()
		delete(m.Annotations, kcpReadyCheckHook)
		if err := proxy.GetClient().Patch(ctx, &m, client.MergeFrom(before)); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("released the pre-drain hook of Machine %s", m.Name)
	case int64(len(machines)) > upgraded:
		return 0, errors.New("control-plane Machines of the old version remain")
	}
	return upgraded, nil
}

// workloadStable: every Node Ready, and one Ready kube-proxy Pod per Node.
func workloadStable(ctx context.Context, c client.Client) error {
	nodes := corev1.NodeList{}
	if err := c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	pods := corev1.PodList{}
	if err := c.List(ctx, &pods, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{"k8s-app": "kube-proxy"}); err != nil {
		return fmt.Errorf("listing kube-proxy Pods: %w", err)
	}
	var problems []error
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
				problems = append(problems, fmt.Errorf("Node %s not Ready: %s", n.Name, c.Message))
			}
		}
	}
	if len(nodes.Items) != len(pods.Items) {
		problems = append(problems, fmt.Errorf("%d kube-proxy Pods for %d Nodes", len(pods.Items), len(nodes.Items)))
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
				problems = append(problems, fmt.Errorf("kube-proxy Pod %s not Ready", p.Name))
			}
		}
	}
	return errors.Join(problems...)
}
