package main

import (
	"context"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	"sigs.k8s.io/cluster-api/exp/runtime/topologymutation"
)

// kaironGroup is the API group of the Kairon kinds.
const kaironGroup = "infrastructure.cluster.x-k8s.io"

// topologyMutationHandlers generate the patches of the e2e ClusterClass `kairon-runtimesdk`
// (tests/e2e_capi_suite.rs derives it from the shipped class `kairon`): what the shipped class
// does with inline patches and variables for the machine image, here as an external patch with
// the variables it declares (an external patch is given only those). Every
// KaironMachineTemplate gets the image of the Kubernetes version its machines run —
// machineImagePrefix followed by the control plane's version for the control plane's
// template, by the MachineDeployment's version for a worker template (the two differ during
// an upgrade) — unless the variable machineImage fixes one image for all.
type topologyMutationHandlers struct {
	decoder runtime.Decoder
}

func newTopologyMutationHandlers() *topologyMutationHandlers {
	return &topologyMutationHandlers{decoder: unstructured.UnstructuredJSONScheme}
}

// GeneratePatches implements the GeneratePatches hook: templates of other kinds are left
// as they are.
func (h *topologyMutationHandlers) GeneratePatches(ctx context.Context, req *runtimehooksv1.GeneratePatchesRequest, resp *runtimehooksv1.GeneratePatchesResponse) {
	ctrl.LoggerFrom(ctx).Info("GeneratePatches is called")
	topologymutation.WalkTemplates(ctx, h.decoder, req, resp, func(_ context.Context, obj runtime.Object, variables map[string]apiextensionsv1.JSON, _ runtimehooksv1.HolderReference) error {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GroupVersionKind().Group != kaironGroup || u.GetKind() != "KaironMachineTemplate" {
			return nil
		}
		image, err := machineImage(variables)
		if err != nil {
			return fmt.Errorf("patching KaironMachineTemplate %s: %w", u.GetName(), err)
		}
		return unstructured.SetNestedField(u.Object, image, "spec", "template", "spec", "image")
	})
}

// machineImage is the image a KaironMachineTemplate's machines get, from the template's
// variables: a worker template's carry builtin.machineDeployment, the control plane's do not.
func machineImage(variables map[string]apiextensionsv1.JSON) (string, error) {
	fixed, err := topologymutation.GetStringVariable(variables, "machineImage")
	if err == nil {
		return fixed, nil
	}
	if !topologymutation.IsNotFoundError(err) {
		return "", err
	}
	prefix, err := topologymutation.GetStringVariable(variables, "machineImagePrefix")
	if err != nil {
		return "", err
	}
	version, err := topologymutation.GetStringVariable(variables, "builtin.machineDeployment.version")
	if topologymutation.IsNotFoundError(err) {
		version, err = topologymutation.GetStringVariable(variables, "builtin.controlPlane.version")
	}
	if err != nil {
		return "", err
	}
	return prefix + version, nil
}

// DiscoverVariables implements the DiscoverVariables hook: the image variables of the shipped
// ClusterClass, with the same schema.
func (h *topologyMutationHandlers) DiscoverVariables(ctx context.Context, _ *runtimehooksv1.DiscoverVariablesRequest, resp *runtimehooksv1.DiscoverVariablesResponse) {
	ctrl.LoggerFrom(ctx).Info("DiscoverVariables is called")
	resp.Status = runtimehooksv1.ResponseStatusSuccess
	resp.Variables = []clusterv1.ClusterClassVariable{
		{
			Name:     "machineImagePrefix",
			Required: ptr.To(false),
			Schema: clusterv1.VariableSchema{OpenAPIV3Schema: clusterv1.JSONSchemaProps{
				Type:        "string",
				MinLength:   ptr.To[int64](1),
				Default:     &apiextensionsv1.JSON{Raw: []byte(`"ubuntu-2404-kube-"`)},
				Description: "A machine's Kairon image is this prefix followed by its Kubernetes version.",
			}},
		},
		{
			Name:     "machineImage",
			Required: ptr.To(false),
			Schema: clusterv1.VariableSchema{OpenAPIV3Schema: clusterv1.JSONSchemaProps{
				Type:        "string",
				MinLength:   ptr.To[int64](1),
				Description: "One fixed Kairon image for every machine, whatever its version, instead of machineImagePrefix.",
			}},
		},
	}
}
