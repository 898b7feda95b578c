//! A create Kairon rejects (here: an admission policy refusing new Kairon Machines, as a quota
//! or Kairon's own admission would), against the real CAPI
//! controllers: the KaironMachine says why (the answer's code and reason, never the payload),
//! a Warning event is published, the create is retried with a growing interval rather than at
//! a fixed rate, and the machine comes up once the quota allows it.

use std::time::Duration;

use crate::common::{Rig, RigOptions, km_instance};
use capkr::api::conditions::reason;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_create_is_reported_and_retried_with_backoff() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        audit: true,
        ..RigOptions::new("create_failures")
    })
    .await;
    rig.wait_running(2, UP).await;

    // From now on, no more Kairon Machines in this namespace.
    let policy = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: no-more-kairon-machines
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["kairon.zyvor.dev"]
      apiVersions: ["*"]
      operations: ["CREATE"]
      resources: ["machines"]
  validations:
  - expression: "false"
    reason: Forbidden
    message: "exceeded quota: kairon-machines"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: no-more-kairon-machines
spec:
  policyName: no-more-kairon-machines
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {ns}
"#,
        ns = rig.ns
    );
    rig.env.apply(&policy, None).await.expect("the policy applies");
    // The policy takes effect once the API server has loaded it: probe with a create of ours.
    let probe: capkr::kairon::Machine = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": "probe", "namespace": rig.ns},
        "spec": {"resources": {"cpu": "1", "memory": "1Gi"}, "image": {"imageRef": "img", "diskSize": "1Gi"}}
    }))
    .unwrap();
    rig.wait("the policy refuses Kairon Machines", UP, || async {
        Ok::<_, kube::Error>(match rig.vms().create(&PostParams::default(), &probe).await {
            Err(kube::Error::Api(s)) => s.code == 403,
            Ok(_) => {
                rig.vms().delete("probe", &Default::default()).await?;
                false
            }
            Err(e) => return Err(e),
        })
    })
    .await;

    let from = rig.audit_len();
    let before: Vec<String> = rig
        .kms()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|k| k.name_any())
        .collect();
    rig.scale(2).await;
    let km = rig
        .wait("the new KaironMachine reports InstanceCreateFailed", UP, || async {
            let kms = rig.kms().list(&ListParams::default()).await?.items;
            Ok::<_, kube::Error>(kms.into_iter().find(|k| {
                !before.contains(&k.name_any())
                    && km_instance(k).is_some_and(|(r, _)| r == reason::INSTANCE_CREATE_FAILED)
            }))
        })
        .await;
    let name = km.name_any();
    let (_, message) = km_instance(&km).unwrap();
    assert!(
        message.contains("403 Forbidden"),
        "the API's code and reason: {message}"
    );
    assert!(!message.contains("cloud-config"), "never the payload: {message}");

    let events: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    rig.wait("a Warning event InstanceCreateFailed", UP, || async {
        let list = events.list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>(list.iter().any(|e| {
            e.reason.as_deref() == Some("InstanceCreateFailed")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
        }))
    })
    .await;

    // Let it retry for a while, then read when each create arrived.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let creates: Vec<f64> = rig
        .manager_requests(from)
        .iter()
        .filter(|e| {
            e.verb == "create"
                && e.resource_path() == "machines.kairon.zyvor.dev"
                && e.object_ref
                    .as_ref()
                    .and_then(|o| o.name.as_deref())
                    .is_none_or(|n| n == name)
        })
        .filter_map(|e| e.received_time())
        .map(|t| t.as_millisecond() as f64 / 1000.0)
        .collect();
    let intervals: Vec<f64> = creates.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("create attempts: {}; intervals (s): {intervals:.2?}", creates.len());
    assert!(creates.len() >= 5, "retried, not given up: {intervals:?}");
    assert!(
        creates.len() <= 12,
        "not a hot loop: {} creates in ~45 s",
        creates.len()
    );
    // The last intervals are the backoff's alone (the first retries may also be caused by the
    // watch seeing our own status write): each clearly longer than the one before.
    let tail = &intervals[intervals.len() - 3..];
    assert!(
        tail[1] > tail[0] * 1.5 && tail[2] > tail[1] * 1.5,
        "the interval grows: {intervals:?}"
    );

    // The policy lifted, the machine comes up.
    let bindings: Api<DynamicObject> = Api::all_with(
        rig.env.client(),
        &capkr_testenv::api_resource(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        ),
    );
    bindings
        .delete("no-more-kairon-machines", &Default::default())
        .await
        .unwrap();
    rig.wait_running(3, Duration::from_secs(400)).await;
    rig.assert_one_vm_per_kaironmachine().await;
}
