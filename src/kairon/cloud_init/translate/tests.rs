//! Table tests of the translation on cloud-configs written for one behaviour each. The
//! simulator's tests (`testbed/kairon-sim/src/cloud_init.rs`) check, on CABPK's own output, that
//! the guest Kairon's rendering boots does what the original would.

use super::*;
use crate::kairon::cloud_init::CloudInitFile;

/// `runcmd` as the one `sh` script cloud-init makes of it.
mod runcmd;

use runcmd::runcmd_script;

fn facts() -> GuestFacts {
    GuestFacts::kairon("md-0-x7k2p")
}

fn translate(user_data: &str) -> Result<CloudInit, TranslateError> {
    translate_cloud_config(user_data, &facts(), DEFAULT_MAX_DECODED_BYTES)
}

fn file(path: &str, content: &str, permissions: &str) -> CloudInitFile {
    CloudInitFile {
        path: path.into(),
        content: content.into(),
        permissions: permissions.into(),
    }
}

#[test]
fn renders_the_template_and_keeps_files_and_commands_in_order() {
    let got = translate(
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm.yaml\n  owner: root:root\n  permissions: '0640'\n  content: |\n    name: '{{ ds.meta_data.local_hostname }}'\n    provider-id: kairon://{{ ds.meta_data.instance_id }}\n- path: etc/./x\n  content: x\nruncmd:\n  - echo one\n  - [ kubeadm, join, \"it's\", 3 ]\n",
    )
    .unwrap();
    assert_eq!(
        got,
        CloudInit {
            hostname: "md-0-x7k2p".into(),
            run_cmd: vec![format!("sh '{RUNCMD_SCRIPT}'")],
            write_files: vec![
                file(
                    "/run/kubeadm/kubeadm.yaml",
                    "name: 'md-0-x7k2p'\nprovider-id: kairon://md-0-x7k2p\n",
                    "0640"
                ),
                file("/etc/x", "x", ""),
                file(
                    RUNCMD_SCRIPT,
                    "#!/bin/sh\necho one\n'kubeadm' 'join' 'it'\\''s' '3'\n",
                    "0700"
                ),
            ],
            ..Default::default()
        }
    );
}

#[test]
fn what_kairon_cannot_write_itself_becomes_commands_before_all_others() {
    let got = translate(concat!(
        "#cloud-config\nwrite_files:\n",
        "- {path: /etc/a, content: first, owner: 'ops:ops'}\n",
        "- {path: /etc/a, content: second, owner: 'ops:adm'}\n",
        "- {path: /etc/hosts, content: \"10.0.0.1 api\\n\", append: true}\n",
        "- {path: /etc/b, content: b, defer: true, owner: ops, permissions: '0600'}\n",
        "- {path: /etc/hosts, content: replaced}\n",
        "- {path: /bin/tool, encoding: b64, content: f/4AEA==, permissions: '0755'}\n",
        "- {path: /etc/c, content: c, owner: root}\n",
        "runcmd: [kubeadm join]\n",
    ))
    .unwrap();
    let stage = |n: u32| format!("{STAGING_DIR}/files/{n}");
    assert_eq!(
        got.run_cmd,
        [
            "chown 'ops:adm' '/etc/a'".to_string(),
            format!(
                "mkdir -p '/etc' && cat '{0}' >> '/etc/hosts' && chmod 0644 '/etc/hosts' && chown 'root:root' '/etc/hosts'; rm -f '{0}'",
                stage(1)
            ),
            format!(
                "mkdir -p '/etc' && cat '{0}' > '/etc/hosts' && chmod 0644 '/etc/hosts' && chown 'root:root' '/etc/hosts'; rm -f '{0}'",
                stage(2)
            ),
            format!(
                "mkdir -p '/bin' && base64 -d '{0}' > '/bin/tool' && chmod 0755 '/bin/tool' && chown 'root:root' '/bin/tool'; rm -f '{0}'",
                stage(3)
            ),
            format!(
                "mkdir -p '/etc' && cat '{0}' > '/etc/b' && chmod 0600 '/etc/b' && chown 'ops' '/etc/b'; rm -f '{0}'",
                stage(4)
            ),
            format!("sh '{RUNCMD_SCRIPT}'"),
        ],
        "deferred entries come after all others, as cloud-init writes them in its final stage"
    );
    assert_eq!(
        got.write_files,
        [
            file("/etc/a", "first", ""),
            file("/etc/a", "second", ""),
            file("/etc/c", "c", ""),
            file(&stage(1), "10.0.0.1 api\n", "0600"),
            file(&stage(2), "replaced", "0600"),
            file(&stage(3), "f/4AEA==", "0600"),
            file(&stage(4), "b", "0600"),
            file(RUNCMD_SCRIPT, "#!/bin/sh\nkubeadm join\n", "0700"),
        ]
    );
}

