//! What the booting guest would make of its cloud-init user-data: render the jinja template
//! with the NoCloud meta-data (as cloud-init does), find the kubeadm configuration CABPK wrote
//! into `write_files`, and read from it what kubelet would register: node name, provider ID,
//! version, labels and taints. Pure.
//!
//! The user-data holds cluster secrets, so no error here carries any of its content.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use k8s_openapi::api::core::v1::Taint;
use serde_json::Value;

/// The NoCloud meta-data a VM boots with (see [`crate::boot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaData {
    /// `instance-id`: FluxVM's is the cloudInit's hostname; the old model's the Machine's uid.
    pub instance_id: String,
    /// `local-hostname`: FluxVM's is the cloudInit's hostname; the old model's the Machine's
    /// name.
    pub local_hostname: String,
}

/// What kubelet registers as, as far as the kubeadm config says.
#[derive(Clone, Debug, PartialEq)]
pub struct GuestIdentity {
    pub node_name: String,
    /// kubelet's `provider-id` flag, rendered; `None` if the config has none.
    pub provider_id: Option<String>,
    /// From the ClusterConfiguration next to an InitConfiguration, if present.
    pub kubernetes_version: Option<String>,
    /// kubelet's `node-labels`, plus the control-plane role label kubeadm adds.
    pub labels: BTreeMap<String, String>,
    /// `nodeRegistration.taints` (kubelet's `--register-with-taints`).
    pub taints: Vec<Taint>,
    pub control_plane: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuestError {
    #[error("user-data is not a cloud-config")]
    NotCloudConfig,
    #[error("cloud-config is not valid YAML")]
    InvalidYaml,
    #[error("cloud-config writes no kubeadm InitConfiguration or JoinConfiguration")]
    NoKubeadm,
}

/// The kubelet version reported when neither the image name nor the kubeadm config says.
pub const DEFAULT_KUBELET_VERSION: &str = "v1.37.2";

/// kubeadm's control-plane role label and taint key.
pub const CONTROL_PLANE_ROLE: &str = "node-role.kubernetes.io/control-plane";

/// The files cloud-init writes from `write_files` (path, decoded content), in order; entries
/// that cannot be decoded are skipped, as cloud-init would fail them.
pub fn written_files(user_data: &str, meta: &MetaData) -> Result<Vec<(String, String)>, GuestError> {
    let cloud_config = render(user_data, meta);
    if !cloud_config.trim_start().starts_with("#cloud-config") {
        return Err(GuestError::NotCloudConfig);
    }
    let doc: Value = serde_saphyr::from_str(&cloud_config).map_err(|_| GuestError::InvalidYaml)?;
    Ok(doc
        .get("write_files")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|f| Some((f.get("path")?.as_str()?.to_string(), file_content(f)?)))
        .collect())
}

/// The kubeadm API documents among the written files.
pub fn kubeadm_documents_of(files: &[(String, String)]) -> Vec<Value> {
    files.iter().flat_map(|(_, c)| kubeadm_documents(c)).collect()
}

