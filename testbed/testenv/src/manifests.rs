//! Manifests the environment installs, prepared the way envtest prepares them: CAPI's CRD bases
//! get the contract labels their kustomizations add and a conversion webhook pointing at the
//! local manager; CAPI's webhook configurations are renamed per manager and pointed at
//! `https://127.0.0.1:<port>/<path>` with the test CA.

use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::{Value, json};

/// Parses every non-empty document of a (multi-document) YAML text.
pub fn parse_yaml_documents(text: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).context("parsing YAML")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

pub fn read_yaml_documents(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_yaml_documents(&text).with_context(|| format!("parsing {}", path.display()))
}

/// All `*.yaml` files of a dir, sorted, as documents.
pub fn read_yaml_dir(dir: &Path) -> Result<Vec<Value>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        out.extend(read_yaml_documents(&f)?);
    }
    if out.is_empty() {
        bail!("no YAML documents in {}", dir.display());
    }
    Ok(out)
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Where a manager serves its webhooks, and the CA that signed its serving certificate.
#[derive(Clone, Debug)]
pub struct WebhookTarget {
    pub port: u16,
    pub ca_pem: String,
}

/// Adds CAPI's contract labels (the `config/crd/kustomization.yaml` `labels:` pairs) and, for
/// multi-version CRDs whose manager runs, the conversion webhook.
pub fn prepare_capi_crd(mut crd: Value, conversion: Option<&WebhookTarget>) -> Result<Value> {
    let name = crd["metadata"]["name"].as_str().unwrap_or("<unnamed>").to_string();
    if crd["kind"] != "CustomResourceDefinition" {
        bail!("{name} is not a CustomResourceDefinition");
    }
    let meta = crd["metadata"]
        .as_object_mut()
        .with_context(|| format!("{name}: no metadata"))?;
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    let labels = labels
        .as_object_mut()
        .with_context(|| format!("{name}: labels is not a map"))?;
    labels.insert("cluster.x-k8s.io/v1beta1".into(), json!("v1beta1"));
    labels.insert("cluster.x-k8s.io/v1beta2".into(), json!("v1beta2"));
    let versions = crd["spec"]["versions"].as_array().map(Vec::len).unwrap_or(0);
    if let (Some(target), true) = (conversion, versions > 1) {
        crd["spec"]["conversion"] = json!({
            "strategy": "Webhook",
            "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{}/convert", target.port),
                    "caBundle": b64(target.ca_pem.as_bytes()),
                },
            },
        });
    }
    Ok(crd)
}

/// Renames a Mutating/ValidatingWebhookConfiguration (kubebuilder gives CAPI's three the same
/// names) and rewrites every service reference to a loopback URL.
pub fn prepare_webhook_configuration(mut cfg: Value, suffix: &str, target: &WebhookTarget) -> Result<Value> {
    let kind = cfg["kind"].as_str().unwrap_or_default().to_string();
    if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
        bail!("unexpected kind {kind:?} in a webhook manifest");
    }
    let name = cfg["metadata"]["name"]
        .as_str()
        .unwrap_or("webhook-configuration")
        .to_string();
    cfg["metadata"]["name"] = json!(format!("{name}-{suffix}"));
    let ca = b64(target.ca_pem.as_bytes());
    if let Some(hooks) = cfg["webhooks"].as_array_mut() {
        for hook in hooks {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or("/")
                .to_string();
            hook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{}{}", target.port, path),
                "caBundle": ca,
            });
        }
    }
    Ok(cfg)
}

