//! `--admission-webhook`: the part of Kairon's optional validating webhook that concerns
//! maintenance. Kairon's webhook (Helm `webhook.enabled`, off by default, `failurePolicy:
//! Fail`) refuses a MachineMigration **create** that a MachineDisruptionBudget does not allow,
//! with the same decision `kaironctl evacuate` makes, but over the migration's namespace only
//! (its budgets, Machines and migrations); a migration of a Machine that does not exist, or
//! one in a namespace without budgets, is allowed, and updates are never checked.
//!
//! The simulator serves that decision over HTTPS on 127.0.0.1 (a port of its own, a
//! self-signed certificate made at start) and registers it with the Kairon API server as a
//! `ValidatingWebhookConfiguration` named after the simulator's namespace, limited to that
//! namespace when it has one (so that simulators sharing an API server do not judge each
//! other's migrations). The configuration is deleted when the simulator stops.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use base64::Engine as _;
use capkr::kairon::Machine;
use capkr::kairon::budget::MachineDisruptionBudget;
use capkr::kairon::maintenance::MachineMigration;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::disruption;

/// The path the API server posts MachineMigration reviews to.
const PATH: &str = "/validate-machinemigration";

/// A running webhook: its configuration's name, to delete at the end.
pub struct Webhook {
    client: Client,
    name: String,
}

impl Webhook {
    /// Serves the webhook and registers it; returns once the API server has the configuration.
    pub async fn start(client: Client, namespace: Option<&str>) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the webhook's port")?;
        let addr = listener.local_addr()?;
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .context("making the webhook's certificate")?;
        let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
            .map_err(|e| anyhow::anyhow!("the webhook's key: {e}"))?;
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)?;
        tokio::spawn(serve(listener, tls, client.clone()));

        let name = format!("kairon-sim-{}-migrations", namespace.unwrap_or("all"));
        let config = configuration(&name, namespace, addr, &cert.cert.pem());
        let api: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
            Api::all(client.clone());
        api.patch(&name, &PatchParams::apply("kairon-sim").force(), &Patch::Apply(&config))
            .await
            .with_context(|| format!("registering the ValidatingWebhookConfiguration {name}"))?;
        tracing::info!(%addr, configuration = %name, "admission webhook on: MachineMigration creates are checked against the MachineDisruptionBudgets");
        Ok(Self { client, name })
    }

    /// Removes the configuration (with `failurePolicy: Fail`, a webhook left behind without its
    /// server would refuse every migration).
    pub async fn stop(self) {
        let api: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
            Api::all(self.client);
        if let Err(e) = api.delete(&self.name, &DeleteParams::default()).await {
            tracing::warn!(configuration = %self.name, error = %e, "could not remove the admission webhook");
        }
    }
}

/// The `ValidatingWebhookConfiguration` for MachineMigration creates.
fn configuration(name: &str, namespace: Option<&str>, addr: SocketAddr, ca_pem: &str) -> Value {
    let mut webhook = json!({
        "name": "machinemigration.kairon.zyvor.dev",
        "clientConfig": {
            "url": format!("https://{addr}{PATH}"),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        },
        "rules": [{
            "apiGroups": ["kairon.zyvor.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["machinemigrations"],
            "scope": "Namespaced",
        }],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    });
    if let Some(ns) = namespace {
        webhook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kairon-sim"}},
        "webhooks": [webhook],
    })
}

async fn serve(listener: tokio::net::TcpListener, tls: rustls::ServerConfig, client: Client) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let (acceptor, client) = (acceptor.clone(), client.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let client = client.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(req, client).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
        });
    }
}

async fn respond(
    req: hyper::Request<hyper::body::Incoming>,
    client: Client,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    use http_body_util::BodyExt as _;
    let reply = |status: u16, body: Vec<u8>| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .expect("a response")
    };
    if req.method() != hyper::Method::POST || req.uri().path() != PATH {
        return reply(404, Vec::new());
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return reply(400, Vec::new()),
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return reply(400, Vec::new());
    };
    let request = &review["request"];
    let verdict = judge(&client, request).await;
    let mut response = json!({"uid": request["uid"].clone(), "allowed": verdict.is_ok()});
    if let Err(message) = verdict {
        tracing::info!(
            namespace = request["namespace"].as_str().unwrap_or_default(),
            migration = request["name"].as_str().unwrap_or_default(),
            %message,
            "admission webhook: MachineMigration refused"
        );
        response["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
    }
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    reply(200, serde_json::to_vec(&out).unwrap_or_default())
}

/// Kairon's decision on one review: `Err` is the refusal's message.
async fn judge(client: &Client, request: &Value) -> Result<(), String> {
    if request["operation"] != "CREATE" || request["resource"]["resource"] != "machinemigrations" {
        return Ok(());
    }
    let migration: MachineMigration =
        serde_json::from_value(request["object"].clone()).map_err(|e| format!("decode MachineMigration: {e}"))?;
    let ns = request["namespace"].as_str().unwrap_or_default();
    let lp = ListParams::default();
    let budgets = Api::<MachineDisruptionBudget>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| format!("list MachineDisruptionBudgets: {e}"))?
        .items;
    if budgets.is_empty() {
        return Ok(());
    }
    let machines = Api::<Machine>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| format!("list Machines: {e}"))?
        .items;
    let Some(machine) = machines
        .iter()
        .find(|m| m.metadata.name.as_deref() == Some(migration.spec.machine_name.as_str()))
    else {
        return Ok(());
    };
    let migrations = Api::<MachineMigration>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| format!("list MachineMigrations: {e}"))?
        .items;
    disruption::admit_migration(&budgets, &machines, &migrations, machine)
}
