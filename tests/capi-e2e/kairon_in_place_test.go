package e2e

import (
	"fmt"
	"maps"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	"sigs.k8s.io/cluster-api/test/framework"
	"sigs.k8s.io/cluster-api/test/framework/clusterctl"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
)

// What CAPI's in-place updates mean for Kairon VMs, on the same flavor and test Runtime
// Extension as the in-place update spec: a change of the bootstrap files is made in place and
// every VM is kept (same Kairon Machine UIDs); a change Kairon cannot make to a running VM
// (a worker's CPUs: every KaironMachine field is immutable) rolls that worker out onto a new
// VM and keeps the others.
var _ = Describe("When changing the machines of a Kairon cluster with in-place updates enabled", Label("kairon-in-place", "ClusterClass"), func() {
	const specName = "kairon-in-place"
	It("keeps every VM for a bootstrap files change and rolls a worker out for a CPU change", func() {
		mgmt := bootstrapClusterProxy.GetClient()
		namespace := framework.CreateNamespace(ctx, framework.CreateNamespaceInput{Creator: mgmt, Name: fmt.Sprintf("%s-%s", specName, util.RandomString(6))})
		extension := kaironInPlaceExtensionConfig(specName+"-"+util.RandomString(6), namespace.Name)
		Expect(mgmt.Create(ctx, extension)).To(Succeed())

		clusterResources := new(clusterctl.ApplyClusterTemplateAndWaitResult)
		clusterctl.ApplyClusterTemplateAndWait(ctx, clusterctl.ApplyClusterTemplateAndWaitInput{
			ClusterProxy: bootstrapClusterProxy,
			ConfigCluster: clusterctl.ConfigClusterInput{
				LogFolder:            fmt.Sprintf("%s/clusters/%s", artifactFolder, bootstrapClusterProxy.GetName()),
				ClusterctlConfigPath: clusterctlConfigPath,
				// As the in-place update spec: KCP scales in, the MachineDeployment may take its
				// worker down.
				ClusterctlVariables: map[string]string{
					"EXTENSION_CONFIG_NAME":           extension.Name,
					"KUBEADM_CONTROL_PLANE_MAX_SURGE": "0",
					"MD_MAX_SURGE":                    "1",
					"MD_MAX_UNAVAILABLE":              "1",
				},
				KubeconfigPath:           bootstrapClusterProxy.GetKubeconfigPath(),
				Flavor:                   "upgrades-runtimesdk",
				Namespace:                namespace.Name,
				ClusterName:              fmt.Sprintf("%s-%s", specName, util.RandomString(6)),
				KubernetesVersion:        e2eConfig.MustGetVariable("KUBERNETES_VERSION"),
				ControlPlaneMachineCount: ptr.To[int64](3),
				WorkerMachineCount:       ptr.To[int64](1),
			},
			WaitForClusterIntervals:      e2eConfig.GetIntervals(specName, "wait-cluster"),
			WaitForControlPlaneIntervals: e2eConfig.GetIntervals(specName, "wait-control-plane"),
			WaitForMachineDeployments:    e2eConfig.GetIntervals(specName, "wait-worker-nodes"),
		}, clusterResources)
		cluster := clusterResources.Cluster

		before := kaironVMs(mgmt, cluster)
		Expect(before).To(HaveLen(4), "a Kairon Machine per KaironMachine")

		By("Changing the bootstrap files: done in place")
		setClusterVariable(mgmt, cluster, "files", `[{"path":"/tmp/kairon-in-place","content":"in place"}]`)
		Eventually(func(g Gomega) {
			upToDate(g, mgmt, cluster)
			configs := &unstructured.UnstructuredList{}
			configs.SetGroupVersionKind(schema.GroupVersionKind{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmConfigList"})
			g.Expect(mgmt.List(ctx, configs, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name})).To(Succeed())
			g.Expect(configs.Items).To(HaveLen(4))
			for _, c := range configs.Items {
				files, _, _ := unstructured.NestedSlice(c.Object, "spec", "files")
				g.Expect(files).To(ContainElement(HaveKeyWithValue("path", "/tmp/kairon-in-place")), "KubeadmConfig %s has the file", c.GetName())
			}
		}, e2eConfig.GetIntervals(specName, "wait-machine-upgrade")...).Should(Succeed())
		Consistently(func() map[string]string { return kaironVMs(mgmt, cluster) }, 20*time.Second, 2*time.Second).Should(Equal(before),
			"the same KaironMachines on the same Kairon Machines (UIDs) after the in-place change")

		By("Changing the workers' CPUs: Kairon cannot, so the worker rolls out")
		setClusterVariable(mgmt, cluster, "workerMachine", `{"cpus":3,"memory":"4Gi","diskSize":"20Gi","evictionStrategy":"LiveMigrateIfPossible"}`)
		Eventually(func(g Gomega) {
			upToDate(g, mgmt, cluster)
			after := kaironVMs(mgmt, cluster)
			g.Expect(after).To(HaveLen(4))
			kept := 0
			for name, uid := range after {
				if before[name] == uid {
					kept++
					continue
				}
				g.Expect(slices.Contains(slices.Collect(maps.Values(before)), uid)).To(BeFalse(), "KaironMachine %s is a new VM", name)
				km := &unstructured.Unstructured{}
				km.SetGroupVersionKind(schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1alpha1", Kind: "KaironMachine"})
				g.Expect(mgmt.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, km)).To(Succeed())
				cpus, _, _ := unstructured.NestedInt64(km.Object, "spec", "resources", "cpu")
				g.Expect(cpus).To(BeEquivalentTo(3), "the new worker's KaironMachine %s has the new CPUs", name)
			}
			g.Expect(kept).To(Equal(3), "the control plane's VMs kept, the worker's replaced: before %v, after %v", before, after)
			machines := &clusterv1.MachineList{}
			g.Expect(mgmt.List(ctx, machines, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name})).To(Succeed())
			g.Expect(machines.Items).To(HaveLen(4))
			for _, m := range machines.Items {
				g.Expect(conditions.IsTrue(&m, clusterv1.ReadyCondition)).To(BeTrue(), "Machine %s Ready", m.Name)
			}
		}, e2eConfig.GetIntervals(specName, "wait-machine-upgrade")...).Should(Succeed())

		By("Deleting the cluster")
		framework.DeleteCluster(ctx, framework.DeleteClusterInput{Deleter: mgmt, Cluster: cluster})
		framework.WaitForClusterDeleted(ctx, framework.WaitForClusterDeletedInput{
			ClusterProxy:         bootstrapClusterProxy,
			ClusterctlConfigPath: clusterctlConfigPath,
			Cluster:              cluster,
			ArtifactFolder:       artifactFolder,
		}, e2eConfig.GetIntervals(specName, "wait-delete-cluster")...)
		Expect(kaironVMs(mgmt, cluster)).To(BeEmpty(), "no Kairon Machine left")
		Expect(mgmt.Delete(ctx, extension)).To(Succeed())
		framework.DeleteNamespace(ctx, framework.DeleteNamespaceInput{Deleter: mgmt, Name: namespace.Name})
	})
})

