//! The shipped default flavor on Kairon's networks, as the simulator plays them
//! (`testbed/kairon-sim/README.md`, "Networks"): without `spec.network` (Kairon's user mode, a
//! NAT of each VM's own) no cluster forms and the KaironMachines say why; on a bridge without
//! `learnIP` or the guest agent the cluster forms but Kairon reports no address, and a rollout
//! to the flavor's own network brings the addresses.

use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::templates_support::*;

/// The generated `yaml` (clusterctl writes it with its keys sorted, comments dropped) with
/// `spec.network` and `spec.guestAgent` of the KaironMachineTemplate `template` replaced:
/// `network` `None` for Kairon's default user mode (neither field), else that network and no
/// guest agent. Written back as JSON documents, which kubectl reads as YAML.
fn with_network(yaml: &str, template: &str, network: Option<Value>) -> String {
    let mut docs = capkr_testenv::parse_yaml_documents(yaml).expect("the generated YAML parses");
    let mut replaced = false;
    for doc in &mut docs {
        if doc["kind"] != "KaironMachineTemplate" || doc["metadata"]["name"] != template {
            continue;
        }
        let spec = doc["spec"]["template"]["spec"]
            .as_object_mut()
            .expect("a KaironMachineTemplate has spec.template.spec");
        assert!(
            spec.contains_key("network"),
            "{template} comes with the flavor's network"
        );
        spec.remove("guestAgent");
        match &network {
            Some(n) => spec.insert("network".into(), n.clone()),
            None => spec.remove("network"),
        };
        replaced = true;
    }
    assert!(replaced, "no KaironMachineTemplate {template} in the generated YAML");
    docs.iter().map(Value::to_string).collect::<Vec<_>>().join("\n---\n")
}

/// A bridged tap on the flavor's bridge, learning nothing: Kairon reports no address.
fn tap_only() -> Option<Value> {
    Some(json!({"mode": "tap", "bridge": "br0"}))
}

fn kairon_machines() -> kube::api::ApiResource {
    gvk("kairon.zyvor.dev", "v1alpha1", "Machine", "machines")
}

/// `reason` and `message` of a condition of `obj`.
fn reason_of(obj: &DynamicObject, type_: &str) -> (String, String) {
    let c = condition(obj, type_).cloned().unwrap_or(Value::Null);
    (
        c["reason"].as_str().unwrap_or_default().to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    )
}

fn internal_ips(obj: &DynamicObject) -> Vec<String> {
    obj.data["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["type"] == "InternalIP")
        .filter_map(|a| a["address"].as_str().map(str::to_string))
        .collect()
}

fn has_node(m: &DynamicObject) -> bool {
    !m.data["status"]["nodeRef"].is_null()
}

/// The default flavor without `spec.network` (Kairon's user mode): the control plane would be
/// reachable by no one, so it gets no VM, and its KaironMachine says so with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_in_kairons_user_mode_gets_no_control_plane_vm_and_says_why() {
    let rig = Rig::start(RigOptions::guests("templates_user_network")).await;
    let yaml = rig.generate("", 1, 1);
    let cp_template = format!("{}-control-plane", rig.cluster);
    let md_template = format!("{}-md-0", rig.cluster);
    let yaml = with_network(&with_network(&yaml, &cp_template, None), &md_template, None);
    rig.kubectl_apply(&yaml);
    rig.wait_ok(
        "the control plane's KaironMachine refused its network",
        Duration::from_secs(120),
        || async {
            let kms = rig.list(&kaironmachines()).await;
            let cp = kms
                .iter()
                .find(|km| is_control_plane(km))
                .ok_or("no control-plane KaironMachine yet")?;
            let (reason, message) = reason_of(cp, "Ready");
            if reason != "ControlPlaneNetworkUnreachable" || !message.contains("user mode") || !message.contains("tap")
            {
                return Err(format!("Ready: {reason}: {message}"));
            }
            Ok(())
        },
    )
    .await;
    // Nothing was made on Kairon, then or later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let vms = rig.list(&kairon_machines()).await;
    assert!(
        vms.is_empty(),
        "Kairon Machines made for a user-mode control plane: {vms:?}"
    );
    let machines = rig.machine_list().await;
    assert!(machines.iter().all(|m| !has_node(m)), "a Node joined: {machines:?}");
}

