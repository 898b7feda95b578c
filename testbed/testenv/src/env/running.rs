//! What a test does with a running environment: namespaces, applied YAML, the processes it
//! starts in it (capkr-manager, kairon-sim), what is printed on a failure, and the teardown.

use super::*;

impl Env {
    pub async fn create_namespace(&self, name: &str) -> Result<Namespace> {
        let api: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))
    }

    /// Server-side applies multi-document YAML (see [`crate::apply_yaml`]).
    pub async fn apply(&self, yaml: &str, default_namespace: Option<&str>) -> Result<Vec<DynamicObject>> {
        // A webhook whose manager is gone refuses every write: name it with the refusal.
        apply_yaml(&self.client(), yaml, default_namespace)
            .await
            .map_err(|e| match self.exited(0) {
                gone if gone.is_empty() => e,
                gone => e.context(format!(
                    "processes of the environment had exited: {}",
                    gone.trim_end().replace('\n', "; ")
                )),
            })
    }

    /// Starts `capkr-manager --kubeconfig <admin> <extra_args>`; logs to `logs/capkr-manager*.log`.
    ///
    /// Unless `extra_args` choose them, the health and metrics endpoints go to free loopback
    /// ports (the defaults, :9440 and :8443, would collide between managers of parallel tests).
    pub fn start_manager<I, S>(&self, extra_args: I) -> Result<Process>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString>,
    {
        let bin = own_binary("capkr-manager", "CAPKR_MANAGER_BIN")?;
        let mut args: Vec<std::ffi::OsString> = extra_args.into_iter().map(Into::into).collect();
        // Tests read /metrics with a plain GET; the secure default has a test of its own
        // (`operability_metrics.rs`), which passes `--insecure-diagnostics=false`.
        if !args
            .iter()
            .any(|a| a.to_str().is_some_and(|a| a.starts_with("--insecure-diagnostics")))
        {
            args.push("--insecure-diagnostics".into());
        }
        for flag in ["--health-addr", "--metrics-bind-address"] {
            let given = args.iter().any(|a| {
                a.to_str()
                    .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
            });
            if !given {
                args.push(format!("{flag}=127.0.0.1:{}", free_port()?).into());
            }
        }
        self.start_own("capkr-manager", bin, args)
    }

    /// Starts `kairon-sim --kubeconfig <admin> <extra_args>`; logs to `logs/kairon-sim*.log`.
    pub fn start_simulator<I, S>(&self, extra_args: I) -> Result<Process>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString>,
    {
        let bin = own_binary("kairon-sim", "KAIRON_SIM_BIN")?;
        self.start_own("kairon-sim", bin, extra_args)
    }

    /// Runs `kairon-sim --kubeconfig <admin> evacuate <node> <args>` (what an operator's
    /// `kaironctl evacuate` does) to its end; its standard output, or why it failed.
    pub async fn kairon_evacuate(&self, node: &str, args: &[&str]) -> Result<String> {
        let bin = own_binary("kairon-sim", "KAIRON_SIM_BIN")?;
        let out = tokio::process::Command::new(bin)
            .arg("--kubeconfig")
            .arg(self.kubeconfig_path())
            .arg("evacuate")
            .arg(node)
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .context("running kairon-sim evacuate")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "kairon-sim evacuate {node} {args:?}: {}\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }

    fn start_own<I, S>(&self, base: &str, bin: PathBuf, extra_args: I) -> Result<Process>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString>,
    {
        let mut name = base.to_string();
        let logs = self.log_dir();
        let mut n = 1;
        while logs.join(format!("{name}.log")).exists() {
            n += 1;
            name = format!("{base}-{n}");
        }
        let extra: Vec<std::ffi::OsString> = extra_args.into_iter().map(Into::into).collect();
        // The admin kubeconfig unless the caller gives one (e.g. a fault proxy's).
        let own_kubeconfig = extra.iter().any(|a| {
            a.to_str()
                .is_some_and(|a| a == "--kubeconfig" || a.starts_with("--kubeconfig="))
        });
        let mut spec = ProcessSpec::new(name, bin, &logs)
            // Plain log files, no ANSI colours (tracing-subscriber honours NO_COLOR).
            .env("NO_COLOR", "1");
        if !own_kubeconfig {
            spec = spec.arg(format!("--kubeconfig={}", self.kubeconfig_path.display()));
        }
        let spec = spec.args(extra);
        Process::spawn(spec)
    }

    /// Prints the last lines of every process log and the CAPI/Kairon objects (see `dump.rs`).
    pub fn dump(&self) {
        let workloads = self.workloads.lock().unwrap_or_else(|e| e.into_inner()).clone();
        crate::dump::dump(&crate::dump::Subject {
            name: self.name.clone(),
            dir: self.dir.clone(),
            log_dir: self.log_dir(),
            kubectl: self.bins.kubectl.clone(),
            kubeconfig: self.kubeconfig_path.clone(),
            workloads: workloads
                .into_iter()
                .map(|w| (format!("{}/{}", w.namespace, w.name), w.kubeconfig_path))
                .collect(),
            exited: self.exited(0),
        });
    }

    pub(crate) fn dump_logs(&self, lines: usize) {
        crate::dump::dump_logs(&self.name, &self.log_dir(), lines);
    }

    /// Stops every process: API servers and managers first (kube-apiserver hangs on SIGTERM
    /// once etcd is gone), then etcd.
    fn stop_processes(&self) {
        let procs: Vec<Process> = std::mem::take(&mut *self.procs.lock().unwrap_or_else(|e| e.into_inner()));
        stop_all(&procs.iter().collect::<Vec<_>>(), Duration::from_secs(3));
        drop(procs);
        if let Some(etcd) = self.etcd.lock().unwrap_or_else(|e| e.into_inner()).take() {
            etcd.stop(Duration::from_secs(3));
        }
    }

    /// Stops everything and removes the temp dir (unless `CAPKR_TEST_KEEP`) of an environment
    /// that is never dropped ([`Env::shared`]).
    pub(crate) fn close(&self) {
        self.stop_processes();
        if keep_requested() {
            let _ = std::fs::remove_file(self.dir.join(OWNER_FILE));
            eprintln!(
                "capkr-testenv[{}]: CAPKR_TEST_KEEP is set, kept {}",
                self.name,
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Stops everything now (also done on drop).
    pub fn shutdown(&mut self) {
        self.stop_processes();
        if let Some(mut dir) = self.tempdir.take() {
            if keep_requested() {
                // A kept dir is the user's: never swept.
                let _ = std::fs::remove_file(self.dir.join(OWNER_FILE));
            }
            match dir.close() {
                Ok(Some(kept)) => eprintln!(
                    "capkr-testenv[{}]: CAPKR_TEST_KEEP is set, kept {}",
                    self.name,
                    kept.display()
                ),
                Ok(None) => {}
                Err(e) => eprintln!("capkr-testenv[{}]: {e:#}", self.name),
            }
        }
    }
}
