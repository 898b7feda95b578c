// Command extension is the test Runtime Extension the Runtime SDK specs of Cluster API's e2e
// package call, run by tests/e2e/e2e_capi_suite.rs as a local process.
//
// The lifecycle and upgrade-plan handlers are upstream's (sigs.k8s.io/cluster-api/test/extension,
// generic over providers); the topology-mutation and in-place update handlers are ours, for the
// Kairon kinds (topologymutation.go, inplaceupdate.go). The specs register the extension with an ExtensionConfig naming a
// Service; Cluster API calls it at https://<service>.<namespace>.svc:443, through the HTTP
// proxy CAPI core is started with (HTTPS_PROXY): this process serves that proxy too and
// tunnels CONNECTs for the Service's host, and only those, to its own TLS listener
// (proxy.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	"sigs.k8s.io/cluster-api/exp/runtime/server"
	"sigs.k8s.io/cluster-api/test/extension/handlers/lifecycle"
	"sigs.k8s.io/cluster-api/test/extension/handlers/upgradeplan"
)

func main() {
	var (
		webhookPort int
		certDir     string
		proxyAddr   string
		serviceHost string
	)
	klog.InitFlags(nil)
	flag.IntVar(&webhookPort, "webhook-port", 0, "loopback port of the Runtime Extension's TLS listener")
	flag.StringVar(&certDir, "webhook-cert-dir", "", "directory with tls.crt and tls.key, issued for the Service's host")
	flag.StringVar(&proxyAddr, "proxy-address", "", "address of the HTTP CONNECT proxy CAPI core reaches the extension through")
	flag.StringVar(&serviceHost, "service-host", "", "the host CAPI calls, <service>.<namespace>.svc")
	flag.Parse()
	ctrl.SetLogger(klog.Background())
	log := ctrl.Log.WithName("test-extension")

	if err := run(ctrl.SetupSignalHandler(), webhookPort, certDir, proxyAddr, serviceHost); err != nil {
		log.Error(err, "test extension failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, webhookPort int, certDir, proxyAddr, serviceHost string) error {
	if webhookPort <= 0 || certDir == "" || proxyAddr == "" || serviceHost == "" {
		return fmt.Errorf("--webhook-port, --webhook-cert-dir, --proxy-address and --service-host are required")
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	// The lifecycle handlers read and write the spec's hook-response ConfigMaps.
	c, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	catalog := runtimecatalog.New()
	if err := runtimehooksv1.AddToCatalog(catalog); err != nil {
		return err
	}
	srv, err := server.New(server.Options{
		Catalog: catalog,
		Host:    "127.0.0.1",
		Port:    webhookPort,
		CertDir: certDir,
	})
	if err != nil {
		return err
	}
	if err := addHandlers(srv, c); err != nil {
		return err
	}

	proxy, err := net.Listen("tcp", proxyAddr)
	if err != nil {
		return err
	}
	go serveTunnels(ctx, proxy, net.JoinHostPort(serviceHost, "443"), net.JoinHostPort("127.0.0.1", strconv.Itoa(webhookPort)))
	return srv.Start(ctx)
}

// addHandlers registers every handler under the names the e2e ClusterClasses and the specs
// use (upstream's test extension's).
func addHandlers(srv *server.Server, c client.Client) error {
	lc := lifecycle.NewExtensionHandlers(c)
	plan := upgradeplan.NewExtensionHandlers(c)
	patches := newTopologyMutationHandlers()
	var inPlace inPlaceUpdateHandlers
	for _, h := range []server.ExtensionHandler{
		{Hook: runtimehooksv1.GeneratePatches, Name: "generate-patches", HandlerFunc: patches.GeneratePatches},
		{Hook: runtimehooksv1.DiscoverVariables, Name: "discover-variables", HandlerFunc: patches.DiscoverVariables},
		{Hook: runtimehooksv1.BeforeClusterCreate, Name: "before-cluster-create", HandlerFunc: lc.DoBeforeClusterCreate},
		{Hook: runtimehooksv1.AfterControlPlaneInitialized, Name: "after-control-plane-initialized", HandlerFunc: lc.DoAfterControlPlaneInitialized},
		{Hook: runtimehooksv1.BeforeClusterUpgrade, Name: "before-cluster-upgrade", HandlerFunc: lc.DoBeforeClusterUpgrade},
		{Hook: runtimehooksv1.BeforeControlPlaneUpgrade, Name: "before-control-plane-upgrade", HandlerFunc: lc.DoBeforeControlPlaneUpgrade},
		{Hook: runtimehooksv1.AfterControlPlaneUpgrade, Name: "after-control-plane-upgrade", HandlerFunc: lc.DoAfterControlPlaneUpgrade},
		{Hook: runtimehooksv1.BeforeWorkersUpgrade, Name: "before-workers-upgrade", HandlerFunc: lc.DoBeforeWorkersUpgrade},
		{Hook: runtimehooksv1.AfterWorkersUpgrade, Name: "after-workers-upgrade", HandlerFunc: lc.DoAfterWorkersUpgrade},
		{Hook: runtimehooksv1.AfterClusterUpgrade, Name: "after-cluster-upgrade", HandlerFunc: lc.DoAfterClusterUpgrade},
		{Hook: runtimehooksv1.BeforeClusterDelete, Name: "before-cluster-delete", HandlerFunc: lc.DoBeforeClusterDelete},
		{Hook: runtimehooksv1.GenerateUpgradePlan, Name: "generate-upgrade-plan", HandlerFunc: plan.DoGenerateUpgradePlan},
		{Hook: runtimehooksv1.CanUpdateMachine, Name: "can-update-machine", HandlerFunc: inPlace.DoCanUpdateMachine},
		{Hook: runtimehooksv1.CanUpdateMachineSet, Name: "can-update-machineset", HandlerFunc: inPlace.DoCanUpdateMachineSet},
		{Hook: runtimehooksv1.UpdateMachine, Name: "update-machine", HandlerFunc: inPlace.DoUpdateMachine},
	} {
		if err := srv.AddExtensionHandler(h); err != nil {
			return fmt.Errorf("adding the %s handler: %w", h.Name, err)
		}
	}
	return nil
}
