//! Temp dirs of tests and test environments, and `CAPKR_TEST_KEEP`, which keeps them for a
//! look after the test.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Whether `CAPKR_TEST_KEEP` asks to keep temp dirs: set to anything but empty, `0` or `false`.
pub fn keep_requested() -> bool {
    keeps(std::env::var("CAPKR_TEST_KEEP").ok().as_deref())
}

fn keeps(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A fresh directory under the system temp dir (`tempfile`), removed on drop unless
/// [`keep_requested`].
#[derive(Debug)]
pub struct ScratchDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl ScratchDir {
    /// A new directory named `<prefix><random>`.
    pub fn new(prefix: &str) -> Result<ScratchDir> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .with_context(|| format!("creating a temp dir {prefix}*"))?;
        Ok(ScratchDir {
            path: dir.path().to_path_buf(),
            dir: Some(dir),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory now, or keeps it if [`keep_requested`]; `Some(path)` when kept.
    /// Dropping does the same.
    pub fn close(&mut self) -> Result<Option<PathBuf>> {
        let Some(dir) = self.dir.take() else {
            return Ok(None);
        };
        if keep_requested() {
            return Ok(Some(dir.keep()));
        }
        dir.close()
            .with_context(|| format!("removing {}", self.path.display()))?;
        Ok(None)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        match self.close() {
            Ok(Some(kept)) => eprintln!("CAPKR_TEST_KEEP is set: kept {}", kept.display()),
            Ok(None) => {}
            Err(e) => eprintln!("{e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capkr_test_keep_is_off_when_unset_empty_zero_or_false() {
        for (value, keep) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("1"), true),
            (Some("true"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(keeps(value), keep, "CAPKR_TEST_KEEP={value:?}");
        }
    }

    #[test]
    fn scratch_dir_is_removed_on_drop_unless_kept() {
        let dir = ScratchDir::new("capkr-scratch-test-").unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("file"), "x").unwrap();
        assert!(path.is_dir());
        drop(dir);
        assert_eq!(path.exists(), keep_requested(), "{}", path.display());
    }
}