// kaironInPlaceExtensionConfig registers the test Runtime Extension for one namespace, its
// hooks answering without blocking and in-place updates allowed (the settings the
// extension's handlers read, as upstream's specs write them).
func kaironInPlaceExtensionConfig(name, namespace string) *runtimev1.ExtensionConfig {
	return &runtimev1.ExtensionConfig{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Annotations: map[string]string{
				runtimev1.InjectCAFromSecretAnnotation: fmt.Sprintf("%s/%s-cert", extensionServiceNamespace, extensionServiceName),
			},
		},
		Spec: runtimev1.ExtensionConfigSpec{
			ClientConfig: runtimev1.ClientConfig{
				Service: runtimev1.ServiceReference{Name: extensionServiceName, Namespace: extensionServiceNamespace},
			},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{namespace},
			}}},
			Settings: map[string]string{
				"extensionConfigName":          name,
				"disableInPlaceUpdates":        "false",
				"defaultAllHandlersToBlocking": "false",
			},
		},
	}
}

// kaironVMs maps each KaironMachine of the cluster to the UID of its Kairon Machine.
func kaironVMs(c client.Client, cluster *clusterv1.Cluster) map[string]string {
	vms := &unstructured.UnstructuredList{}
	vms.SetGroupVersionKind(schema.GroupVersionKind{Group: "kairon.zyvor.dev", Version: "v1alpha1", Kind: "MachineList"})
	Expect(c.List(ctx, vms, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name})).To(Succeed())
	out := map[string]string{}
	for _, vm := range vms.Items {
		if vm.GetDeletionTimestamp() == nil {
			out[vm.GetName()] = string(vm.GetUID())
		}
	}
	return out
}

// upToDate: every Machine of the cluster up to date with its topology and the Cluster
// available.
func upToDate(g Gomega, c client.Client, cluster *clusterv1.Cluster) {
	current := &clusterv1.Cluster{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cluster), current)).To(Succeed())
	for _, t := range []string{clusterv1.ClusterControlPlaneMachinesUpToDateCondition, clusterv1.ClusterWorkerMachinesUpToDateCondition, clusterv1.ClusterAvailableCondition} {
		g.Expect(conditions.IsTrue(current, t)).To(BeTrue(), "Cluster condition %s", t)
	}
}

// setClusterVariable sets one topology variable of the Cluster to a JSON value.
func setClusterVariable(c client.Client, cluster *clusterv1.Cluster, name, value string) {
	Eventually(func() error {
		current := &clusterv1.Cluster{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), current); err != nil {
			return err
		}
		patched := current.DeepCopy()
		patched.Spec.Topology.Variables = slices.DeleteFunc(patched.Spec.Topology.Variables, func(v clusterv1.ClusterVariable) bool { return v.Name == name })
		patched.Spec.Topology.Variables = append(patched.Spec.Topology.Variables, clusterv1.ClusterVariable{Name: name, Value: apiextensionsv1.JSON{Raw: []byte(value)}})
		return c.Patch(ctx, patched, client.MergeFrom(current))
	}, 30*time.Second, time.Second).Should(Succeed())
}