/// Resolves what the guest registers as, the way cloud-init and then kubeadm would.
pub fn resolve(user_data: &str, meta: &MetaData) -> Result<GuestIdentity, GuestError> {
    let cloud_config = render(user_data, meta);
    if !cloud_config.trim_start().starts_with("#cloud-config") {
        return Err(GuestError::NotCloudConfig);
    }
    let doc: Value = serde_saphyr::from_str(&cloud_config).map_err(|_| GuestError::InvalidYaml)?;
    let files = doc
        .get("write_files")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let kubeadm_docs: Vec<Value> = files
        .iter()
        .filter_map(file_content)
        .flat_map(|c| kubeadm_documents(&c))
        .collect();
    let kind_of = |d: &&Value| d.get("kind").and_then(Value::as_str).map(str::to_string);
    let node_config = kubeadm_docs
        .iter()
        .find(|d| kind_of(d).as_deref() == Some("InitConfiguration"))
        .or_else(|| {
            kubeadm_docs
                .iter()
                .find(|d| kind_of(d).as_deref() == Some("JoinConfiguration"))
        })
        .ok_or(GuestError::NoKubeadm)?;
    let control_plane = kind_of(&node_config).as_deref() == Some("InitConfiguration")
        || node_config.get("controlPlane").is_some_and(|c| !c.is_null());
    let kubernetes_version = kubeadm_docs
        .iter()
        .find(|d| kind_of(d).as_deref() == Some("ClusterConfiguration"))
        .and_then(|d| d.get("kubernetesVersion"))
        .and_then(Value::as_str)
        .map(str::to_string);

    let registration = node_config.get("nodeRegistration");
    let extra_args = registration
        .map(|r| kubelet_extra_args(r.get("kubeletExtraArgs")))
        .unwrap_or_default();
    // kubelet lower-cases its hostname; kubeadm defaults the name to the hostname.
    let node_name = registration
        .and_then(|r| r.get("name"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .unwrap_or(&meta.local_hostname)
        .to_lowercase();
    let mut labels = extra_args
        .get("node-labels")
        .map(|l| parse_node_labels(l))
        .unwrap_or_default();
    if control_plane {
        labels.insert(CONTROL_PLANE_ROLE.to_string(), String::new());
    }
    let mut taints: Vec<Taint> = registration
        .and_then(|r| r.get("taints"))
        .and_then(Value::as_array)
        .map(|ts| ts.iter().filter_map(parse_taint).collect())
        .unwrap_or_default();
    // kubeadm taints a control-plane node when the config names no taints at all.
    let taints_unset = registration.and_then(|r| r.get("taints")).is_none_or(Value::is_null);
    if control_plane && taints_unset {
        taints.push(Taint {
            key: CONTROL_PLANE_ROLE.to_string(),
            value: None,
            effect: "NoSchedule".to_string(),
            time_added: None,
        });
    }
    Ok(GuestIdentity {
        node_name,
        provider_id: extra_args
            .get("provider-id")
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty()),
        kubernetes_version,
        labels,
        taints,
        control_plane,
    })
}

/// The version of the kubelet a VM booted from `image` runs. kubelet is a binary baked into
/// the image, not something kubeadm installs: image-builder's images are named after the
/// Kubernetes version they carry (`ubuntu-2404-kube-v1.36.4`), and CAPI's contract is that a
/// Machine's image matches its `spec.version`. So the image name decides; an image name
/// without a version falls back to the ClusterConfiguration's `kubernetesVersion` (the init
/// node's bootstrap data; join data carries none), then to [`DEFAULT_KUBELET_VERSION`].
pub fn kubelet_version(image: &str, kubeadm_version: Option<&str>) -> String {
    version_in_image(image)
        .or_else(|| kubeadm_version.map(str::to_string))
        .unwrap_or_else(|| DEFAULT_KUBELET_VERSION.to_string())
}

/// The last `v<major>.<minor>.<patch>` in an image name, as a token of its own: not followed
/// by another digit or dot (`v1.36.4-20260101` is `v1.36.4`; `v1.36` alone is no version).
pub fn version_in_image(image: &str) -> Option<String> {
    let bytes = image.as_bytes();
    let mut found = None;
    for (start, _) in image.match_indices('v') {
        // A token starts the name or follows a separator.
        if start > 0 && bytes[start - 1].is_ascii_alphanumeric() {
            continue;
        }
        let rest = &image[start + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let numbers: Vec<&str> = rest[..end].split('.').collect();
        if numbers.len() == 3 && numbers.iter().all(|n| !n.is_empty()) {
            found = Some(format!("v{}", &rest[..end]));
        }
    }
    found
}

/// cloud-init renders user-data as a jinja template only when its first line says
/// `## template: jinja`; the header line is dropped. Variables come from instance data:
/// `ds.meta_data.*` (the NoCloud meta-data, `-` read as `_`), and the standard `v1.*` keys,
/// also at the top level. Unknown variables render as `CI_MISSING_JINJA_VAR/<name>`, as
/// cloud-init does. Statement and comment tags (`{% %}`, `{# #}`) are removed, not evaluated.
pub fn render(user_data: &str, meta: &MetaData) -> String {
    let (first, rest) = user_data.split_once('\n').unwrap_or((user_data, ""));
    if !is_jinja_header(first) {
        return user_data.to_string();
    }
    let mut out = String::with_capacity(rest.len());
    let mut rest = rest;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let close = match tail.get(..2) {
            Some("{{") => "}}",
            Some("{%") => "%}",
            Some("{#") => "#}",
            _ => {
                out.push('{');
                rest = &tail[1..];
                continue;
            }
        };
        let Some(end) = tail[2..].find(close) else {
            out.push_str(tail);
            return out;
        };
        if close == "}}" {
            out.push_str(&render_expression(&tail[2..2 + end], meta));
        }
        rest = &tail[2 + end + 2..];
    }
    out.push_str(rest);
    out
}

fn is_jinja_header(line: &str) -> bool {
    line.trim()
        .strip_prefix("##")
        .and_then(|l| l.trim().strip_prefix("template:"))
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("jinja"))
}

