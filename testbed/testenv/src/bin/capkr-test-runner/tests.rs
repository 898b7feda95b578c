//! The runner's own tests: parsing, the split into jobs, the reports, the module map.

use super::*;

#[test]
#[expect(clippy::zombie_processes, reason = "reap() waits for both, with wait4")]
fn a_jobs_cpu_time_counts_the_descendants_it_waited_for() {
    // A shell that waits for a shell that burns CPU: the grandchild's time is the job's.
    let child = Command::new("sh")
        .args([
            "-c",
            "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; exit 3",
        ])
        .spawn()
        .unwrap();
    let (status, cpu) = loop {
        if let Some(done) = reap(&child, false).unwrap() {
            break done;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3));
    assert!(cpu >= Duration::from_millis(50), "{cpu:?}");
    let quick = Command::new("true").spawn().unwrap();
    let (status, cpu) = reap(&quick, true).unwrap().expect("a blocking reap returns");
    assert!(status.success());
    assert!(cpu < Duration::from_millis(50), "{cpu:?}");
}

#[test]
fn the_tally_counts_environments_and_every_api_server() {
    let mut t = Tally::default();
    t.add("full-environment\napi-server\napi-server\n");
    t.add("api-server-environment\nfull-environment\nsomething else\nguest-api-server\n");
    assert_eq!(
        t,
        Tally {
            full: 2,
            api_server_only: 1,
            api_servers: 6,
            guest_api_servers: 1
        }
    );
}

#[test]
fn libtest_lines_and_counts_are_read_from_a_log() {
    let log = "\nrunning 3 tests\nsome output of a test\ntest a ... ok\n\
               [rig] test b is starting\ntest b ... FAILED\ntest c ... ignored\n\n\
               test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; \
               finished in 12.01s\n";
    let (lines, counts) = libtest_report(log);
    assert_eq!(
        lines,
        [
            "running 3 tests",
            "test a ... ok",
            "test b ... FAILED",
            "test c ... ignored",
            "test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 12.01s",
        ]
    );
    assert_eq!(
        counts,
        Some(Counts {
            passed: 1,
            failed: 1,
            ignored: 1
        })
    );
    assert_eq!(libtest_report("no harness here\n").1, None);
}

#[test]
fn the_digest_names_each_failed_test_with_the_start_of_its_message() {
    let log = "running 2 tests\n\
        thread 'a::first' (101) panicked at tests/e2e/a.rs:10:5:\n\
        the first went wrong\n\
        \n\
        with a second line\n\
        stack backtrace:\n   0: frame\n\
        thread 'b::second' (102) panicked at tests/e2e/b.rs:20:9:\n\
        assertion `left == right` failed\n  left: 1\n right: 2\n  more\n  and more\n\
        note: run with `RUST_BACKTRACE=1`\n\
        test result: FAILED. 0 passed; 2 failed\n";
    assert_eq!(
        failure_digest("main::test::e2e::x", log, 3),
        [
            "main::test::e2e::x: a::first (at tests/e2e/a.rs:10:5)",
            "    the first went wrong",
            "    with a second line",
            "main::test::e2e::x: b::second (at tests/e2e/b.rs:20:9)",
            "    assertion `left == right` failed",
            "      left: 1",
            "     right: 2",
        ]
    );
    // A job that failed without a panic (killed, or no harness) is still named.
    assert_eq!(
        failure_digest("j", "error: could not compile\n", 3),
        ["j: no test panicked (its log's end says why)"]
    );
}

#[test]
fn full_environments_are_told_by_binary_most_first() {
    let dir = std::env::temp_dir().join(format!("capkr-tally-test-{}", std::process::id()));
    for (binary, pid, text) in [
        ("main-test-a", 1, "full-environment\n"),
        ("main-test-b", 2, "full-environment\napi-server\n"),
        ("main-test-b", 3, "full-environment\n"),
        ("main-test-c", 4, "api-server-environment\n"),
    ] {
        std::fs::create_dir_all(dir.join(binary)).unwrap();
        std::fs::write(dir.join(binary).join(pid.to_string()), text).unwrap();
    }
    let by_binary = Tally::by_binary(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        Tally::full_by_binary(&by_binary),
        "full environments by binary: main-test-b 2, main-test-a 1"
    );
    assert_eq!(by_binary.iter().map(|(_, t)| t.api_servers).sum::<usize>(), 5);
}

fn binary(target: &str) -> Binary {
    Binary {
        name: format!("main::test::{target}"),
        target: target.into(),
        executable: PathBuf::from("/bin/false"),
        cwd: PathBuf::new(),
    }
}

