use std::collections::HashMap;

use capkr::kairon::MachineSpec;
use capkr::kairon::cloud_init::{CloudInit, CloudInitFile};

use super::*;
use crate::kubeadm::{PKI_DIR, REQUIRED_PKI};

const VIP: &str = "127.77.100.1";
const JOIN_WORKER: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: 127.77.100.1:6443\n    token: abcdef.0123456789abcdef\n";
const JOIN_CP: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ncontrolPlane:\n  localAPIEndpoint: {}\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: 127.77.100.1:6443\n";
const INIT: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\ncontrolPlaneEndpoint: 127.77.100.1:6443\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n";
const KUBE_VIP: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: kube-vip\n    image: ghcr.io/kube-vip/kube-vip:v0.8.9\n    env:\n    - name: address\n      value: \"127.77.100.1\"\n    - name: port\n      value: \"6443\"\n";

fn files(kubeadm: &str, pki: bool, kube_vip: bool) -> Vec<(String, String)> {
    let mut f = vec![("/run/kubeadm/kubeadm.yaml".to_string(), kubeadm.to_string())];
    if pki {
        f.extend(
            REQUIRED_PKI
                .iter()
                .map(|p| (format!("{PKI_DIR}{p}"), "pem".to_string())),
        );
    }
    if kube_vip {
        f.push(("/etc/kubernetes/manifests/kube-vip.yaml".into(), KUBE_VIP.into()));
    }
    f
}

#[test]
fn roles_are_read_from_the_kubeadm_files() {
    let role = |endpoint: Option<&str>, control_plane: bool, vip: Option<&str>| KubeadmRole {
        join_endpoint: endpoint.map(str::to_string),
        control_plane,
        vip: vip.map(str::to_string),
    };
    let cases = [
        (
            "worker join",
            files(JOIN_WORKER, false, false),
            role(Some("127.77.100.1:6443"), false, None),
        ),
        (
            "control-plane join with kube-vip",
            files(JOIN_CP, true, true),
            role(Some("127.77.100.1:6443"), true, Some(VIP)),
        ),
        (
            "init: no join target",
            files(INIT, true, true),
            role(None, true, Some(VIP)),
        ),
        (
            "init without kube-vip",
            files(INIT, true, false),
            role(None, true, None),
        ),
        (
            "a control plane without its CAs announces nothing",
            files(INIT, false, true),
            role(None, true, None),
        ),
        (
            "no kubeadm",
            vec![("/etc/motd".into(), "hi".into())],
            KubeadmRole::default(),
        ),
    ];
    for (name, files, want) in cases {
        assert_eq!(KubeadmRole::from_files(&files), want, "{name}");
    }
}