fn render_expression(expr: &str, meta: &MetaData) -> String {
    let mut parts = expr
        .trim_matches(|c: char| c == '-' || c.is_whitespace())
        .split('|')
        .map(str::trim);
    let name = parts.next().unwrap_or_default();
    let normalized = name.replace('-', "_");
    let value = match normalized.as_str() {
        "ds.meta_data.instance_id" | "v1.instance_id" | "instance_id" => meta.instance_id.clone(),
        "ds.meta_data.local_hostname" | "v1.local_hostname" | "local_hostname" => meta.local_hostname.clone(),
        "v1.cloud_name" | "cloud_name" | "v1.platform" | "platform" => "nocloud".to_string(),
        _ => return format!("CI_MISSING_JINJA_VAR/{name}"),
    };
    parts.fold(value, |v, filter| match filter {
        "lower" => v.to_lowercase(),
        "upper" => v.to_uppercase(),
        _ => v,
    })
}

/// The decoded content of one `write_files` entry, if it can be decoded.
pub fn file_content(file: &Value) -> Option<String> {
    let content = file.get("content").and_then(Value::as_str)?;
    let encoding = file
        .get("encoding")
        .and_then(Value::as_str)
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let base64 = || base64::engine::general_purpose::STANDARD.decode(content.split_whitespace().collect::<String>());
    let bytes = match encoding.as_str() {
        "" | "text/plain" => return Some(content.to_string()),
        "b64" | "base64" => base64().ok()?,
        "gz+base64" | "gzip+base64" | "gz+b64" | "gzip+b64" => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(base64().ok()?.as_slice())
                .read_to_end(&mut out)
                .ok()?;
            out
        }
        _ => return None,
    };
    String::from_utf8(bytes).ok()
}

/// The kubeadm API documents in a file's content (other files are skipped cheaply).
fn kubeadm_documents(content: &str) -> Vec<Value> {
    if !content.contains("kubeadm.k8s.io/") {
        return Vec::new();
    }
    serde_saphyr::from_multiple::<Value>(content)
        .unwrap_or_default()
        .into_iter()
        .filter(|d| {
            d.get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with("kubeadm.k8s.io/"))
        })
        .collect()
}

/// `kubeletExtraArgs` as a map: kubeadm v1beta4 has a list of `{name, value}` (the last one
/// wins, as kubeadm does), v1beta3 a map.
fn kubelet_extra_args(args: Option<&Value>) -> BTreeMap<String, String> {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    match args {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|a| Some((a.get("name")?.as_str()?.to_string(), scalar(a.get("value")?)?)))
            .collect(),
        Some(Value::Object(map)) => map.iter().filter_map(|(k, v)| Some((k.clone(), scalar(v)?))).collect(),
        _ => BTreeMap::new(),
    }
}