/// Workers in user mode cannot reach the control plane's kube-vip address (on the bridge):
/// their VMs run, report no address and never join, and each KaironMachine says why. The
/// control plane, on a bridge without `learnIP` or the guest agent, forms without an address
/// Kairon reports, and says so too. New templates on the flavor's own network (learnIP and
/// the guest agent), rolled out, bring addresses and Nodes to every Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_in_user_mode_never_join_and_a_rollout_to_the_flavors_network_brings_addresses() {
    let rig = Rig::start(RigOptions::guests("templates_networks")).await;
    let generated = rig.generate("", 1, 1);
    let cp_template = format!("{}-control-plane", rig.cluster);
    let md_template = format!("{}-md-0", rig.cluster);
    let yaml = with_network(&with_network(&generated, &cp_template, tap_only()), &md_template, None);
    rig.kubectl_apply(&yaml);

    // The control plane forms on the bridge; Kairon reports no address for it.
    rig.wait_ok(
        "the control plane's Node, no address reported",
        Duration::from_secs(300),
        || async {
            let machines = rig.machine_list().await;
            let cp = machines
                .iter()
                .find(|m| is_control_plane(m))
                .ok_or("no control-plane Machine")?;
            if !has_node(cp) {
                return Err("the control plane has no Node yet".into());
            }
            let kms = rig.list(&kaironmachines()).await;
            let km = kms
                .iter()
                .find(|km| is_control_plane(km))
                .ok_or("no control-plane KaironMachine")?;
            let (reason, message) = reason_of(km, "InstanceProvisioned");
            // Said of its own network, a bridged tap (read from the Kairon Machine as the
            // cache keeps it, not only from the answer to its create), never of user mode.
            if reason != "InstanceAddressUnknown"
                || !message.contains("bridged tap device")
                || message.contains("network mode user")
            {
                return Err(format!("control plane InstanceProvisioned: {reason}: {message}"));
            }
            if !is_true(km, "Ready") || !internal_ips(km).is_empty() {
                return Err(format!(
                    "control plane not Ready, or with an address: {:?}",
                    km.data["status"]
                ));
            }
            Ok(())
        },
    )
    .await;
    // The worker's VM runs, in user mode: no address, and the kube-vip address unreachable.
    rig.wait_ok(
        "the worker running without an address, saying why",
        Duration::from_secs(120),
        || async {
            let kms = rig.list(&kaironmachines()).await;
            let km = kms
                .iter()
                .find(|km| !is_control_plane(km))
                .ok_or("no worker KaironMachine")?;
            let (reason, message) = reason_of(km, "Ready");
            if reason != "InstanceAddressUnknown" || !message.contains("network mode user") {
                return Err(format!("worker Ready: {reason}: {message}"));
            }
            if km.data["status"]["initialization"]["provisioned"] != json!(true) {
                return Err("the worker is not provisioned".into());
            }
            Ok(())
        },
    )
    .await;
    let vms = rig.list(&kairon_machines()).await;
    assert_eq!(vms.len(), 2, "{vms:?}");
    for vm in &vms {
        assert_eq!(vm.data["status"]["phase"], "Running", "{vm:?}");
        assert!(
            vm.data["status"]["guestIP"].is_null(),
            "Kairon reports no address here: {vm:?}"
        );
    }
    // kubeadm join keeps failing in the worker: no Node, however long.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let machines = rig.machine_list().await;
    let worker = machines
        .iter()
        .find(|m| !is_control_plane(m))
        .expect("a worker Machine");
    assert!(!has_node(worker), "a user-mode worker joined: {worker:?}");

    // New templates on the flavor's network, rolled out.
    let templates = rig.api(&kaironmachinetemplates());
    for name in [&cp_template, &md_template] {
        let old = templates.get(name).await.expect("the template");
        let mut spec = old.data["spec"].clone();
        spec["template"]["spec"]["network"] = json!({"mode": "tap", "bridge": "br0", "learnIP": true});
        spec["template"]["spec"]["guestAgent"] = json!({"enabled": true});
        let mut new = DynamicObject::new(&format!("{name}-learning"), &kaironmachinetemplates()).within(&rig.ns);
        new.data = json!({ "spec": spec });
        templates
            .create(&Default::default(), &new)
            .await
            .expect("a new template");
    }
    rig.patch_kcp(
        &format!("{}-control-plane", rig.cluster),
        json!({"spec": {"machineTemplate": {"spec": {"infrastructureRef": {"name": format!("{cp_template}-learning")}}}}}),
    )
    .await;
    let mds: Api<DynamicObject> = rig.api(&capi("MachineDeployment", "machinedeployments"));
    mds.patch(
        &format!("{}-md-0", rig.cluster),
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": format!("{md_template}-learning")}}}}}),
        ),
    )
    .await
    .expect("pointing the MachineDeployment at the new template");
    rig.wait_ok(
        "every Machine rolled out, with an address and a Node",
        Duration::from_secs(400),
        || async {
            let machines = rig.machine_list().await;
            if machines.len() != 2 {
                return Err(format!("{} Machines", machines.len()));
            }
            let kms = rig.list(&kaironmachines()).await;
            for m in &machines {
                let name = name(m);
                let km = kms
                    .iter()
                    .find(|k| crate::templates_support::name(k) == name)
                    .ok_or(format!("no KaironMachine {name}"))?;
                let template = km
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("cluster.x-k8s.io/cloned-from-name"))
                    .cloned()
                    .unwrap_or_default();
                if !template.ends_with("-learning") {
                    return Err(format!("{name} is still from {template}"));
                }
                if !has_node(m) || internal_ips(m).is_empty() {
                    return Err(format!(
                        "{name}: Node {}, addresses {:?}",
                        m.data["status"]["nodeRef"], m.data["status"]["addresses"]
                    ));
                }
                let (reason, message) = reason_of(km, "InstanceProvisioned");
                if reason != "Provisioned" {
                    return Err(format!("{name} InstanceProvisioned: {reason}: {message}"));
                }
            }
            Ok(())
        },
    )
    .await;
}