#[test]
fn every_key_without_a_kairon_equivalent_is_reported_by_name() {
    let cases = [
        ("bootcmd", "bootcmd:\n  - \"echo boot\"\n"),
        ("ntp", "ntp:\n  enabled: true\n  servers:\n    - 0.pool.ntp.org\n"),
        ("ntp", "ntp:\n  servers: [a]\n"),
        (
            "disk_setup",
            "disk_setup:\n  /dev/vdb:\n    table_type: gpt\n    layout: true\n",
        ),
        (
            "fs_setup",
            "fs_setup:\n  - label: etcd_disk\n    filesystem: ext4\n    device: /dev/vdb1\n",
        ),
        ("mounts", "mounts:\n  - - LABEL=etcd_disk\n    - /var/lib/etcd\n"),
        ("ssh_authorized_keys", "ssh_authorized_keys: [ssh-ed25519 AAAA]\n"),
        ("package_upgrade", "package_upgrade: true\n"),
        ("package_update", "package_update: true\n"),
        ("package_update", "package_update: false\npackages: [jq]\n"),
        ("manage_etc_hosts", "manage_etc_hosts: true\n"),
        ("final_message", "final_message: done\n"),
        ("(a key that is not a plain name)", "\"MIIB secret: x\": 1\n"),
    ];
    for (key, body) in cases {
        let got = translate(&format!("#cloud-config\n{body}"));
        assert_eq!(got, Err(TranslateError::Unsupported { key: key.into() }), "{body}");
    }
    // No-ops: a disabled NTP, merge instructions with nothing to merge.
    for body in [
        "ntp:\n  enabled: false\n  servers: [a]\n",
        "merge_how: dict(recurse_array)+list(append)\n",
    ] {
        assert!(translate(&format!("#cloud-config\n{body}")).is_ok(), "{body}");
    }
    assert_eq!(
        translate("#cloud-config\npackage_update: true\npackages: [jq, 'qemu-guest-agent']\n")
            .unwrap()
            .packages,
        ["jq", "qemu-guest-agent"]
    );
}

#[test]
fn the_one_user_kairon_makes_is_the_only_one_translated() {
    let ok = "users:\n  - default\n  - name: capk\n    lock_passwd: true\n    shell: /bin/bash\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    ssh_authorized_keys:\n      - ssh-ed25519 AAAA ops@example\n";
    let got = translate(&format!("#cloud-config\n{ok}")).unwrap();
    assert_eq!(
        (got.user.as_str(), got.ssh_authorized_keys.as_slice()),
        ("capk", &["ssh-ed25519 AAAA ops@example".to_string()][..])
    );
    let no_shell = "users:\n  - name: capk\n    sudo: [ 'ALL=(ALL) NOPASSWD:ALL' ]\n";
    assert_eq!(translate(&format!("#cloud-config\n{no_shell}")).unwrap().user, "capk");

    let cases = [
        (1, "a user without passwordless sudo", "users: [capk]\n"),
        (1, "a user without passwordless sudo", "users:\n  - name: capk\n"),
        (1, "field sudo", "users:\n  - name: capk\n    sudo: ALL=(ALL) ALL\n"),
        (
            1,
            "field shell",
            "users:\n  - {name: capk, sudo: 'ALL=(ALL) NOPASSWD:ALL', shell: /bin/sh}\n",
        ),
        (
            1,
            "field lock_passwd",
            "users:\n  - {name: capk, sudo: 'ALL=(ALL) NOPASSWD:ALL', lock_passwd: false}\n",
        ),
        (
            1,
            "field groups",
            "users:\n  - {name: capk, sudo: 'ALL=(ALL) NOPASSWD:ALL', groups: 'adm, docker'}\n",
        ),
        (
            1,
            "field passwd",
            "users:\n  - {name: capk, sudo: 'ALL=(ALL) NOPASSWD:ALL', passwd: '$6$TOPSECRET'}\n",
        ),
        (
            2,
            "a second user (Kairon makes one)",
            "users:\n  - {name: a, sudo: 'ALL=(ALL) NOPASSWD:ALL'}\n  - {name: b, sudo: 'ALL=(ALL) NOPASSWD:ALL'}\n",
        ),
    ];
    for (index, what, body) in cases {
        let got = translate(&format!("#cloud-config\n{body}"));
        assert_eq!(
            got,
            Err(TranslateError::UnsupportedUser {
                index,
                what: what.into()
            }),
            "{body}"
        );
    }
}

