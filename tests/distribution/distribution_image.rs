//! The container image's build, without a Docker engine: the Dockerfile runs
//! hack/release-build.sh, and so does this test; the binary must be statically linked (it
//! runs on distroless/static, which has no libc) and must start. The test builds it with the
//! `static-check` profile, the release profile unoptimized (same flags, target and link): the
//! optimizer cannot change either, and it is about two thirds of the release build's CPU
//! (`docs/development.md`).

use crate::distribution_support;

use std::process::Command;

use distribution_support::*;

const PT_INTERP: u32 = 3;
const PT_DYNAMIC: u32 = 2;
const DT_NEEDED: u64 = 1;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Whether an ELF64 little-endian executable needs a dynamic loader or shared libraries:
/// a PT_INTERP program header, or DT_NEEDED entries in its dynamic section.
fn dynamic_dependencies(elf: &[u8]) -> Vec<String> {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    assert_eq!(elf[4], 2, "ELF64");
    assert_eq!(elf[5], 1, "little endian");
    let phoff = u64_at(elf, 0x20) as usize;
    let phentsize = u16_at(elf, 0x36) as usize;
    let phnum = u16_at(elf, 0x38) as usize;
    let mut found = Vec::new();
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let (typ, offset, filesz) = (
            u32_at(elf, ph),
            u64_at(elf, ph + 8) as usize,
            u64_at(elf, ph + 32) as usize,
        );
        if typ == PT_INTERP {
            found.push(format!(
                "interpreter {}",
                String::from_utf8_lossy(&elf[offset..offset + filesz])
            ));
        }
        if typ == PT_DYNAMIC {
            for e in (offset..offset + filesz).step_by(16) {
                if u64_at(elf, e) == DT_NEEDED {
                    found.push("a DT_NEEDED shared library".into());
                }
            }
        }
    }
    found
}

#[test]
fn release_binary_is_static_and_starts() {
    let out = run_ok(Command::new(root().join("hack/release-build.sh")).env("CAPKR_RELEASE_PROFILE", "static-check"));
    let path = stdout(&out).lines().last().expect("binary path").trim().to_string();
    let elf = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    assert_eq!(
        dynamic_dependencies(&elf),
        Vec::<String>::new(),
        "{path} must be static"
    );

    let help = stdout(&run_ok(Command::new(&path).arg("--help").env_clear()));
    for flag in [
        "--namespace",
        "--watch-filter",
        "--sync-period",
        "--kubeconfig",
        "--log-format",
    ] {
        assert!(help.contains(flag), "{flag} in --help:\n{help}");
    }
    let version = stdout(&run_ok(Command::new(&path).arg("--version").env_clear()));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
}

#[test]
fn dockerfile_builds_with_the_release_script_onto_a_static_nonroot_base() {
    let dockerfile = read(&root().join("Dockerfile"));
    let stages: Vec<&str> = dockerfile.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage: {stages:?}");
    assert!(
        stages[1].contains("distroless/static") && stages[1].contains(":nonroot"),
        "{}",
        stages[1]
    );
    assert!(
        dockerfile.contains("hack/release-build.sh"),
        "the Dockerfile runs the tested build"
    );
    assert!(
        !dockerfile.contains("CAPKR_RELEASE_PROFILE"),
        "the image has the release profile's binary"
    );
    assert!(dockerfile.contains("USER 65532:65532"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/capkr-manager"]"#));
    // The Deployments start it at that path.
    assert!(read(&root().join("config/manager/manager.yaml")).contains("command: [/capkr-manager]"));
}
