package main

import (
	"context"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	"sigs.k8s.io/cluster-api/exp/runtime/topologymutation"
)

// kaironGroup is the API group of the Kairon kinds.
const kaironGroup = "infrastructure.cluster.x-k8s.io"

// topologyMutationHandlers generate the patches of the e2e ClusterClass `kairon-runtimesdk`
// (tests/e2e/e2e_capi_suite.rs derives it from the shipped class `kairon`): what the shipped class
// does with inline patches and variables for the machine image, here as an external patch with
// the variables it declares (an external patch is given only those). Every
// KaironMachineTemplate gets the image of the Kubernetes version its machines run —
// machineImagePrefix followed by the control plane's version for the control plane's
// template, by the MachineDeployment's version for a worker template (the two differ during
// an upgrade) — unless the variable machineImage fixes one image for all. The variables the
// in-place update spec sets, files and kubeadmControlPlaneMaxSurge, go into the kubeadm
// templates, as upstream's test extension puts them into its own.
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
		if !ok {
			return nil
		}
		var err error
		switch gk := u.GroupVersionKind().GroupKind(); gk {
		case schema.GroupKind{Group: kaironGroup, Kind: "KaironMachineTemplate"}:
			err = patchKaironMachineTemplate(u, variables)
		case schema.GroupKind{Group: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlaneTemplate"}:
			err = patchKubeadmControlPlaneTemplate(u, variables)
		case schema.GroupKind{Group: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate"}:
			err = appendFiles(u, variables, "spec", "template", "spec", "files")
		}
		if err != nil {
			return fmt.Errorf("patching %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		return nil
	})
}

func patchKaironMachineTemplate(u *unstructured.Unstructured, variables map[string]apiextensionsv1.JSON) error {
	image, err := machineImage(variables)
	if err != nil {
		return err
	}
	return unstructured.SetNestedField(u.Object, image, "spec", "template", "spec", "image", "imageRef")
}

// patchKubeadmControlPlaneTemplate sets what the in-place update spec chooses for the control
// plane, as upstream's test extension does: the rollout's maxSurge (kubeadmControlPlaneMaxSurge)
// and extra files (files).
func patchKubeadmControlPlaneTemplate(u *unstructured.Unstructured, variables map[string]apiextensionsv1.JSON) error {
	maxSurge, err := topologymutation.GetStringVariable(variables, "kubeadmControlPlaneMaxSurge")
	if err != nil && !topologymutation.IsNotFoundError(err) {
		return err
	}
	if maxSurge != "" {
		// A number or a percentage, as the field's IntOrString.
		var surge any = maxSurge
		if v := intstr.Parse(maxSurge); v.Type == intstr.Int {
			surge = int64(v.IntVal)
		}
		strategy := map[string]any{
			"type":          "RollingUpdate",
			"rollingUpdate": map[string]any{"maxSurge": surge},
		}
		if err := unstructured.SetNestedMap(u.Object, strategy, "spec", "template", "spec", "rollout", "strategy"); err != nil {
			return err
		}
	}
	return appendFiles(u, variables, "spec", "template", "spec", "kubeadmConfigSpec", "files")
}

// file is an item of the variable files.
type file struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// appendFiles appends the files of the variable files, if set, to the list at path.
func appendFiles(u *unstructured.Unstructured, variables map[string]apiextensionsv1.JSON, path ...string) error {
	var files []file
	err := topologymutation.GetObjectVariableInto(variables, "files", &files)
	if topologymutation.IsNotFoundError(err) || (err == nil && len(files) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	list, _, err := unstructured.NestedSlice(u.Object, path...)
	if err != nil {
		return err
	}
	for _, f := range files {
		list = append(list, map[string]any{"path": f.Path, "content": f.Content})
	}
	return unstructured.SetNestedSlice(u.Object, list, path...)
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
// ClusterClass, with the same schema, and those of the in-place update spec.
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
			Name:     "files",
			Required: ptr.To(false),
			Schema: clusterv1.VariableSchema{OpenAPIV3Schema: clusterv1.JSONSchemaProps{
				Type: "array",
				Items: &clusterv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]clusterv1.JSONSchemaProps{
						"path":    {Type: "string"},
						"content": {Type: "string"},
					},
				},
				Description: "Extra files for every machine's kubeadm bootstrap.",
			}},
		},
		{
			Name:     "kubeadmControlPlaneMaxSurge",
			Required: ptr.To(false),
			Schema: clusterv1.VariableSchema{OpenAPIV3Schema: clusterv1.JSONSchemaProps{
				Type:        "string",
				Description: "The control plane rollout's maxSurge (a number or a percentage).",
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