/// Kairon Machines and MachineSets carry bootstrap data (CA and service-account keys, join
/// tokens): in `spec.cloudInit` (file contents, commands) and, for the simulator's pools,
/// `legacyUserData` — of the object or of its template. Dumps must never print it: each of
/// those values becomes `<redacted: N bytes>`; paths, permissions, the hostname and the user
/// stay readable.
pub fn redact_user_data(obj: &mut Value) {
    fn redact(v: &mut Value) {
        let len = v.as_str().map(str::len).unwrap_or(0);
        *v = json!(format!("<redacted: {len} bytes>"));
    }
    for spec in ["/spec", "/spec/template/spec"] {
        let Some(spec) = obj.pointer_mut(spec).and_then(Value::as_object_mut) else {
            continue;
        };
        if let Some(v) = spec.get_mut("legacyUserData") {
            redact(v);
        }
        let Some(ci) = spec.get_mut("cloudInit").and_then(Value::as_object_mut) else {
            continue;
        };
        for k in ["userData", "networkConfig"] {
            if let Some(v) = ci.get_mut(k) {
                redact(v);
            }
        }
        if let Some(cmds) = ci.get_mut("runCmd").and_then(Value::as_array_mut) {
            cmds.iter_mut().for_each(redact);
        }
        if let Some(files) = ci.get_mut("writeFiles").and_then(Value::as_array_mut) {
            for f in files {
                if let Some(c) = f.get_mut("content") {
                    redact(c);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capi_crd_gets_contract_labels_and_conversion_when_multi_version() {
        let crd = json!({"kind": "CustomResourceDefinition", "metadata": {"name": "x"},
            "spec": {"versions": [{"name": "v1beta1"}, {"name": "v1beta2"}]}});
        let t = WebhookTarget {
            port: 1234,
            ca_pem: "CA".into(),
        };
        let out = prepare_capi_crd(crd, Some(&t)).unwrap();
        assert_eq!(out["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"], "v1beta2");
        assert_eq!(
            out["spec"]["conversion"]["webhook"]["clientConfig"]["url"],
            "https://127.0.0.1:1234/convert"
        );
        let single = json!({"kind": "CustomResourceDefinition", "metadata": {"name": "y"},
            "spec": {"versions": [{"name": "v1beta2"}]}});
        assert!(
            prepare_capi_crd(single, Some(&t)).unwrap()["spec"]
                .get("conversion")
                .is_none()
        );
    }

    #[test]
    fn webhook_service_refs_become_loopback_urls() {
        let cfg = json!({"kind": "MutatingWebhookConfiguration", "metadata": {"name": "m"},
            "webhooks": [{"name": "a", "clientConfig": {"service": {"name": "s", "namespace": "n", "path": "/mutate-x"}}}]});
        let t = WebhookTarget {
            port: 9,
            ca_pem: "CA".into(),
        };
        let out = prepare_webhook_configuration(cfg, "core", &t).unwrap();
        assert_eq!(out["metadata"]["name"], "m-core");
        assert_eq!(
            out["webhooks"][0]["clientConfig"]["url"],
            "https://127.0.0.1:9/mutate-x"
        );
        assert!(out["webhooks"][0]["clientConfig"].get("service").is_none());
    }

    #[test]
    fn bootstrap_data_is_redacted() {
        let mut m = json!({"spec": {"cloudInit": {"hostname": "m1", "runCmd": ["kubeadm join --token secret"],
            "writeFiles": [{"path": "/etc/kubernetes/pki/ca.key", "content": "secret", "permissions": "0600"}]},
            "legacyUserData": "secret"}});
        redact_user_data(&mut m);
        assert_eq!(m["spec"]["cloudInit"]["runCmd"][0], "<redacted: 27 bytes>");
        assert_eq!(
            m["spec"]["cloudInit"]["writeFiles"][0]["content"],
            "<redacted: 6 bytes>"
        );
        assert_eq!(
            m["spec"]["cloudInit"]["writeFiles"][0]["path"],
            "/etc/kubernetes/pki/ca.key"
        );
        assert_eq!(m["spec"]["cloudInit"]["hostname"], "m1");
        assert_eq!(m["spec"]["legacyUserData"], "<redacted: 6 bytes>");
        let mut set = json!({"spec": {"template": {"spec": {"legacyUserData": "secret"}}}});
        redact_user_data(&mut set);
        assert_eq!(set["spec"]["template"]["spec"]["legacyUserData"], "<redacted: 6 bytes>");
        assert!(!m.to_string().contains("secret") && !set.to_string().contains("secret"));
    }
}
