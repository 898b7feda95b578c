//! Without the upstream binaries the environment must fail with a message that says how to
//! get them: integration tests fail, they never skip. (Own test binary: it sets env vars.)

use capkr_testenv::{Env, EnvOptions};

#[tokio::test]
async fn missing_binaries_fail_with_instructions() {
    // SAFETY: the only test in this binary; nothing else reads the environment concurrently.
    unsafe {
        std::env::set_var("CAPKR_TEST_BIN", "/nonexistent/capkr-test-bin");
        std::env::set_var("CAPKR_MANAGER_BIN", "/nonexistent/capkr-manager");
    }
    let err = match Env::start(EnvOptions::new("missing")).await {
        Ok(_) => panic!("an Env started without binaries"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("make test-tools"), "{err}");
    assert!(err.contains("CAPKR_TEST_BIN"), "{err}");
    let err = capkr_testenv::own_binary("capkr-manager", "CAPKR_MANAGER_BIN")
        .unwrap_err()
        .to_string();
    assert!(err.contains("CAPKR_MANAGER_BIN"), "{err}");
    unsafe {
        std::env::remove_var("CAPKR_MANAGER_BIN");
        std::env::set_var("CARGO_TARGET_DIR", "/nonexistent/target");
    }
    let err = capkr_testenv::own_binary("capkr-manager", "CAPKR_MANAGER_BIN")
        .unwrap_err()
        .to_string();
    assert!(err.contains("cargo build --workspace --bins"), "{err}");
}