/// kubelet's `--node-labels`: `k=v,k2=v2`.
fn parse_node_labels(labels: &str) -> BTreeMap<String, String> {
    labels
        .split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

fn parse_taint(t: &Value) -> Option<Taint> {
    let text = |field: &str| t.get(field).and_then(Value::as_str).map(str::to_string);
    Some(Taint {
        key: text("key")?,
        value: text("value"),
        effect: text("effect")?,
        time_added: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn meta() -> MetaData {
        MetaData {
            instance_id: "3f6c2a9e-1111-2222-3333-444455556666".into(),
            local_hostname: "Demo-CP-x7k2p".into(),
        }
    }

    /// Shaped like CABPK's controlPlaneCloudInit for an init machine (kubeadm v1beta4).
    const INIT_V1BETA4: &str = r#"## template: jinja
#cloud-config

write_files:
-   path: /etc/kubernetes/pki/ca.crt
    owner: root:root
    permissions: '0640'
    content: |
      -----BEGIN CERTIFICATE-----
      MIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAVMRMwEQYDVQQDEwprdWJlcm5ldGVz
      -----END CERTIFICATE-----
-   path: /etc/kubernetes/pki/ca.key
    owner: root:root
    permissions: '0600'
    content: |
      -----BEGIN EC PRIVATE KEY-----
      c2VjcmV0
      -----END EC PRIVATE KEY-----
-   path: /run/kubeadm/kubeadm.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
      apiServer: {}
      apiVersion: kubeadm.k8s.io/v1beta4
      clusterName: demo
      controlPlaneEndpoint: 127.0.0.1:6443
      controllerManager: {}
      dns: {}
      etcd: {}
      kind: ClusterConfiguration
      kubernetesVersion: v1.36.1
      networking:
        dnsDomain: cluster.local
        podSubnet: 192.168.0.0/16
        serviceSubnet: 10.128.0.0/12
      scheduler: {}

      ---
      apiVersion: kubeadm.k8s.io/v1beta4
      kind: InitConfiguration
      localAPIEndpoint: {}
      nodeRegistration:
        imagePullPolicy: IfNotPresent
        imagePullSerial: true
        kubeletExtraArgs:
        - name: eviction-hard
          value: nodefs.available<0%
        - name: provider-id
          value: kairon://{{ ds.meta_data.instance_id }}
        name: '{{ ds.meta_data.local_hostname }}'
        taints:
        - effect: NoSchedule
          key: node.cluster.x-k8s.io/uninitialized
      timeouts:
        controlPlaneComponentHealthCheck: 4m0s
-   path: /run/cluster-api/placeholder
    owner: root:root
    permissions: '0640'
    content: "This placeholder file is used to create the /run/cluster-api sub directory in a way that is compatible with both Linux and Windows (mkdir -p /run/cluster-api does not work with Windows)"
runcmd:
  - 'kubeadm init --config /run/kubeadm/kubeadm.yaml  && echo success > /run/cluster-api/bootstrap-success.complete'
"#;

    /// Shaped like CABPK's nodeCloudInit for a worker (kubeadm v1beta3, map form, no spaces
    /// inside the braces).
    const JOIN_V1BETA3: &str = r#"## template: jinja
#cloud-config

write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
      apiVersion: kubeadm.k8s.io/v1beta3
      discovery:
        bootstrapToken:
          apiServerEndpoint: 127.0.0.1:6443
          caCertHashes:
          - sha256:0123456789abcdef
          token: abcdef.0123456789abcdef
      kind: JoinConfiguration
      nodeRegistration:
        kubeletExtraArgs:
          node-labels: "pool=md-0,tier=worker"
          provider-id: "kairon://{{ds.meta_data.instance_id}}"
        name: '{{ds.meta_data.local_hostname}}'
        taints: null
-   path: /run/cluster-api/placeholder
    owner: root:root
    permissions: '0640'
    content: "placeholder"
runcmd:
  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete
"#;

    const JOIN_CONTROL_PLANE_NO_PROVIDER_ID: &str = r#"## template: jinja
#cloud-config
write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    content: |
      apiVersion: kubeadm.k8s.io/v1beta4
      kind: JoinConfiguration
      controlPlane:
        localAPIEndpoint: {}
      nodeRegistration:
        kubeletExtraArgs:
        - name: cgroup-driver
          value: systemd
"#;

    fn gzip_base64(s: &str) -> String {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(s.as_bytes()).unwrap();
        base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap())
    }

    fn encoded_join(encoding: &str, payload: &str) -> String {
        format!(
            "## template: jinja\n#cloud-config\nwrite_files:\n-   path: /run/kubeadm/kubeadm-join-config.yaml\n    encoding: \"{encoding}\"\n    content: |\n      {payload}\n"
        )
    }

    const RENDERED_JOIN: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\nnodeRegistration:\n  name: worker-7\n  kubeletExtraArgs:\n  - name: provider-id\n    value: kairon://abc\n";

    #[test]
    fn resolves_what_kubelet_registers_as() {
        let uid = "3f6c2a9e-1111-2222-3333-444455556666";
        let b64 = base64::engine::general_purpose::STANDARD.encode(RENDERED_JOIN);
        struct Want {
            node: &'static str,
            provider_id: Option<String>,
            version: Option<&'static str>,
            control_plane: bool,
            labels: &'static [(&'static str, &'static str)],
            taints: &'static [&'static str],
        }
        let cases: Vec<(&str, String, Want)> = vec![
            (
                "init, v1beta4 list form",
                INIT_V1BETA4.to_string(),
                Want {
                    node: "demo-cp-x7k2p",
                    provider_id: Some(format!("kairon://{uid}")),
                    version: Some("v1.36.1"),
                    control_plane: true,
                    labels: &[("node-role.kubernetes.io/control-plane", "")],
                    taints: &["node.cluster.x-k8s.io/uninitialized"],
                },
            ),
            (
                "join, v1beta3 map form without spaces",
                JOIN_V1BETA3.to_string(),
                Want {
                    node: "demo-cp-x7k2p",
                    provider_id: Some(format!("kairon://{uid}")),
                    version: None,
                    control_plane: false,
                    labels: &[("pool", "md-0"), ("tier", "worker")],
                    taints: &[],
                },
            ),
            (
                "control-plane join without provider-id",
                JOIN_CONTROL_PLANE_NO_PROVIDER_ID.to_string(),
                Want {
                    node: "demo-cp-x7k2p",
                    provider_id: None,
                    version: None,
                    control_plane: true,
                    labels: &[("node-role.kubernetes.io/control-plane", "")],
                    taints: &["node-role.kubernetes.io/control-plane"],
                },
            ),
            (
                "base64 content",
                encoded_join("base64", &b64),
                Want {
                    node: "worker-7",
                    provider_id: Some("kairon://abc".into()),
                    version: None,
                    control_plane: false,
                    labels: &[],
                    taints: &[],
                },
            ),
            (
                "gzip+base64 content",
                encoded_join("gzip+base64", &gzip_base64(RENDERED_JOIN)),
                Want {
                    node: "worker-7",
                    provider_id: Some("kairon://abc".into()),
                    version: None,
                    control_plane: false,
                    labels: &[],
                    taints: &[],
                },
            ),
        ];
        for (name, user_data, want) in cases {
            let got = resolve(&user_data, &meta()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got.node_name, want.node, "{name}");
            assert_eq!(got.provider_id, want.provider_id, "{name}");
            assert_eq!(got.kubernetes_version.as_deref(), want.version, "{name}");
            assert_eq!(got.control_plane, want.control_plane, "{name}");
            let labels: BTreeMap<String, String> = want
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(got.labels, labels, "{name}");
            let taints: Vec<&str> = got.taints.iter().map(|t| t.key.as_str()).collect();
            assert_eq!(taints, want.taints, "{name}");
        }
    }

    #[test]
    fn resolution_failures_name_no_content() {
        let cases = [
            ("not a cloud-config", "{\"ignition\": {}}", GuestError::NotCloudConfig),
            ("shell script", "#!/bin/sh\necho secret\n", GuestError::NotCloudConfig),
            (
                "broken yaml",
                "#cloud-config\nwrite_files: [\n  secret",
                GuestError::InvalidYaml,
            ),
            (
                "no kubeadm",
                "#cloud-config\nruncmd: [echo hi]\n",
                GuestError::NoKubeadm,
            ),
            ("no files", "## template: jinja\n#cloud-config\n", GuestError::NoKubeadm),
        ];
        for (name, user_data, want) in cases {
            let err = resolve(user_data, &meta()).expect_err(name);
            assert_eq!(err, want, "{name}");
            assert!(!err.to_string().contains("secret"), "{name}");
        }
    }

    #[test]
    fn renders_jinja_like_cloud_init() {
        let m = meta();
        let cases = [
            (
                "## template: jinja\nid={{ ds.meta_data.instance_id }}",
                format!("id={}", m.instance_id),
            ),
            (
                "## template: jinja\nid={{ds.meta_data.instance_id}}",
                format!("id={}", m.instance_id),
            ),
            (
                "##template:JINJA\nh={{  v1.local_hostname  }}",
                format!("h={}", m.local_hostname),
            ),
            (
                "## template: jinja\nh={{ local_hostname | lower }}",
                "h=demo-cp-x7k2p".to_string(),
            ),
            (
                "## template: jinja\nh={{ ds.meta_data.local-hostname }}",
                format!("h={}", m.local_hostname),
            ),
            (
                "## template: jinja\nx={{ ds.meta_data.providerid }}",
                "x=CI_MISSING_JINJA_VAR/ds.meta_data.providerid".into(),
            ),
            ("## template: jinja\na{% if true %}b{% endif %}{# c #}", "ab".into()),
            ("## template: jinja\nmap: {a: 1}", "map: {a: 1}".into()),
            (
                "## template: jinja\nopen {{ never closed",
                "open {{ never closed".into(),
            ),
            // Without the header, cloud-init leaves the text alone.
            (
                "#cloud-config\nid={{ ds.meta_data.instance_id }}",
                "#cloud-config\nid={{ ds.meta_data.instance_id }}".into(),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(render(input, &m), want, "{input}");
        }
    }

    #[test]
    fn encoded_content_is_not_rendered_as_jinja() {
        // cloud-init renders the user-data before decoding files, so a template variable
        // inside base64 content stays literal, and kubelet would get it verbatim.
        let payload = RENDERED_JOIN.replace("kairon://abc", "kairon://{{ ds.meta_data.instance_id }}");
        let b64 = base64::engine::general_purpose::STANDARD.encode(payload);
        let got = resolve(&encoded_join("b64", &b64), &meta()).unwrap();
        assert_eq!(
            got.provider_id.as_deref(),
            Some("kairon://{{ ds.meta_data.instance_id }}")
        );
    }

    #[test]
    fn kubelet_version_comes_from_the_image() {
        let cases = [
            (
                "image-builder name",
                "ubuntu-2404-kube-v1.36.4",
                Some("v1.36.3"),
                "v1.36.4",
            ),
            ("image wins over kubeadm", "ubuntu-2404-kube-v1.36.4", None, "v1.36.4"),
            ("build suffix", "flatcar-kube-v1.35.0-20260101", None, "v1.35.0"),
            ("registry path", "registry.example/images/kube:v1.36.2", None, "v1.36.2"),
            ("last version wins", "v2.0.1-base-kube-v1.36.1", None, "v1.36.1"),
            ("no version: kubeadm's", "ubuntu-2404", Some("v1.36.1"), "v1.36.1"),
            (
                "minor only is no version",
                "ubuntu-2404-kube-v1.36",
                Some("v1.34.2"),
                "v1.34.2",
            ),
            ("v inside a word", "dev1.2.3", None, DEFAULT_KUBELET_VERSION),
            ("four numbers", "kube-v1.36.4.1", None, DEFAULT_KUBELET_VERSION),
            ("nothing known", "img", None, DEFAULT_KUBELET_VERSION),
        ];
        for (name, image, kubeadm, want) in cases {
            assert_eq!(kubelet_version(image, kubeadm), want, "{name}");
        }
    }

    #[test]
    fn node_labels_parse() {
        let got = parse_node_labels("a=1, b=2,c,,=x");
        let want: BTreeMap<String, String> = [("a", "1"), ("b", "2"), ("c", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
    }
}
