//! Workload clusters: a kube-apiserver per cluster, sharing the environment's etcd under its
//! own prefix, whose CA is the cluster CA that CAPI finds in `<cluster>-ca`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::certs::{Ca, CertPair};
use crate::env::{Env, WorkloadRecord, apiserver_args, write_file};
use crate::kube_util::{client_from_kubeconfig, render_kubeconfig};
use crate::net::free_port;
use crate::process::{Process, ProcessSpec};
use crate::wait::wait_for;

/// The API server of one workload cluster. It lives as long as the [`Env`] that made it.
#[derive(Clone)]
pub struct WorkloadCluster {
    pub namespace: String,
    pub name: String,
    /// `127.0.0.1`: put it into `KaironCluster.spec.controlPlaneEndpoint.host`.
    pub host: String,
    pub port: u16,
    client: Client,
    kubeconfig_path: PathBuf,
    ca: CertPair,
    /// Its kube-apiserver among the environment's processes.
    pub(crate) process_name: String,
}

impl WorkloadCluster {
    /// An admin (`system:masters`) client of the workload cluster.
    pub fn client(&self) -> Client {
        self.client.clone()
    }
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }
    pub fn server_url(&self) -> String {
        format!("https://{}:{}", self.host, self.port)
    }
    /// The cluster CA certificate (PEM), as stored in `<cluster>-ca`.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }
}

/// The cluster-CA Secret in CAPI's format (`util/secret`): CAPI's kubeconfig controller signs
/// the `<cluster>-kubeconfig` client certificate with it and CABPK reuses it.
pub fn cluster_ca_secret(namespace: &str, cluster: &str, ca: &CertPair) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-ca")),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "cluster.x-k8s.io/cluster-name".to_string(),
                cluster.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(ca.cert_pem.clone().into_bytes())),
            ("tls.key".to_string(), ByteString(ca.key_pem.clone().into_bytes())),
        ])),
        ..Default::default()
    }
}

impl Env {
    /// Starts the workload API server of Cluster `namespace/cluster` and stores its CA as
    /// Secret `<cluster>-ca` (create the namespace first, and call this before creating the
    /// Cluster, so CAPI does not generate a CA of its own).
    pub async fn workload_cluster(&self, namespace: &str, cluster: &str) -> Result<WorkloadCluster> {
        let id = self.next_id();
        let label = format!("workload-{cluster}-{id}");
        let pki = self.dir.join(&label);
        std::fs::create_dir_all(&pki).with_context(|| format!("creating {}", pki.display()))?;

        let ca = Ca::new("kubernetes")?;
        let serving = ca.serving_cert(
            "kube-apiserver",
            &[
                "10.96.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
        )?;
        let admin = ca.client_cert("kubernetes-admin", &["system:masters"])?;
        let port = free_port()?;
        let server = format!("https://127.0.0.1:{port}");
        let kubeconfig = render_kubeconfig(cluster, &server, &ca.pair.cert_pem, &admin);
        let kubeconfig_path = pki.join("admin.kubeconfig");
        write_file(&kubeconfig_path, &kubeconfig)?;

        let args = apiserver_args(
            &pki,
            "",
            port,
            &self.etcd_url,
            &format!("/{label}"),
            &ca.pair,
            &serving,
            "10.96.0.0/24",
        )?;
        let proc_name = format!("kube-apiserver-{label}");
        let spec = ProcessSpec::new(&proc_name, &self.bins.kube_apiserver, &self.log_dir())
            .args(args)
            .test_go_runtime();
        self.push(Process::spawn(spec)?);
        crate::tally::record(crate::tally::Started::ApiServer);

        // The Secret goes in while the API server starts.
        let secrets: Api<Secret> = Api::namespaced(self.client(), namespace);
        secrets
            .create(&PostParams::default(), &cluster_ca_secret(namespace, cluster, &ca.pair))
            .await
            .with_context(|| format!("creating Secret {namespace}/{cluster}-ca (does the namespace exist?)"))?;

        let client = client_from_kubeconfig(&kubeconfig).await?;
        self.wait_apiserver(&proc_name, &client).await?;
        // CABPK writes bootstrap-token Secrets to kube-system; the API server creates it
        // shortly after it becomes ready.
        let nss: Api<Namespace> = Api::all(client.clone());
        wait_for(
            format!("namespace kube-system in workload cluster {cluster}"),
            Duration::from_secs(30),
            || async { nss.get_opt("kube-system").await.map(|n| n.is_some()) },
        )
        .await?;

        self.workloads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WorkloadRecord {
                namespace: namespace.to_string(),
                name: cluster.to_string(),
                kubeconfig_path: kubeconfig_path.clone(),
            });
        Ok(WorkloadCluster {
            namespace: namespace.to_string(),
            name: cluster.to_string(),
            host: "127.0.0.1".into(),
            port,
            client,
            kubeconfig_path,
            ca: ca.pair.clone(),
            process_name: proc_name,
        })
    }
}

impl Env {
    /// Starts a Kairon API server of its own (a kube-apiserver with the development Kairon
    /// Machine CRDs, whose CA is stored as Secret `<name>-ca` in `namespace` of the management
    /// cluster, as for a workload cluster), with namespace `namespace` created on it: for tests
    /// of clusters whose VMs live on another Kairon installation (`KaironCluster.spec.identityRef`).
    pub async fn kairon_api(&self, namespace: &str, name: &str) -> Result<WorkloadCluster> {
        let api = self.workload_cluster(namespace, name).await?;
        let crds = crate::bins::workspace_root().join("config/kairon");
        for doc in crate::manifests::read_yaml_dir(&crds)? {
            crate::kube_util::apply_value(&api.client, doc, None).await?;
        }
        let nss: Api<Namespace> = Api::all(api.client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
        nss.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {namespace} on Kairon API {name}"))?;
        let machines: Api<kube::api::DynamicObject> = Api::namespaced_with(
            api.client.clone(),
            namespace,
            &crate::kube_util::api_resource("kairon.zyvor.dev", "v1alpha1", "Machine", "machines"),
        );
        wait_for(
            format!("the Kairon Machine CRD served by {name}"),
            Duration::from_secs(30),
            || async { Ok::<_, kube::Error>(machines.list(&Default::default()).await.is_ok()) },
        )
        .await?;
        Ok(api)
    }
}
