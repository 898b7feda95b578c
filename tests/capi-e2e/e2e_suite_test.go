// Package e2e runs Cluster API's own end-to-end specs (sigs.k8s.io/cluster-api/test/e2e)
// against the Kairon provider.
//
// The management cluster is not created here: tests/e2e/e2e_capi_suite.rs starts it (etcd,
// kube-apiserver, CAPI core, CABPK and KCP, the provider's manager and the Kairon simulator,
// all as local processes) and passes its kubeconfig. The framework uses it as an existing
// cluster; clusterctl init is not run, since the controllers already run. What clusterctl
// needs to know the providers (the inventory, the clusterctl labels on the CRDs) and the
// local repository (from the e2e config) are set up in the BeforeSuite.
package e2e

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	clusterctlconfig "sigs.k8s.io/cluster-api/cmd/clusterctl/config"
	"sigs.k8s.io/cluster-api/test/framework"
	"sigs.k8s.io/cluster-api/test/framework/clusterctl"
	"sigs.k8s.io/cluster-api/test/framework/ginkgoextensions"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
)

var (
	configPath     string
	artifactFolder string
	kubeconfigPath string
	skipCleanup    bool

	ctx = ctrl.SetupSignalHandler()

	e2eConfig             *clusterctl.E2EConfig
	clusterctlConfigPath  string
	bootstrapClusterProxy framework.ClusterProxy
)

func init() {
	flag.StringVar(&configPath, "e2e.config", "", "path to the e2e config file")
	flag.StringVar(&artifactFolder, "e2e.artifacts-folder", "", "folder where e2e test artifacts are stored")
	flag.StringVar(&kubeconfigPath, "e2e.kubeconfig", "", "kubeconfig of the running management cluster")
	flag.BoolVar(&skipCleanup, "e2e.skip-resource-cleanup", false, "if true, the resource cleanup after tests is skipped")
}

func TestE2E(t *testing.T) {
	g := NewWithT(t)
	ctrl.SetLogger(klog.Background())
	g.Expect(os.MkdirAll(artifactFolder, 0o755)).To(Succeed())
	RegisterFailHandler(Fail)
	w, err := ginkgoextensions.EnableFileLogging(filepath.Join(artifactFolder, "ginkgo-log.txt"))
	g.Expect(err).ToNot(HaveOccurred())
	defer w.Close()
	RunSpecs(t, "capi-e2e")
}

var _ = BeforeSuite(func() {
	Expect(configPath).To(BeAnExistingFile(), "-e2e.config must name the e2e config file")
	Expect(kubeconfigPath).To(BeAnExistingFile(), "-e2e.kubeconfig must name the management cluster's kubeconfig")

	scheme := runtime.NewScheme()
	framework.TryAddDefaultSchemes(scheme)

	By("Loading the e2e config from " + configPath)
	e2eConfig = clusterctl.LoadE2EConfig(ctx, clusterctl.LoadE2EConfigInput{ConfigPath: configPath})
	Expect(e2eConfig).ToNot(BeNil())

	By("Creating a clusterctl local repository")
	clusterctlConfigPath = clusterctl.CreateRepository(ctx, clusterctl.CreateRepositoryInput{
		E2EConfig:        e2eConfig,
		RepositoryFolder: filepath.Join(artifactFolder, "repository"),
	})

	By("Using the running management cluster")
	bootstrapClusterProxy = framework.NewClusterProxy("bootstrap", kubeconfigPath, scheme)
	Expect(bootstrapClusterProxy).ToNot(BeNil())

	By("Registering the running providers in the clusterctl inventory")
	registerProviders(ctx, bootstrapClusterProxy.GetClient, e2eConfig)

	By("Publishing the management cluster's address in kube-public/cluster-info")
	publishClusterInfo(ctx, bootstrapClusterProxy)
})

// publishClusterInfo writes the ConfigMap kubeadm leaves in every cluster it makes
// (kube-public/cluster-info: a kubeconfig naming the API server), from which the KCP
// remediation spec tells its guests where to poll for their signal. The management
// cluster here was not made by kubeadm.
func publishClusterInfo(ctx context.Context, proxy framework.ClusterProxy) {
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters[""] = &clientcmdapi.Cluster{Server: proxy.GetRESTConfig().Host}
	data, err := clientcmd.Write(*kubeconfig)
	Expect(err).ToNot(HaveOccurred())
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespacePublic, Name: "cluster-info"},
		Data:       map[string]string{"kubeconfig": string(data)},
	}
	c := proxy.GetClient()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: metav1.NamespacePublic}}); err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).ToNot(HaveOccurred())
	}
	if err := c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).ToNot(HaveOccurred())
	}
}