#[test]
fn hostname_comes_from_the_cloud_config_else_the_guest() {
    let cases: [(&str, Result<&str, TranslateError>); 7] = [
        ("", Ok("md-0-x7k2p")),
        ("hostname: web-1\n", Ok("web-1")),
        ("fqdn: web-1.example.com\n", Ok("web-1.example.com")),
        ("hostname: web-1\nfqdn: web-1.example.com\n", Ok("web-1.example.com")),
        (
            "hostname: web-1\nfqdn: db.example.com\n",
            Err(TranslateError::ConflictingHostname),
        ),
        (
            "hostname: 'a b'\n",
            Err(TranslateError::InvalidHostname { key: "hostname" }),
        ),
        ("fqdn: [x]\n", Err(TranslateError::InvalidHostname { key: "fqdn" })),
    ];
    for (body, want) in cases {
        let got = translate(&format!("#cloud-config\n{body}")).map(|c| c.hostname);
        assert_eq!(got.as_deref().map_err(Clone::clone), want, "{body}");
    }
    let long_label = "x".repeat(64);
    for bad in ["not a name", long_label.as_str(), "a..b", "ends-with-a-dot."] {
        assert_eq!(
            translate_cloud_config("#cloud-config\n", &GuestFacts::kairon(bad), 1),
            Err(TranslateError::InvalidHostname { key: "local-hostname" }),
            "{bad}"
        );
    }
    let long_fqdn = format!("{}.example.com", "x".repeat(63));
    assert!(translate_cloud_config("#cloud-config\n", &GuestFacts::kairon(&long_fqdn), 1).is_ok());
}

#[test]
fn template_variables_unknown_before_creation_are_errors() {
    let unknown_id = GuestFacts {
        local_hostname: "m1".into(),
        instance_id: None,
    };
    let data = "## template: jinja\n#cloud-config\nruncmd: ['echo {{ v1.instance_id }}']\n";
    assert_eq!(
        translate_cloud_config(data, &unknown_id, 100),
        Err(TranslateError::UnknownVariable {
            name: "v1.instance_id".into()
        })
    );
    assert_eq!(
        translate("## template: jinja\n#cloud-config\nruncmd: ['{{ ds.meta_data.public_ipv4 }}']\n"),
        Err(TranslateError::UnknownVariable {
            name: "ds.meta_data.public_ipv4".into()
        })
    );
    assert_eq!(
        translate("## template: jinja\n#cloud-config\n{% set x = 1 %}\n"),
        Err(TranslateError::UnsupportedJinja { line: 3 })
    );
    // Without the header, braces are text: cloud-init renders nothing.
    assert_eq!(
        runcmd_script(&translate("#cloud-config\nruncmd: ['echo {{ v1.nothing }}']\n").unwrap()),
        Some("#!/bin/sh\necho {{ v1.nothing }}\n")
    );
}

