//! The flags of kubeadm's static pods (`/etc/kubernetes/manifests`) for the processes a
//! control-plane VM runs, with paths into the VM's pki dir, and the kubeconfigs kubeadm writes
//! for them (`controller-manager.conf`, `scheduler.conf`) against the VM's own API server.
//! Ports are kubeadm's; every address is the VM's own, so many VMs share one host. Pure,
//! except [`write_kubeconfig`].

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::kubeadm::ControlPlanePlan;

pub const ETCD_CLIENT_PORT: u16 = 2379;
pub const ETCD_PEER_PORT: u16 = 2380;
/// kube-controller-manager's and kube-scheduler's secure ports (kubeadm's defaults).
pub const CONTROLLER_MANAGER_PORT: u16 = 10257;
pub const SCHEDULER_PORT: u16 = 10259;

/// The flags kubeadm's kube-apiserver static pod has.
pub fn apiserver_args(pki: &Path, ip: Ipv4Addr, plan: &ControlPlanePlan) -> Vec<String> {
    let p = |rel: &str| pki.join(rel).display().to_string();
    vec![
        format!("--advertise-address={ip}"),
        format!("--bind-address={ip}"),
        format!("--secure-port={}", plan.api_port),
        "--allow-privileged=true".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--client-ca-file={}", p("ca.crt")),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--enable-bootstrap-token-auth=true".into(),
        format!("--etcd-cafile={}", p("etcd/ca.crt")),
        format!("--etcd-certfile={}", p("apiserver-etcd-client.crt")),
        format!("--etcd-keyfile={}", p("apiserver-etcd-client.key")),
        format!("--etcd-servers=https://{ip}:{ETCD_CLIENT_PORT}"),
        format!("--kubelet-client-certificate={}", p("apiserver-kubelet-client.crt")),
        format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
        format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
        "--requestheader-allowed-names=front-proxy-client".into(),
        format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        format!("--service-cluster-ip-range={}", plan.service_subnet),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!("--cert-dir={}", p("generated")),
        // Loopback addresses are not valid Endpoints: no `kubernetes` Service endpoints.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
        // Not kubeadm's: API priority and fairness is the guest API server's own queueing,
        // which nothing of CAPI's or ours sees; without it each control-plane VM's API server
        // is ready about twice as soon for a third less CPU (docs/development.md).
        "--enable-priority-and-fairness=false".into(),
    ]
}

/// The flags kubeadm's kube-controller-manager static pod has: every controller (with the
/// bootstrap-token ones), leader election across the control-plane VMs, certificates signed
/// by the cluster CA, a service-account identity per controller. Node CIDRs are not
/// allocated (KWOK gives Pods addresses from its own range).
pub fn controller_manager_args(pki: &Path, kubeconfig: &Path, ip: Ipv4Addr, cluster_name: &str) -> Vec<String> {
    let p = |rel: &str| pki.join(rel).display().to_string();
    let kc = kubeconfig.display();
    vec![
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        format!("--kubeconfig={kc}"),
        format!("--bind-address={ip}"),
        format!("--secure-port={CONTROLLER_MANAGER_PORT}"),
        format!("--client-ca-file={}", p("ca.crt")),
        format!("--cluster-name={cluster_name}"),
        format!("--cluster-signing-cert-file={}", p("ca.crt")),
        format!("--cluster-signing-key-file={}", p("ca.key")),
        "--controllers=*,bootstrapsigner,tokencleaner".into(),
        "--leader-elect=true".into(),
        format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
        format!("--root-ca-file={}", p("ca.crt")),
        format!("--service-account-private-key-file={}", p("sa.key")),
        "--use-service-account-credentials=true".into(),
        format!("--cert-dir={}", p("generated-kcm")),
        "--profiling=false".into(),
    ]
}

/// The flags kubeadm's kube-scheduler static pod has.
pub fn scheduler_args(kubeconfig: &Path, ip: Ipv4Addr) -> Vec<String> {
    let kc = kubeconfig.display();
    vec![
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        format!("--kubeconfig={kc}"),
        format!("--bind-address={ip}"),
        format!("--secure-port={SCHEDULER_PORT}"),
        "--leader-elect=true".into(),
        "--profiling=false".into(),
    ]
}

