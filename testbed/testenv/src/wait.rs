//! Polling with a deadline and a message that says what was awaited and what was last seen.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// What a polled closure may return: `bool`, `Option<T>`, `Result<bool, E>` or
/// `Result<Option<T>, E>`. Errors are retried; the last one is reported on timeout.
pub trait Outcome<T> {
    /// `Ok(Some(v))` done, `Ok(None)` not yet, `Err(msg)` not yet, with a reason.
    fn into_outcome(self) -> std::result::Result<Option<T>, String>;
}

impl Outcome<()> for bool {
    fn into_outcome(self) -> std::result::Result<Option<()>, String> {
        Ok(self.then_some(()))
    }
}

impl<T> Outcome<T> for Option<T> {
    fn into_outcome(self) -> std::result::Result<Option<T>, String> {
        Ok(self)
    }
}

impl<E: Into<anyhow::Error>> Outcome<()> for std::result::Result<bool, E> {
    fn into_outcome(self) -> std::result::Result<Option<()>, String> {
        match self {
            Ok(b) => Ok(b.then_some(())),
            Err(e) => Err(format!("{:#}", e.into())),
        }
    }
}

impl<T, E: Into<anyhow::Error>> Outcome<T> for std::result::Result<Option<T>, E> {
    fn into_outcome(self) -> std::result::Result<Option<T>, String> {
        self.map_err(|e| format!("{:#}", e.into()))
    }
}

/// Polls `check` every 200 ms until it yields a value or `timeout` passes.
///
/// ```text
/// let node = wait_for("the Node of machine m1", Duration::from_secs(30), || async {
///     Ok::<_, kube::Error>(nodes.get_opt("m1").await?)
/// }).await?;
/// ```
pub async fn wait_for<T, R, F, Fut>(what: impl Display, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
    R: Outcome<T>,
{
    let start = Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last_error = match check().await.into_outcome() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        if start.elapsed() >= timeout {
            match last_error {
                Some(e) => bail!("timed out after {timeout:?} ({attempts} checks) waiting for {what}; last error: {e}"),
                None => bail!("timed out after {timeout:?} ({attempts} checks) waiting for {what}; it never held"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
