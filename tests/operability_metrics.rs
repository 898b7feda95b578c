//! `/metrics` as shipped, against a real API server: HTTPS, served only to callers whose token
//! may `get /metrics` (TokenReview + SubjectAccessReview), with the manager acting as its
//! ServiceAccount under the shipped RBAC — so the RBAC is proven to be enough.

use std::process::Command;
use std::time::Duration;

use capkr_testenv::{CapiManagers, Env, EnvOptions};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

/// `curl -k` of `https://127.0.0.1:<port>/metrics`: (HTTP status, body); status 0 when no TLS
/// answer came.
fn scrape(port: u16, token: Option<&str>, scheme: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd
        .arg(format!("{scheme}://127.0.0.1:{port}/metrics"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

async fn token_of(env: &Env, ns: &str, name: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(env.client(), ns);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some(name.into());
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create_token_request(name, &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

/// Plain HTTP gets no answer; HTTPS without a token is 401, with a token of a ServiceAccount
/// not bound to `capkr-metrics-reader` 403, with one bound to it 200 and the metrics.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_served_over_https_only_to_callers_allowed_to_read_them() {
    let env = Env::start(EnvOptions::new("operability-metrics").capi_managers(CapiManagers::NONE))
        .await
        .expect("test environment");
    env.create_namespace("capkr-system").await.unwrap();
    env.create_namespace("monitoring").await.unwrap();
    let root = capkr_testenv::workspace_root();
    let rbac = |file: &str| std::fs::read_to_string(root.join("config/rbac").join(file)).unwrap();
    for file in [
        "service_account.yaml",
        "role.yaml",
        "role_binding.yaml",
        "metrics_reader_role.yaml",
    ] {
        env.apply(&rbac(file), None).await.unwrap();
    }
    let prometheus = token_of(&env, "monitoring", "prometheus").await;
    let stranger = token_of(&env, "monitoring", "stranger").await;
    env.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: prometheus-reads-capkr\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: capkr-metrics-reader\n\
         subjects:\n- kind: ServiceAccount\n  name: prometheus\n  namespace: monitoring\n",
        None,
    )
    .await
    .unwrap();

    let kubeconfig = env
        .impersonating_kubeconfig(
            "system:serviceaccount:capkr-system:capkr-manager",
            "capkr-manager-sa.kubeconfig",
        )
        .unwrap();
    // The environment picks the ports; the flag turns the shipped (secure) default back on.
    let manager = env
        .start_manager([
            format!("--kubeconfig={}", kubeconfig.display()),
            "--insecure-diagnostics=false".to_string(),
        ])
        .unwrap();
    let metrics = manager.spec().loopback_port("--metrics-bind-address").unwrap();

    let allowed = capkr_testenv::wait_for("/metrics 200 for the reader", Duration::from_secs(30), || async {
        let (code, body) = scrape(metrics, Some(&prometheus), "https");
        Ok::<_, std::io::Error>((code == 200).then_some(body))
    })
    .await;
    let body = match allowed {
        Ok(b) => b,
        Err(e) => panic!("{e:#}\n{}", manager.log_tail(40)),
    };
    assert!(body.contains("capkr_"), "the provider's metrics: {body}");
    assert_eq!(scrape(metrics, None, "https").0, 401, "no token");
    assert_eq!(scrape(metrics, Some("not-a-token"), "https").0, 401, "an invalid token");
    assert_eq!(
        scrape(metrics, Some(&stranger), "https").0,
        403,
        "a token without the grant"
    );
    let (code, body) = scrape(metrics, None, "http");
    assert!(
        !body.contains("capkr_"),
        "plain HTTP gets no metrics (status {code}): {body}"
    );
    assert!(manager.is_running());
}
