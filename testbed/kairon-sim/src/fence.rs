//! The `fence` subcommand: what `kaironctl fence MACHINE --reason …` does
//! (`internal/kaironctl/fence.go`): once an operator has confirmed out of band that a Machine's
//! node is gone, the Machine is unbound from it and its runtime's status cleared, with
//! `Fenced=True`; kairon-controller then places it as a new Machine. Refused unless Kairon
//! reports the node unreachable (see [`crate::reachability::fence`]).

use anyhow::{Context, anyhow};
use capkr::kairon::Machine;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use serde_json::json;

use crate::machines::patch_params;
use crate::status_patch::status_patch;

#[derive(clap::Args, Debug)]
pub struct FenceArgs {
    /// The Machine to fence.
    pub machine: String,
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Your out-of-band evidence that the node is truly gone, not just unreachable (required).
    #[arg(long, default_value = "")]
    pub reason: String,
}

pub async fn run(client: kube::Client, args: FenceArgs) -> anyhow::Result<()> {
    let api: Api<Machine> = Api::namespaced(client, &args.namespace);
    let m = api
        .get(&args.machine)
        .await
        .with_context(|| format!("get machine {}/{}", args.namespace, args.machine))?;
    let (patch, status) = crate::reachability::fence(&m, &args.reason, Timestamp::now()).map_err(|e| anyhow!(e))?;
    api.patch(&args.machine, &patch_params(), &Patch::Merge(&patch))
        .await
        .context("clear spec.nodeName")?;
    let changes = status_patch(m.status.as_ref(), &status)?.unwrap_or_else(|| json!({}));
    api.patch_status(
        &args.machine,
        &patch_params(),
        &Patch::Merge(&json!({"status": changes})),
    )
    .await
    .context("clear the runtime's status")?;
    println!(
        "machine/{}: spec.nodeName cleared; Kairon places it anew on its next tick",
        args.machine
    );
    Ok(())
}
