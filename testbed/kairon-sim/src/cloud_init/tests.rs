//! The translation of CAPI bootstrap data into Kairon's cloudInit, judged by what a guest
//! does: each fixture is what CABPK v1.14.2 writes (`testdata/cabpk`, made by its own
//! templates: `generate.go` there), and the guest booting Kairon's rendering of the
//! translation must write the same files (path, content, mode, owner) and run the same
//! commands in the same order as a guest booting the original with the same meta-data.
//! One small evaluator plays cloud-init for both ([`super::evaluator`]).

use std::io::Write;

use base64::Engine;
use capkr::kairon::cloud_init::CloudInit;
use capkr::kairon::cloud_init::{
    DEFAULT_MAX_DECODED_BYTES, GuestFacts, RUNCMD_SCRIPT, TranslateError, translate_cloud_config,
};

use super::evaluator::evaluate;
use super::*;
use crate::guest;

const NAME: &str = "demo-md-0-x7k2p";

fn fixture(name: &str) -> String {
    let path = format!("{}/testdata/cabpk/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn translate(user_data: &str) -> Result<CloudInit, TranslateError> {
    translate_cloud_config(user_data, &GuestFacts::kairon(NAME), DEFAULT_MAX_DECODED_BYTES)
}

/// The guest booting Kairon's seed of the translation does what the guest booting `original`
/// does; returns the translation.
fn assert_same_outcome(name: &str, original: &str) -> CloudInit {
    let ci = translate(original).unwrap_or_else(|e| panic!("{name}: {e}"));
    let seed = seed(&ci).expect("a seed");
    let kairon_meta = meta(&ci);
    // The original as a guest with the same meta-data would boot it.
    let want = evaluate(original, &kairon_meta);
    let mut got = evaluate(&seed.user_data, &kairon_meta);
    // FluxVM's baseline: the image's default user, and `cloud` when the cloudInit names none.
    if ci.user.is_empty() {
        got.users.retain(|u| u.name != DEFAULT_USER);
    }
    assert_eq!(got, want, "{name}");
    assert!(
        want.commands.iter().any(|c| c.contains("kubeadm ")),
        "{name}: runs kubeadm"
    );
    ci
}

#[test]
fn kairons_guest_does_what_cabpks_bootstrap_data_would() {
    for name in [
        "control-plane-init.yaml",
        "control-plane-join.yaml",
        "worker-join.yaml",
        "worker-files.yaml",
        "worker-user.yaml",
    ] {
        assert_same_outcome(name, &fixture(name));
    }
}

#[test]
fn files_in_every_encoding_with_owners_and_appends_land_as_written() {
    let original = fixture("worker-files.yaml");
    let ci = assert_same_outcome("worker-files", &original);
    let got = evaluate(&seed(&ci).unwrap().user_data, &meta(&ci)).files;
    let file = |p: &str| got.get(p).unwrap_or_else(|| panic!("{p}"));
    assert_eq!(file("/etc/plain.conf").content, b"plain: text\nsecret: s3cr3t-plain\n");
    assert_eq!(file("/etc/plain.conf").mode, 0o600);
    assert_eq!(file("/etc/b64.conf").content, b"decoded: from base64\n");
    assert_eq!(
        file("/etc/gz.conf").content,
        "decoded: from gzip+base64\n".repeat(50).as_bytes()
    );
    assert_eq!(file("/etc/gz.conf").mode, 0o640);
    assert_eq!(
        file("/opt/bin/tool").content,
        [0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0xff, 0xfe, 0, 0x10]
    );
    assert_eq!(file("/opt/bin/tool").mode, 0o755);
    assert_eq!(file("/home/ops/.config/app.yaml").owner, ("ops".into(), "ops".into()));
    assert_eq!(file("/var/lib/app/state").owner, ("nobody".into(), "root".into()));
    assert_eq!(
        file("/etc/hosts").content,
        b"10.0.0.100 api.demo.internal\n",
        "appended to an absent file"
    );
    assert_eq!(file("/etc/motd.d/capkr").content, b"written after the append\n");
    assert_eq!(file("/etc/motd.d/capkr").owner, ("root".into(), "root".into()));
    // The heredoc is lines of the one runcmd script, which one runCmd entry executes.
    assert_eq!(ci.run_cmd.last(), Some(&format!("sh '{RUNCMD_SCRIPT}'")));
    let script = ci
        .write_files
        .iter()
        .find(|f| f.path == RUNCMD_SCRIPT)
        .expect("the runcmd script");
    assert!(script.content.starts_with("#!/bin/sh\n") && script.content.contains("<<"));
}

#[test]
fn the_guest_registers_under_the_name_and_provider_id_the_provider_knows() {
    for name in ["control-plane-init.yaml", "control-plane-join.yaml", "worker-join.yaml"] {
        let ci = translate(&fixture(name)).unwrap();
        let seed = seed(&ci).unwrap();
        assert_eq!(seed.meta_data, format!("instance-id: {NAME}\nlocal-hostname: {NAME}\n"));
        let identity = guest::resolve(&seed.user_data, &meta(&ci)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(identity.node_name, NAME, "{name}");
        assert_eq!(
            identity.provider_id.as_deref(),
            Some(format!("kairon://{NAME}").as_str()),
            "{name}"
        );
        assert_eq!(identity.control_plane, name.starts_with("control-plane"), "{name}");
        let files = guest::written_files(&seed.user_data, &meta(&ci)).unwrap();
        assert!(files.iter().any(|(p, _)| p.starts_with("/run/kubeadm/")), "{name}");
    }
}

#[test]
fn a_kubeadm_config_the_bridge_dropped_leaves_the_guest_without_a_kubelet() {
    for name in ["control-plane-init.yaml", "control-plane-join.yaml", "worker-join.yaml"] {
        let mut ci = translate(&fixture(name)).unwrap();
        let before = ci.write_files.len();
        ci.write_files
            .retain(|f| !(f.content.contains("InitConfiguration") || f.content.contains("JoinConfiguration")));
        assert_eq!(ci.write_files.len(), before - 1, "{name}: one kubeadm config file");
        let seed = seed(&ci).unwrap();
        let refused = guest::resolve(&seed.user_data, &meta(&ci));
        assert!(
            refused.is_err(),
            "{name}: the guest's kubeadm has no config: {refused:?}"
        );
    }
}

#[test]
fn cabpk_keys_without_a_kairon_equivalent_are_refused_by_name() {
    let cases = [
        ("worker-ntp.yaml", TranslateError::Unsupported { key: "ntp".into() }),
        (
            "worker-bootcmd.yaml",
            TranslateError::Unsupported { key: "bootcmd".into() },
        ),
        (
            "worker-disk-setup.yaml",
            TranslateError::Unsupported {
                key: "disk_setup".into(),
            },
        ),
        (
            "worker-mounts.yaml",
            TranslateError::Unsupported { key: "mounts".into() },
        ),
        (
            "worker-users-unsupported.yaml",
            TranslateError::UnsupportedUser {
                index: 2,
                what: "a second user (Kairon makes one)".into(),
            },
        ),
    ];
    for (name, want) in cases {
        let got = translate(&fixture(name));
        assert_eq!(got, Err(want), "{name}");
        let message = got.unwrap_err().to_string();
        for secret in ["fghijk.0123456789fghijk", "$6$", "pool.ntp.org", "echo boot", "sha256:"] {
            assert!(!message.contains(secret), "{name}: {message}");
        }
    }
    // Without disk_setup, fs_setup is named just the same.
    let fs_only = fixture("worker-disk-setup.yaml").replace(
        "disk_setup:\n  /dev/vdb:\n    table_type: gpt\n    layout: true\n    overwrite: false\n",
        "",
    );
    assert_eq!(
        translate(&fs_only),
        Err(TranslateError::Unsupported { key: "fs_setup".into() })
    );
}

#[test]
fn raw_gzip_content_is_no_text_for_cloud_init_or_the_provider() {
    // CABPK's `encoding: gzip` puts the compressed bytes in a YAML block: not UTF-8, so the
    // provider's bootstrap data check refuses it (BootstrapDataInvalid), as cloud-init's
    // YAML reader would.
    let path = format!("{}/testdata/cabpk/worker-gzip-file.yaml", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(path).unwrap();
    assert!(String::from_utf8(bytes).is_err());
}

fn gzip(data: &[u8], level: u32) -> String {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    encoder.write_all(data).unwrap();
    base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap())
}

fn gzip_file(content_b64: &str) -> String {
    format!(
        "#cloud-config\nwrite_files:\n-   path: /etc/blob\n    encoding: \"gzip+base64\"\n    content: |\n      {content_b64}\n"
    )
}

#[test]
fn gzip_content_decodes_as_flate2_wrote_it() {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut noise = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    };
    let random: Vec<u8> = (0..70_000).map(|_| noise()).collect();
    let text: Vec<u8> = (0..70_000)
        .map(|i| b"kubeadm join --config /run/kubeadm.yaml\n"[i % 40])
        .collect();
    let mixed: Vec<u8> = text
        .iter()
        .zip(&random)
        .map(|(t, r)| if r % 7 == 0 { *r } else { *t })
        .collect();
    for (what, data) in [
        ("random", &random),
        ("text", &text),
        ("mixed", &mixed),
        ("empty", &Vec::new()),
    ] {
        for level in [0, 1, 6, 9] {
            let ci = translate(&gzip_file(&gzip(data, level))).unwrap_or_else(|e| panic!("{what}/{level}: {e}"));
            let got = evaluate(&seed(&ci).unwrap().user_data, &meta(&ci));
            assert_eq!(&got.files["/etc/blob"].content, data, "{what} at level {level}");
        }
    }
}

#[test]
fn a_gzip_bomb_is_refused_before_it_fills_memory() {
    // 64 MiB of zeros in 64 KiB of gzip, well within the payload limit.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        encoder.write_all(&zeros).unwrap();
    }
    let bomb = base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap());
    assert!(
        bomb.len() < capkr::capi::bootstrap::DEFAULT_MAX_BOOTSTRAP_DATA_BYTES,
        "{}",
        bomb.len()
    );
    assert_eq!(
        translate(&gzip_file(&bomb)),
        Err(TranslateError::TooLarge {
            path: "/etc/blob".into(),
            limit: DEFAULT_MAX_DECODED_BYTES
        })
    );
}