#[test]
fn a_machines_role_comes_from_its_cloud_init() {
    let mut m = Machine::new(
        "w",
        MachineSpec {
            cloud_init: Some(CloudInit {
                hostname: "w".into(),
                write_files: vec![CloudInitFile {
                    path: "/run/kubeadm/kubeadm-join-config.yaml".into(),
                    content: JOIN_WORKER.into(),
                    permissions: "0600".into(),
                }],
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    assert_eq!(KubeadmRole::of(&m).join_endpoint.as_deref(), Some("127.77.100.1:6443"));
    m.spec.cloud_init = None;
    assert_eq!(KubeadmRole::of(&m), KubeadmRole::default());
}

#[test]
fn endpoint_hosts() {
    let cases = [
        ("10.0.0.1:6443", "10.0.0.1"),
        ("api.example:443", "api.example"),
        ("[fd00::1]:6443", "fd00::1"),
        ("fd00::1", "fd00::1"),
        ("10.0.0.1", "10.0.0.1"),
    ];
    for (endpoint, want) in cases {
        assert_eq!(host_of(endpoint), want, "{endpoint}");
    }
}

fn bridge(name: &str) -> Attachment {
    Attachment::Bridge(name.into())
}

fn cp(name: &'static str, attachment: Attachment, running: bool) -> ControlPlane<'static> {
    ControlPlane {
        name,
        attachment,
        running,
        vip: Some(VIP),
    }
}

fn join(endpoint: &str, control_plane: bool) -> KubeadmRole {
    KubeadmRole {
        join_endpoint: Some(endpoint.into()),
        control_plane,
        vip: None,
    }
}

#[test]
fn joins_reach_their_endpoint_and_etcd_peers_through_the_network() {
    use Attachment::*;
    let vip = format!("{VIP}:6443");
    let guests: HashMap<Ipv4Addr, (String, Attachment)> = [
        ("127.42.0.2".parse().unwrap(), ("cp-user".to_string(), User)),
        ("127.42.0.3".parse().unwrap(), ("cp-br0".to_string(), bridge("br0"))),
        ("127.42.0.4".parse().unwrap(), ("cp-netns".to_string(), Netns)),
    ]
    .into();
    type Case = (
        &'static str,
        Attachment,
        KubeadmRole,
        Vec<ControlPlane<'static>>,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "init: nothing to reach",
            User,
            KubeadmRole {
                control_plane: true,
                ..Default::default()
            },
            vec![],
            None,
        ),
        (
            "worker on the VIP's bridge",
            bridge("br0"),
            join(&vip, false),
            vec![cp("cp-0", bridge("br0"), true)],
            None,
        ),
        (
            "worker on another bridge",
            bridge("br1"),
            join(&vip, false),
            vec![cp("cp-0", bridge("br0"), true)],
            Some("kubeadm join: 127.77.100.1:6443 (the control-plane VIP) is not reachable from tap on bridge br1"),
        ),
        (
            "user-mode worker: no VIP behind NAT",
            User,
            join(&vip, false),
            vec![cp("cp-0", bridge("br0"), true)],
            Some("(the control-plane VIP) is not reachable from user (per-VM NAT)"),
        ),
        (
            "user-mode control plane: nobody sees its VIP",
            bridge("br0"),
            join(&vip, false),
            vec![cp("cp-0", User, true)],
            Some("not reachable from tap on bridge br0"),
        ),
        (
            "netns VIP: no shared L2",
            Netns,
            join(&vip, false),
            vec![cp("cp-0", Netns, true)],
            Some("not reachable from tap in its own netns"),
        ),
        (
            "the VIP moves to a running announcer",
            bridge("br0"),
            join(&vip, false),
            vec![cp("cp-0", bridge("br1"), false), cp("cp-1", bridge("br0"), true)],
            None,
        ),
        (
            "a VIP nobody holds",
            bridge("br0"),
            join(&vip, false),
            vec![cp("cp-0", bridge("br0"), false)],
            Some("held by no running control-plane VM"),
        ),
        (
            "an address outside the guests: reached even through NAT",
            User,
            join("192.0.2.10:6443", false),
            vec![],
            None,
        ),
        (
            "a DNS name is the outside",
            User,
            join("api.example:6443", false),
            vec![],
            None,
        ),
        (
            "a NIC on no network reaches nothing",
            Unattached,
            join("192.0.2.10:6443", false),
            vec![],
            Some("kubeadm join: 192.0.2.10:6443 is not reachable from a NIC on no network"),
        ),
        (
            "a guest's address, routed",
            bridge("br0"),
            join("127.42.0.4:6443", false),
            vec![],
            None,
        ),
        (
            "a guest's address on the same bridge",
            bridge("br0"),
            join("127.42.0.3:6443", false),
            vec![],
            None,
        ),
        (
            "a user-mode guest's address",
            bridge("br0"),
            join("127.42.0.2:6443", false),
            vec![],
            Some(
                "kubeadm join: 127.42.0.2:6443 (the address of VM cp-user, user (per-VM NAT)) is not reachable from tap on bridge br0",
            ),
        ),
        (
            "control-plane join on the bridge of its peers",
            bridge("br0"),
            join(&vip, true),
            vec![cp("cp-0", bridge("br0"), true), cp("cp-1", Netns, true)],
            None,
        ),
        (
            "control-plane join must reach every running etcd peer",
            bridge("br0"),
            join(&vip, true),
            vec![cp("cp-0", bridge("br0"), true), cp("cp-1", bridge("br1"), true)],
            Some("kubeadm join: etcd peer cp-1 (tap on bridge br1) is not reachable from tap on bridge br0"),
        ),
        (
            "a stopped peer is no etcd member to reach",
            bridge("br0"),
            join(&vip, true),
            vec![cp("cp-0", bridge("br0"), true), cp("cp-1", bridge("br1"), false)],
            None,
        ),
        (
            "netns control planes: etcd routed, VIP not",
            Netns,
            join(&vip, true),
            vec![cp("cp-0", Netns, true)],
            Some("(the control-plane VIP) is not reachable from tap in its own netns"),
        ),
        (
            "netns control planes joined through an address",
            Netns,
            join("127.42.0.4:6443", true),
            vec![cp("cp-0", Netns, true)],
            None,
        ),
    ];
    let guest_at = |a: Ipv4Addr| guests.get(&a).cloned();
    for (name, joiner, role, control_planes, want) in cases {
        let got = join_reaches(&joiner, &role, None, &control_planes, guest_at);
        match want {
            None => assert_eq!(got, Ok(()), "{name}"),
            Some(text) => {
                let err = got.expect_err(name);
                assert!(err.contains(text), "{name}: {err}");
            }
        }
    }
}

#[test]
fn a_joiner_does_not_reach_the_vip_through_its_own_kube_vip() {
    let role = KubeadmRole {
        vip: Some(VIP.into()),
        ..join(&format!("{VIP}:6443"), true)
    };
    let got = join_reaches(&Attachment::User, &role, None, &[], |_| None);
    assert!(got.is_err_and(|e| e.contains("held by no running control-plane VM")));
}

#[test]
fn a_joiner_reaches_its_own_address() {
    let own: Ipv4Addr = "127.42.0.2".parse().unwrap();
    let role = join("127.42.0.2:6443", false);
    let user = Some(("me".to_string(), Attachment::User));
    assert_eq!(
        join_reaches(&Attachment::User, &role, Some(own), &[], |_| user.clone()),
        Ok(())
    );
}
