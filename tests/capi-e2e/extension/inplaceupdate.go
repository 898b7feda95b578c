package main

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// noChanges is a JSON patch that changes nothing: what a Kairon VM can change in place.
var noChanges = runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONPatchType, Patch: []byte("[]")}

// inPlaceUpdateHandlers answer CAPI's in-place update hooks for Machines of Kairon VMs with
// kubeadm bootstrap. A KubeadmConfig's files (the in-place update spec's change) are the one
// thing they take in place; anything else, a Machine's version or a KaironMachine's spec
// included (a VM's image, size and placement are fixed at creation), they leave to a rollout:
// CAPI rolls a Machine out when the patches returned do not make current equal desired.
// Like upstream's test extension, the update changes nothing on the VM: the simulated guest
// ran its bootstrap data at boot.
type inPlaceUpdateHandlers struct{}

// DoCanUpdateMachine implements the CanUpdateMachine hook.
func (inPlaceUpdateHandlers) DoCanUpdateMachine(ctx context.Context, req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) {
	ctrl.LoggerFrom(ctx).Info("CanUpdateMachine is called", "Machine", klog.KObj(&req.Desired.Machine))
	resp.Status = runtimehooksv1.ResponseStatusSuccess
	if inPlaceUpdatesDisabled(req.Settings) {
		return
	}
	patch, err := filesPatch(req.Current.BootstrapConfig, req.Desired.BootstrapConfig, "spec", "files")
	if err != nil {
		resp.Status = runtimehooksv1.ResponseStatusFailure
		resp.Message = err.Error()
		return
	}
	resp.MachinePatch = noChanges
	resp.BootstrapConfigPatch = patch
	resp.InfrastructureMachinePatch = noChanges
}

// DoCanUpdateMachineSet implements the CanUpdateMachineSet hook: as DoCanUpdateMachine, for
// a MachineSet's KubeadmConfigTemplate.
func (inPlaceUpdateHandlers) DoCanUpdateMachineSet(ctx context.Context, req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) {
	ctrl.LoggerFrom(ctx).Info("CanUpdateMachineSet is called", "MachineSet", klog.KObj(&req.Desired.MachineSet))
	resp.Status = runtimehooksv1.ResponseStatusSuccess
	if inPlaceUpdatesDisabled(req.Settings) {
		return
	}
	patch, err := filesPatch(req.Current.BootstrapConfigTemplate, req.Desired.BootstrapConfigTemplate, "spec", "template", "spec", "files")
	if err != nil {
		resp.Status = runtimehooksv1.ResponseStatusFailure
		resp.Message = err.Error()
		return
	}
	resp.MachineSetPatch = noChanges
	resp.BootstrapConfigTemplatePatch = patch
	resp.InfrastructureMachineTemplatePatch = noChanges
}

// DoUpdateMachine implements the UpdateMachine hook: the update is done as soon as it is asked
// for (see inPlaceUpdateHandlers).
func (inPlaceUpdateHandlers) DoUpdateMachine(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) {
	ctrl.LoggerFrom(ctx).Info("UpdateMachine is called", "Machine", klog.KObj(&req.Desired.Machine))
	if inPlaceUpdatesDisabled(req.Settings) {
		resp.Status = runtimehooksv1.ResponseStatusFailure
		resp.Message = "UpdateMachine called although CanUpdateMachine and CanUpdateMachineSet took no change in place"
		return
	}
	resp.Status = runtimehooksv1.ResponseStatusSuccess
	resp.Message = "Extension completed updating Machine"
}

// inPlaceUpdatesDisabled reports the setting by which the specs that do not test in-place
// updates (their ExtensionConfigs) keep every change a rollout.
func inPlaceUpdatesDisabled(settings map[string]string) bool {
	return settings["disableInPlaceUpdates"] == "true"
}

// filesPatch is a JSON patch that gives the current object the desired object's files (at
// path): nothing when they are equal.
func filesPatch(current, desired runtime.RawExtension, path ...string) (runtimehooksv1.Patch, error) {
	currentFiles, currentHas, err := nestedField(current, path...)
	if err != nil {
		return runtimehooksv1.Patch{}, err
	}
	desiredFiles, desiredHas, err := nestedField(desired, path...)
	if err != nil {
		return runtimehooksv1.Patch{}, err
	}
	pointer := ""
	for _, p := range path {
		pointer += "/" + p
	}
	var ops []map[string]any
	switch {
	case currentHas == desiredHas && equality.Semantic.DeepEqual(currentFiles, desiredFiles):
		return noChanges, nil
	case desiredHas:
		ops = []map[string]any{{"op": "add", "path": pointer, "value": desiredFiles}}
	default:
		ops = []map[string]any{{"op": "remove", "path": pointer}}
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return runtimehooksv1.Patch{}, err
	}
	return runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONPatchType, Patch: patch}, nil
}

func nestedField(raw runtime.RawExtension, path ...string) (any, bool, error) {
	obj := map[string]any{}
	if err := json.Unmarshal(raw.Raw, &obj); err != nil {
		return nil, false, fmt.Errorf("decoding a bootstrap object: %w", err)
	}
	return unstructured.NestedFieldNoCopy(obj, path...)
}
