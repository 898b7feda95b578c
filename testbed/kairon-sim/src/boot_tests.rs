use capkr::kairon::cloud_init::{CloudInit, CloudInitFile};
use capkr::kairon::{Image, MachineStatus, Network, Resources, phase};

use super::*;

fn machine(spec: MachineSpec) -> Machine {
    let mut m = Machine::new("vm-a", spec);
    m.metadata.namespace = Some("ns".into());
    m.metadata.uid = Some("uid-a".into());
    m
}

#[test]
fn structured_cloud_init_boots_from_its_seed_with_the_hostname_as_meta_data() {
    let m = machine(MachineSpec {
        cloud_init: Some(CloudInit {
            hostname: "node-a".into(),
            run_cmd: vec!["kubeadm join".into()],
            write_files: vec![CloudInitFile {
                path: "/etc/a".into(),
                content: "x".into(),
                permissions: "0600".into(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    let boot = boot_input(&m).expect("boots");
    assert!(boot.user_data.starts_with("#cloud-config\n"), "{boot:?}");
    assert!(boot.user_data.contains("hostname: 'node-a'"));
    assert!(boot.user_data.contains("[ bash, -lc, 'kubeadm join' ]"));
    assert_eq!(boot.meta.instance_id, "node-a");
    assert_eq!(boot.meta.local_hostname, "node-a");
}

#[test]
fn no_cloud_init_or_an_empty_one_gives_no_seed() {
    let mut m = machine(MachineSpec {
        cloud_init: Some(CloudInit::default()),
        ..Default::default()
    });
    assert_eq!(boot_input(&m), None, "an empty cloudInit gives the guest no seed");
    assert!(node_facts(&m, None).is_none());
    m.spec.cloud_init = None;
    assert_eq!(boot_input(&m), None);
}

#[test]
fn the_debug_form_never_shows_the_user_data() {
    let m = machine(MachineSpec {
        cloud_init: Some(CloudInit {
            hostname: "vm-a".into(),
            run_cmd: vec!["kubeadm join --token TOPSECRET".into()],
            ..Default::default()
        }),
        ..Default::default()
    });
    let shown = format!("{:?}", boot_input(&m).expect("boots"));
    assert!(!shown.contains("TOPSECRET"), "{shown}");
    assert!(shown.contains("redacted"), "{shown}");
}

#[test]
fn cpus_are_read_as_kairon_writes_them() {
    assert_eq!(cpus(Some("2")), 2);
    assert_eq!(cpus(Some(" 4 ")), 4);
    assert_eq!(cpus(Some("1.5")), 2);
    assert_eq!(cpus(Some("500m")), 1);
    assert_eq!(cpus(Some("2500m")), 3);
    for unreadable in [
        None,
        Some(""),
        Some("two"),
        Some("0"),
        Some("-1"),
        Some("1x"),
        Some("99999999999"),
    ] {
        assert_eq!(cpus(unreadable), DEFAULT_CPUS, "{unreadable:?}");
    }
}

#[test]
fn quantities_become_kubernetes_quantities_or_the_default() {
    assert_eq!(quantity(Some("4Gi"), DEFAULT_MEMORY).0, "4Gi");
    assert_eq!(quantity(Some("512M"), DEFAULT_MEMORY).0, "512M");
    assert_eq!(quantity(Some("100K"), DEFAULT_MEMORY).0, "100k", "Kairon's K");
    assert_eq!(quantity(Some("1e3"), DEFAULT_MEMORY).0, "1e3");
    for bad in [None, Some(""), Some("lots"), Some("4GB"), Some("1.2.3Gi"), Some(".")] {
        assert_eq!(quantity(bad, DEFAULT_MEMORY).0, DEFAULT_MEMORY, "{bad:?}");
    }
}

#[test]
fn node_facts_take_resources_disk_image_and_address() {
    let mut m = machine(MachineSpec {
        resources: Some(Resources {
            cpu: Some("3".into()),
            memory: Some("6Gi".into()),
        }),
        image: Some(Image {
            image_ref: Some("ubuntu-2404-kube-v1.34.1".into()),
            disk_size: Some("40Gi".into()),
            ..Default::default()
        }),
        cloud_init: Some(CloudInit {
            hostname: "vm-a".into(),
            write_files: vec![CloudInitFile {
                path: "/run/kubeadm/kubeadm-join-config.yaml".into(),
                content: "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\nnodeRegistration:\n  kubeletExtraArgs:\n  - name: provider-id\n    value: kairon://vm-a\n".into(),
                permissions: "0600".into(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    m.status = Some(MachineStatus {
        guest_ips: Some(vec!["10.0.0.7".into()]),
        ..Default::default()
    });
    // The InternalIP is the address the engine gave the guest, not what Kairon reports.
    let facts = node_facts(&m, Some("10.42.0.3".parse().unwrap())).expect("facts");
    assert_eq!(facts.cpus, 3);
    assert_eq!(facts.memory.0, "6Gi");
    assert_eq!(facts.disk.0, "40Gi");
    assert_eq!(facts.internal_ip.as_deref(), Some("10.42.0.3"));
    assert_eq!(facts.attachment, Attachment::User);
    assert_eq!(facts.hostname, "vm-a");
    assert_eq!(facts.machine_uid, "uid-a");
    assert_eq!(image_name(&m.spec), "ubuntu-2404-kube-v1.34.1");
    assert_eq!(node_facts(&m, None).expect("facts").internal_ip, None);

    m.status.as_mut().expect("status").guest_ip = Some("10.0.0.9".into());
    assert_eq!(guest_address(&m).as_deref(), Some("10.0.0.9"), "guestIP first");
    assert!(guest_ran(&m));
    m.spec.network = Some(Network {
        mode: Some("tap".into()),
        bridge: Some("br0".into()),
        ..Default::default()
    });
    assert_eq!(
        node_facts(&m, None).expect("facts").attachment,
        Attachment::Bridge("br0".into())
    );
}

#[test]
fn a_guest_ran_if_it_reports_an_address_or_its_vm_is_up() {
    let cases = [
        (Some(phase::RUNNING), None, true),
        (Some(phase::PAUSED), None, true),
        (Some(phase::UNKNOWN), None, true),
        (Some(phase::STARTING), None, false),
        (Some(phase::HALTED), None, false),
        (Some(phase::STOPPED), None, false),
        (None, None, false),
        (Some(phase::STOPPED), Some("10.42.0.4"), true),
    ];
    for (p, ip, want) in cases {
        let mut m = machine(MachineSpec::default());
        m.status = Some(MachineStatus {
            phase: p.map(str::to_string),
            guest_ip: ip.map(str::to_string),
            ..Default::default()
        });
        assert_eq!(guest_ran(&m), want, "{p:?} {ip:?}");
    }
}

#[test]
fn image_names_fall_back_from_ref_to_path_to_url() {
    let spec = |image: Image| MachineSpec {
        image: Some(image),
        ..Default::default()
    };
    assert_eq!(image_name(&MachineSpec::default()), "");
    assert_eq!(
        image_name(&spec(Image {
            path: Some("/var/lib/img-v1.33.0.qcow2".into()),
            ..Default::default()
        })),
        "/var/lib/img-v1.33.0.qcow2"
    );
}