#[test]
fn only_cloud_config_is_translated() {
    let cases = [
        ("#!/bin/sh\necho hi\n", TranslateError::NotCloudConfig),
        (
            "#cloud-config-archive\n- type: text/x-shellscript\n",
            TranslateError::NotCloudConfig,
        ),
        (
            "Content-Type: multipart/mixed; boundary=x\n",
            TranslateError::NotCloudConfig,
        ),
        ("## template: jinja2\n#cloud-config\n", TranslateError::TemplateHeader),
        ("#cloud-config\nwrite_files: [\n", TranslateError::InvalidYaml),
        ("#cloud-config\nruncmd: [a]\nruncmd: [b]\n", TranslateError::InvalidYaml),
        ("#cloud-config\n- a\n", TranslateError::NotAMapping),
    ];
    for (data, want) in cases {
        assert_eq!(translate(data), Err(want), "{data}");
    }
    assert_eq!(translate("#cloud-config\n").unwrap().hostname, "md-0-x7k2p");
}

#[test]
fn file_entries_cloud_init_would_fail_or_misread_are_errors() {
    let bad = |path: &str, reason: &'static str| TranslateError::InvalidFile {
        path: path.into(),
        reason,
    };
    let cases = [
        ("- {content: x}\n", TranslateError::MissingPath { index: 1 }),
        ("- {path: /a}\n- {path: ''}\n", TranslateError::MissingPath { index: 2 }),
        (
            "- {path: /a, encoding: b64, content: YQ}\n",
            bad("/a", "base64 content is incomplete (padding)"),
        ),
        (
            "- {path: /a, encoding: gz+b64, content: YWJj}\n",
            bad("/a", "gzip content is not a valid gzip stream"),
        ),
        (
            "- {path: /a, encoding: bas64, content: YQ==}\n",
            bad("/a", "encoding is none of cloud-init's (b64, gz, gz+b64, text/plain)"),
        ),
        (
            "- {path: /a, permissions: 0640}\n",
            bad("/a", "permissions is not a quoted octal string"),
        ),
        (
            "- {path: /a, permissions: 'rw-r--r--'}\n",
            bad("/a", "permissions is not an octal mode"),
        ),
        ("- {path: /a, content: [x]}\n", bad("/a", "content is not a string")),
        (
            "- {path: /run/cluster-api-provider-kairon/files/1}\n",
            bad(
                "/run/cluster-api-provider-kairon/files/1",
                "the path is reserved for the provider's staged files",
            ),
        ),
        (
            "- {path: /a, source: {uri: 'https://example.com/x'}}\n",
            TranslateError::UnsupportedFileField {
                path: "/a".into(),
                field: "source".into(),
            },
        ),
    ];
    for (entries, want) in cases {
        assert_eq!(
            translate(&format!("#cloud-config\nwrite_files:\n{entries}")),
            Err(want),
            "{entries}"
        );
    }
    // Plain text, and an empty file without content, as cloud-init writes them.
    let got = translate("#cloud-config\nwrite_files:\n- {path: /a, encoding: text/plain, content: x}\n- {path: /b}\n")
        .unwrap();
    assert_eq!(got.write_files, [file("/a", "x", ""), file("/b", "", "")]);
}

/// A deflate stream (fixed Huffman codes) of one zero byte and `repeats` copies of the 258
/// bytes before: 13 bits of input per 258 bytes of output.
fn zeros_bomb(repeats: usize) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        n: u32,
    }
    impl Bits {
        fn put(&mut self, value: u32, count: u32) {
            self.acc |= u64::from(value) << self.n;
            self.n += count;
            while self.n >= 8 {
                self.out.push(self.acc as u8);
                self.acc >>= 8;
                self.n -= 8;
            }
        }
        /// Huffman codes go most significant bit first.
        fn code(&mut self, code: u32, len: u32) {
            let reversed = (0..len).fold(0, |r, i| (r << 1) | ((code >> i) & 1));
            self.put(reversed, len);
        }
    }
    let mut bits = Bits {
        out: vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff],
        acc: 0,
        n: 0,
    };
    bits.put(1, 1); // last block
    bits.put(1, 2); // fixed codes
    bits.code(0x30, 8); // literal 0
    for _ in 0..repeats {
        bits.code(0b1100_0101, 8); // length 258
        bits.code(0, 5); // distance 1
    }
    bits.code(0, 7); // end of block
    bits.put(0, 7);
    bits.out.extend_from_slice(&[0; 8]);
    bits.out
}