var _ = AfterSuite(func() {
	if bootstrapClusterProxy != nil {
		bootstrapClusterProxy.Dispose(ctx)
	}
})

// providerCRDGroups maps a CRD group to the provider (clusterctl's manifest label) that owns it.
var providerCRDGroups = map[string]string{
	"cluster.x-k8s.io":                clusterctlv1.ManifestLabel("cluster-api", clusterctlv1.CoreProviderType),
	"addons.cluster.x-k8s.io":         clusterctlv1.ManifestLabel("cluster-api", clusterctlv1.CoreProviderType),
	"runtime.cluster.x-k8s.io":        clusterctlv1.ManifestLabel("cluster-api", clusterctlv1.CoreProviderType),
	"ipam.cluster.x-k8s.io":           clusterctlv1.ManifestLabel("cluster-api", clusterctlv1.CoreProviderType),
	"bootstrap.cluster.x-k8s.io":      clusterctlv1.ManifestLabel("kubeadm", clusterctlv1.BootstrapProviderType),
	"controlplane.cluster.x-k8s.io":   clusterctlv1.ManifestLabel("kubeadm", clusterctlv1.ControlPlaneProviderType),
	"infrastructure.cluster.x-k8s.io": clusterctlv1.ManifestLabel("kairon", clusterctlv1.InfrastructureProviderType),
}

// registerProviders does what `clusterctl init` leaves behind besides the Deployments: the
// inventory CRD with one Provider per provider of the e2e config (at its first version), and
// the clusterctl labels on the providers' CRDs, which clusterctl's object graph (used by the
// owner-reference, finalizer and resourceVersion checks, and by move) discovers types by.
func registerProviders(ctx context.Context, newClient func() client.Client, config *clusterctl.E2EConfig) {
	c := newClient()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := c.Get(ctx, client.ObjectKey{Name: "providers.clusterctl.cluster.x-k8s.io"}, crd)
	if apierrors.IsNotFound(err) {
		objs, err := utilyaml.ToUnstructured(clusterctlconfig.ClusterctlAPIManifest)
		Expect(err).ToNot(HaveOccurred())
		// Both halves of the suite run this against one management cluster at once: the
		// other one may have created it meanwhile.
		for i := range objs {
			if err := c.Create(ctx, &objs[i]); err != nil && !apierrors.IsAlreadyExists(err) {
				Expect(err).ToNot(HaveOccurred())
			}
		}
		Eventually(func() bool {
			got := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKey{Name: "providers.clusterctl.cluster.x-k8s.io"}, got); err != nil {
				return false
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true
				}
			}
			return false
		}, "30s", "200ms").Should(BeTrue(), "the clusterctl inventory CRD is not established")
	} else {
		Expect(err).ToNot(HaveOccurred())
	}

	for _, p := range config.Providers {
		Expect(p.Versions).ToNot(BeEmpty(), "provider %s has no version", p.Name)
		label := clusterctlv1.ManifestLabel(p.Name, clusterctlv1.ProviderType(p.Type))
		ns := label + "-system"
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			Expect(err).ToNot(HaveOccurred())
		}
		provider := &clusterctlv1.Provider{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns,
				Name:      label,
				Labels: map[string]string{
					clusterctlv1.ClusterctlLabel:     "",
					clusterv1.ProviderNameLabel:      label,
					clusterctlv1.ClusterctlCoreLabel: clusterctlv1.ClusterctlCoreLabelInventoryValue,
				},
			},
			ProviderName: p.Name,
			Type:         p.Type,
			Version:      p.Versions[0].Name,
		}
		// Discovery may not serve the inventory CRD yet right after it is Established: retry
		// with a fresh client (and REST mapper) until it does.
		Eventually(func() error {
			err := newClient().Create(ctx, provider.DeepCopy())
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}, "60s", "500ms").Should(Succeed(), "creating the inventory Provider %s", provider.Name)
	}

	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	Expect(c.List(ctx, crds)).To(Succeed())
	for i := range crds.Items {
		crd := &crds.Items[i]
		label, ok := providerCRDGroups[crd.Spec.Group]
		if !ok {
			continue
		}
		patch := client.MergeFrom(crd.DeepCopy())
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		crd.Labels[clusterctlv1.ClusterctlLabel] = ""
		crd.Labels[clusterv1.ProviderNameLabel] = label
		Expect(c.Patch(ctx, crd, patch)).To(Succeed())
	}
}
