package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	capie2e "sigs.k8s.io/cluster-api/test/e2e"
	"sigs.k8s.io/cluster-api/test/framework"
)

// scaleClusters is the ScaleSpec's size here: three clusters of one control plane and two
// workers, created, checked and deleted concurrently. Each simulated control plane runs a real
// etcd, kube-apiserver, kube-controller-manager and kube-scheduler (about 0.5 GiB) and each
// cluster a KWOK, which bounds what the 2-core CI machine takes. CAPKR_SCALE_CLUSTERS sets
// another size (docs/capi-e2e.md has what was measured).
func scaleClusters() int64 {
	n, err := strconv.ParseInt(os.Getenv("CAPKR_SCALE_CLUSTERS"), 10, 64)
	if err != nil || n < 1 {
		return 3
	}
	return n
}

var scaleEndpoints atomic.Int32

// distinctEndpoint gives each scale cluster its own control-plane endpoint: the template's
// CONTROL_PLANE_ENDPOINT_IP (127.<n>.100.1) becomes 127.<n>.100.<10+i> for the i-th cluster,
// as a user gives every cluster its own virtual IP.
func distinctEndpoint(_ framework.ClusterProxy, _, _ string, classYAML, clusterYAML []byte) ([]byte, []byte) {
	base := e2eConfig.MustGetVariable("CONTROL_PLANE_ENDPOINT_IP")
	Expect(strings.HasSuffix(base, ".1")).To(BeTrue(), "CONTROL_PLANE_ENDPOINT_IP %q should end in .1", base)
	n := scaleEndpoints.Add(1)
	own := fmt.Sprintf("%s%d", strings.TrimSuffix(base, "1"), 10+n)
	Expect(bytes.Contains(clusterYAML, []byte(base))).To(BeTrue(), "the cluster template does not name the endpoint %s", base)
	return classYAML, bytes.ReplaceAll(clusterYAML, []byte(base), []byte(own))
}

var _ = Describe("When testing the machinery for scale testing", Label("scale", "ClusterClass"), func() {
	capie2e.ScaleSpec(ctx, func() capie2e.ScaleSpecInput {
		return capie2e.ScaleSpecInput{
			E2EConfig:                         e2eConfig,
			ClusterctlConfigPath:              clusterctlConfigPath,
			BootstrapClusterProxy:             bootstrapClusterProxy,
			ArtifactFolder:                    artifactFolder,
			SkipCleanup:                       skipCleanup,
			Flavor:                            ptr.To("topology"),
			ClusterCount:                      ptr.To(scaleClusters()),
			Concurrency:                       ptr.To(scaleClusters()),
			ControlPlaneMachineCount:          ptr.To[int64](1),
			MachineDeploymentCount:            ptr.To[int64](1),
			WorkerPerMachineDeploymentCount:   ptr.To[int64](2),
			AdditionalClusterClassCount:       ptr.To[int64](2),
			ClusterClassName:                  "kairon",
			DeployClusterInSeparateNamespaces: ptr.To(false),
			UseCrossNamespaceClusterClass:     ptr.To(false),
			// The upgrade needs a second Kubernetes version of every binary; one is built here.
			SkipUpgrade:                      true,
			PostScaleClusterNamespaceCreated: distinctEndpoint,
		}
	})
})
