//! Small Kubernetes helpers: API resources by name, kubeconfigs, clients, server-side apply of
//! YAML.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Api, Client};

use crate::certs::CertPair;
use crate::manifests::{b64, parse_yaml_documents};

/// The field manager of everything the test environment applies.
pub const FIELD_MANAGER: &str = "capkr-testenv";

/// The API resource of `group`/`version` `kind` ("" is the core group), for `Api<DynamicObject>`.
pub fn api_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// A Cluster API core kind (`cluster.x-k8s.io/v1beta2`), e.g. `capi_resource("Machine", "machines")`.
pub fn capi_resource(kind: &str, plural: &str) -> ApiResource {
    api_resource("cluster.x-k8s.io", "v1beta2", kind, plural)
}

/// One of this provider's kinds (`infrastructure.cluster.x-k8s.io/v1alpha1`) as a dynamic
/// object, for writing what the typed API would not let through.
pub fn infrastructure_resource(kind: &str, plural: &str) -> ApiResource {
    api_resource("infrastructure.cluster.x-k8s.io", "v1alpha1", kind, plural)
}

/// A kubeconfig with embedded CA and client certificate.
pub fn render_kubeconfig(name: &str, server: &str, ca_pem: &str, user: &CertPair) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: {name}-admin\n  user:\n    client-certificate-data: {cert}\n    \
         client-key-data: {key}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\n\
         current-context: {name}\n",
        ca = b64(ca_pem.as_bytes()),
        cert = b64(user.cert_pem.as_bytes()),
        key = b64(user.key_pem.as_bytes()),
    )
}

/// A client from kubeconfig text.
pub async fn client_from_kubeconfig(text: &str) -> Result<Client> {
    Client::try_from(config_from_kubeconfig(text).await?).context("building a client")
}

/// The client configuration of a kubeconfig: unlike a [`Client`], not bound to the tokio
/// runtime that made it.
pub(crate) async fn config_from_kubeconfig(text: &str) -> Result<kube::Config> {
    let kc = Kubeconfig::from_yaml(text).context("parsing kubeconfig")?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("kubeconfig to client config")?;
    // Many tests run at once on a small machine; be patient with slow responses.
    config.read_timeout = Some(Duration::from_secs(60));
    Ok(config)
}

pub async fn client_from_kubeconfig_file(path: &Path) -> Result<Client> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    client_from_kubeconfig(&text).await
}

/// The API resource and scope of `apiVersion`/`kind`, by discovery.
pub async fn resolve_kind(client: &Client, api_version: &str, kind: &str) -> Result<(ApiResource, ApiCapabilities)> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))
}

/// An `Api` for any object, namespaced ones in `namespace` (or their own `metadata.namespace`).
pub fn dynamic_api(
    client: &Client,
    ar: &ApiResource,
    caps: &ApiCapabilities,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match (&caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, ar),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), ar),
        (Scope::Cluster, _) => Api::all_with(client.clone(), ar),
    }
}

/// Server-side applies every document of `yaml` (field manager `capkr-testenv`, forced, strict
/// field validation so typos fail loudly). Namespaced objects without `metadata.namespace` go to
/// `default_namespace`. Returns the applied objects in order.
pub async fn apply_yaml(client: &Client, yaml: &str, default_namespace: Option<&str>) -> Result<Vec<DynamicObject>> {
    let docs = parse_yaml_documents(yaml)?;
    let mut out = Vec::with_capacity(docs.len());
    for doc in docs {
        out.push(apply_value(client, doc, default_namespace).await?);
    }
    Ok(out)
}

/// Server-side applies one object given as JSON.
pub async fn apply_value(
    client: &Client,
    doc: serde_json::Value,
    default_namespace: Option<&str>,
) -> Result<DynamicObject> {
    let api_version = doc["apiVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("document without apiVersion: {doc}"))?
        .to_string();
    let kind = doc["kind"]
        .as_str()
        .ok_or_else(|| anyhow!("document without kind: {doc}"))?
        .to_string();
    let name = doc["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow!("{kind} without metadata.name"))?
        .to_string();
    let ns = doc["metadata"]["namespace"].as_str().map(str::to_string);
    let (ar, caps) = resolve_kind(client, &api_version, &kind).await?;
    let namespace = ns.as_deref().or(default_namespace);
    if caps.scope == Scope::Namespaced && namespace.is_none() {
        bail!("{kind} {name} is namespaced but has no namespace");
    }
    let api = dynamic_api(client, &ar, &caps, namespace);
    let pp = PatchParams::apply(FIELD_MANAGER).force().validation_strict();
    api.patch(&name, &pp, &Patch::Apply(&doc)).await.with_context(|| {
        format!(
            "applying {kind} {}{name}",
            namespace.map(|n| format!("{n}/")).unwrap_or_default()
        )
    })
}

/// `GET <path>` on the API server through `client` (e.g. `/readyz`, `/version`).
pub async fn get_text(client: &Client, path: &str) -> Result<String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .context("building a request")?;
    Ok(client.request_text(req).await?)
}