#[test]
fn a_binary_is_split_into_its_own_modules_and_the_rest() {
    let list = "smoke::a_cluster_comes_up: test\ne2e_move::moves: test\ne2e_move::moves_back: test\n\
                maintenance::drains: test\ne2e_maintenance::hosts::cordons: test\n\n5 tests, 0 benchmarks\n";
    let tests = test_names(list);
    assert_eq!(tests.len(), 5);
    let jobs = split(&binary("e2e"), &["e2e_move", "e2e_maintenance"], &tests).unwrap();
    let shown: Vec<(&str, &str, Vec<&str>)> = jobs
        .iter()
        .map(|j| {
            (
                j.name.as_str(),
                j.key.as_str(),
                j.tests.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (
                "main::test::e2e::e2e_move",
                "e2e_move",
                vec!["e2e_move::moves", "e2e_move::moves_back"]
            ),
            (
                "main::test::e2e::e2e_maintenance",
                "e2e_maintenance",
                vec!["e2e_maintenance::hosts::cordons"]
            ),
            (
                "main::test::e2e",
                "e2e",
                vec!["smoke::a_cluster_comes_up", "maintenance::drains"]
            ),
        ]
    );
    // Every test is in exactly one job.
    assert_eq!(jobs.iter().map(|j| j.tests.len()).sum::<usize>(), tests.len());
    // A module named to run on its own but without tests is an error, not a silent no-op.
    let err = split(&binary("e2e"), &["e2e_gone"], &tests).unwrap_err();
    assert!(err.to_string().contains("no test in a module e2e_gone"), "{err}");
    // Nothing left: no job for the binary itself.
    let only = split(
        &binary("e2e"),
        &["smoke", "e2e_move", "maintenance", "e2e_maintenance"],
        &tests,
    )
    .unwrap();
    assert!(only.iter().all(|j| j.key != "e2e"));
}

#[test]
fn own_modules_must_name_a_built_binary() {
    let err = jobs(&[binary("e2e")], &[("e2e_move".into(), "x".into())]).unwrap_err();
    assert!(err.to_string().contains("no test binary e2e_move"), "{err}");
}

/// `tests/README.md`'s module map is true by construction: a row per module of the three
/// test binaries, a module per row, and each row's job as the Makefile's `TEST_OWN` makes it.
#[test]
fn the_module_map_has_a_row_per_module_and_the_makefiles_jobs() {
    let root = capkr_testenv::workspace_root();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let makefile = read("Makefile");
    let own = makefile_own(&makefile);
    assert!(
        own.contains(&("e2e".into(), "e2e_move".into())),
        "TEST_OWN read: {own:?}"
    );
    let mut modules = std::collections::BTreeMap::new();
    for binary in ["mock", "e2e", "distribution"] {
        for line in read(&format!("tests/{binary}/main.rs")).lines() {
            if let Some(m) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) {
                let job = if own.contains(&(binary.to_string(), m.to_string())) {
                    m
                } else {
                    binary
                };
                modules.insert(format!("{binary}/{m}"), job.to_string());
            }
        }
    }
    assert!(modules.len() > 40, "modules read: {modules:?}");
    let readme = read("tests/README.md");
    let rows: std::collections::BTreeMap<String, String> = readme
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let module = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let job = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            module.contains('/').then(|| (module.to_string(), job.to_string()))
        })
        .collect();
    assert_eq!(
        rows, modules,
        "tests/README.md's module map (left) against the modules and TEST_OWN (right)"
    );
}

/// The Makefile's `TEST_OWN` as `(binary, module)` pairs: `$(addprefix BINARY/,MODULES)`
/// groups and plain `BINARY/MODULE` words, over continuation lines.
fn makefile_own(makefile: &str) -> Vec<(String, String)> {
    let start = makefile.find("TEST_OWN := ").expect("TEST_OWN in the Makefile");
    let mut text = String::new();
    for line in makefile[start + "TEST_OWN := ".len()..].lines() {
        text.push_str(line.trim_end_matches('\\'));
        text.push(' ');
        if !line.ends_with('\\') {
            break;
        }
    }
    let mut own = vec![];
    let mut rest = text.as_str();
    while let Some(i) = rest.find("$(addprefix ") {
        for word in rest[..i].split_whitespace() {
            own.extend(word.split_once('/').map(|(b, m)| (b.to_string(), m.to_string())));
        }
        let group = &rest[i + "$(addprefix ".len()..];
        let end = group.find(')').expect("a closing parenthesis");
        let (prefix, modules) = group[..end].split_once(',').expect("$(addprefix P,WORDS)");
        let binary = prefix.trim().trim_end_matches('/');
        own.extend(modules.split_whitespace().map(|m| (binary.to_string(), m.to_string())));
        rest = &group[end + 1..];
    }
    for word in rest.split_whitespace() {
        own.extend(word.split_once('/').map(|(b, m)| (b.to_string(), m.to_string())));
    }
    own
}