/// A kubeconfig for `server` with the client certificate `<pki>/<identity>.{crt,key}`, trusting
/// the cluster CA; kubeadm's `admin.conf`, `controller-manager.conf` and `scheduler.conf` are
/// of this shape.
pub fn kubeconfig(server: &str, ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8], user: &str) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: vm\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: vm\n  context:\n    cluster: vm\n    user: {user}\ncurrent-context: vm\n",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem),
    )
}

/// kubeadm's `admin.conf` for `server`, from the `admin` certificate in `pki`.
pub fn admin_kubeconfig(pki: &Path, server: &str) -> std::io::Result<String> {
    let read = |rel: &str| std::fs::read(pki.join(rel));
    Ok(kubeconfig(
        server,
        &read("ca.crt")?,
        &read("admin.crt")?,
        &read("admin.key")?,
        "admin",
    ))
}

/// Writes `<dir>/<identity>.conf` (mode 0600) for `server` with the identity whose certificate
/// `kairon-guest certs` wrote as `<pki>/<identity>.{crt,key}`.
pub fn write_kubeconfig(pki: &Path, dir: &Path, identity: &str, server: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let read = |rel: &str| std::fs::read(pki.join(rel));
    let text = kubeconfig(
        server,
        &read("ca.crt")?,
        &read(&format!("{identity}.crt"))?,
        &read(&format!("{identity}.key"))?,
        identity,
    );
    let path = dir.join(format!("{identity}.conf"));
    std::fs::write(&path, text)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path)
}

/// Writes the cluster's CAs and keys from the bootstrap data into the VM's pki dir (mode
/// 0600, the dir 0700), as kubeadm finds them in `/etc/kubernetes/pki`.
pub fn write_pki(pki: &Path, files: &[(String, String)]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(pki.join("etcd"))?;
    std::fs::set_permissions(pki.parent().unwrap_or(pki), std::fs::Permissions::from_mode(0o700))?;
    for (rel, content) in files {
        // Only what kubeadm reads from the pki dir; a path escaping it is ignored.
        if rel.contains("..") {
            continue;
        }
        let path = pki.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
        args.iter()
            .find_map(|a| a.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
    }

    #[test]
    fn controller_manager_binds_the_vm_address_and_signs_with_the_cluster_ca() {
        let args = controller_manager_args(
            Path::new("/p"),
            Path::new("/v/kcm.conf"),
            Ipv4Addr::new(127, 1, 0, 5),
            "demo",
        );
        for (name, want) in [
            ("--bind-address", "127.1.0.5"),
            ("--secure-port", "10257"),
            ("--cluster-name", "demo"),
            ("--cluster-signing-cert-file", "/p/ca.crt"),
            ("--cluster-signing-key-file", "/p/ca.key"),
            ("--service-account-private-key-file", "/p/sa.key"),
            ("--kubeconfig", "/v/kcm.conf"),
            ("--leader-elect", "true"),
            ("--controllers", "*,bootstrapsigner,tokencleaner"),
        ] {
            assert_eq!(flag(&args, name), Some(want), "{name}");
        }
    }

    #[test]
    fn scheduler_binds_the_vm_address() {
        let args = scheduler_args(Path::new("/v/s.conf"), Ipv4Addr::new(127, 1, 0, 5));
        assert_eq!(flag(&args, "--bind-address"), Some("127.1.0.5"));
        assert_eq!(flag(&args, "--secure-port"), Some("10259"));
        assert_eq!(flag(&args, "--leader-elect"), Some("true"));
    }

    #[test]
    fn kubeconfig_names_the_server_and_the_identity() {
        let text = kubeconfig("https://127.1.0.5:6443", b"ca", b"cert", b"key", "scheduler");
        assert!(text.contains("server: https://127.1.0.5:6443"), "{text}");
        assert!(text.contains("- name: scheduler"), "{text}");
        assert!(text.contains("certificate-authority-data: Y2E="), "{text}");
    }
}