#[test]
fn renders_the_seed_as_fluxvm_writes_it() {
    let ci = CloudInit {
        hostname: "web-01".into(),
        user: "ops".into(),
        ssh_authorized_keys: vec!["ssh-ed25519 AAAA ops@laptop".into()],
        packages: vec!["nginx".into()],
        run_cmd: vec!["systemctl enable --now nginx".into(), "echo 'it''s'".into()],
        write_files: vec![
            capkr::kairon::cloud_init::CloudInitFile {
                path: "/etc/nginx/conf.d/app.conf".into(),
                content: "server {}\n".into(),
                permissions: "0644".into(),
            },
            capkr::kairon::cloud_init::CloudInitFile {
                path: "/etc/empty".into(),
                content: String::new(),
                permissions: String::new(),
            },
        ],
    };
    let want = "#cloud-config
hostname: 'web-01'
users:
  - default
  - name: 'ops'
    sudo: ALL=(ALL) NOPASSWD:ALL
    shell: /bin/bash
    ssh_authorized_keys:
      - 'ssh-ed25519 AAAA ops@laptop'
package_update: true
packages:
  - 'nginx'
runcmd:
  - [ bash, -lc, 'systemctl enable --now nginx' ]
  - [ bash, -lc, 'echo ''it''''s''' ]
write_files:
  - path: '/etc/nginx/conf.d/app.conf'
    permissions: '0644'
    encoding: b64
    content: 'c2VydmVyIHt9Cg=='
  - path: '/etc/empty'
    encoding: b64
    content: ''
";
    let seed = seed(&ci).unwrap();
    assert_eq!(seed.user_data, want);
    assert_eq!(seed.meta_data, "instance-id: web-01\nlocal-hostname: web-01\n");
    let got = evaluate(&seed.user_data, &meta(&ci));
    assert_eq!(got.commands, ["systemctl enable --now nginx", "echo 'it''s'"]);
    assert_eq!(got.files["/etc/nginx/conf.d/app.conf"].content, b"server {}\n");

    let bare = CloudInit {
        run_cmd: vec!["true".into()],
        ..Default::default()
    };
    let seed_of_bare = super::seed(&bare).unwrap();
    assert!(seed_of_bare.user_data.contains("hostname: 'fluxvm-vm'\n"));
    assert!(seed_of_bare.user_data.contains("  - name: 'cloud'\n"));
    assert_eq!(
        seed_of_bare.meta_data,
        "instance-id: fluxvm-vm\nlocal-hostname: fluxvm-vm\n"
    );
    assert!(
        super::seed(&CloudInit::default()).is_none(),
        "kairon-node sends no cloud-init"
    );
}