#[test]
fn a_gzip_bomb_is_refused_as_too_large() {
    // 16 MiB of zeros from 150 KB of base64: within the payload limit.
    let bomb = files::base64_text(&zeros_bomb(65_000));
    assert!(bomb.len() < DEFAULT_MAX_BOOTSTRAP_DATA_BYTES);
    let data = format!("#cloud-config\nwrite_files:\n- path: /etc/bomb\n  encoding: gz+b64\n  content: {bomb}\n");
    assert_eq!(
        translate(&data),
        Err(TranslateError::TooLarge {
            path: "/etc/bomb".into(),
            limit: DEFAULT_MAX_DECODED_BYTES
        })
    );
    // The limit is on all files together.
    let two = "#cloud-config\nwrite_files:\n- {path: /a, content: '123456'}\n- {path: /b, content: '7890'}\n";
    assert_eq!(
        translate_cloud_config(two, &facts(), 8),
        Err(TranslateError::TooLarge {
            path: "/b".into(),
            limit: 8
        })
    );
}

#[test]
fn errors_never_show_content_or_commands() {
    let secret = "TOPSECRET";
    let failing = [
        format!("#!/bin/sh\n{secret}\n"),
        format!("#cloud-config\nwrite_files: [\n  {secret}"),
        format!("#cloud-config\n{secret}: [\n"),
        format!("#cloud-config\n{secret}: 1\n"),
        format!("## template: jinja\n#cloud-config\nruncmd: ['{{{{ {secret} }}}}']\n"),
        format!("## template: jinja\n#cloud-config\nruncmd: ['{{{{ \"{secret}\" }}}}']\n"),
        format!("#cloud-config\nwrite_files:\n- {{path: /a, encoding: b64, content: {secret}x}}\n"),
        format!("#cloud-config\nwrite_files:\n- {{path: /a, encoding: gz+b64, content: {secret}A}}\n"),
        format!("#cloud-config\nwrite_files:\n- {{path: /a, permissions: '{secret}'}}\n"),
        format!("#cloud-config\nwrite_files:\n- {{content: {secret}}}\n"),
        format!("#cloud-config\nruncmd: [{{a: {secret}}}]\n"),
        format!("#cloud-config\nusers:\n  - {{name: capk, passwd: '{secret}'}}\n"),
        format!("#cloud-config\nbootcmd: ['{secret}']\n"),
    ];
    for data in &failing {
        let e = translate(data).expect_err(data);
        let message = e.to_string();
        assert!(!message.contains(secret), "{data:?}: {message}");
        assert!(!format!("{e:?}").contains(secret), "{data:?}: {e:?}");
    }
}

/// Bootstrap data is a tenant's: a few KiB of YAML aliases must not expand into tens of MiB
/// held by a reconcile. Each of these is refused as too large.
#[test]
fn yaml_that_expands_beyond_a_cloud_config_is_refused() {
    let big = "x".repeat(4096);
    let anchored = |lines: usize, aliases: usize| {
        format!(
            "#cloud-config\nruncmd:\n  - &a\n{}{}",
            format!("    - '{big}'\n").repeat(lines),
            "  - *a\n".repeat(aliases)
        )
    };
    let mut laughs = String::from("#cloud-config\nx0: &l0 [a, a, a, a, a, a, a, a, a]\n");
    for i in 1..8 {
        let prev = format!("*l{}", i - 1);
        laughs.push_str(&format!("x{i}: &l{i} [{}]\n", [prev.as_str(); 9].join(", ")));
    }
    laughs.push_str("runcmd: *l7\n");
    let cases = [
        ("one anchor of 400 KiB repeated 200 times (80 MiB)", anchored(100, 200)),
        ("one anchor of 400 KiB repeated 40 times (16 MiB)", anchored(100, 40)),
        ("a 4 KiB string repeated 5000 times (20 MiB)", anchored(1, 5000)),
        ("nested aliases (9^8 nodes)", laughs),
    ];
    for (name, data) in cases {
        assert_eq!(translate(&data), Err(TranslateError::YamlTooLarge), "{name}");
    }
    // A few aliases, as a hand-written cloud-config may have, still read.
    let few = "#cloud-config\nruncmd: [&c 'echo hi', *c, *c]\n";
    assert!(translate(few).is_ok(), "{:?}", translate(few));
}
