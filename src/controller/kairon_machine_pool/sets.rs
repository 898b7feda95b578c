//! A pool's Kairon MachineSets: one per revision, the current one created when missing and the
//! others adopted after a move ([`ensure_sets`]); members over their set's size released for
//! Kairon to remove ([`release_excess`]); release records of gone members forgotten and empty
//! sets of older revisions deleted ([`tidy_sets`]).

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::info;

use super::context::{Context, Scope};
use super::status::waiting;
use crate::api::conditions::{Decided, reason};
use crate::controller::error::Error;
use crate::events::reason as event;
use crate::kairon::machineset::MachineSet;
use crate::kairon::set_desired::{
    SetInputs, desired_machine_set, desired_template, machine_set_provider_id, revision, set_name,
};
use crate::kairon::set_observe::{awaits_start, is_released, set_ownership};
use crate::kairon::{Deletion, Ownership, SetCreated, SetError};
use crate::kairon::{released_members, released_name};

/// The pool's sets: the current revision's and those of older revisions still there.
pub(crate) struct PoolSets {
    pub current: MachineSet,
    /// Older revisions' sets of this pool (not the current one).
    pub older: Vec<MachineSet>,
}

impl PoolSets {
    pub(super) fn all(&self) -> impl Iterator<Item = &MachineSet> {
        std::iter::once(&self.current).chain(self.older.iter())
    }
}

/// The pool's sets, as Kairon has them: the current revision's created if missing, sets of a
/// pool moved here adopted. `Ok(None)`: something was just written, look again.
/// `Err(condition)`: the pool cannot go on.
pub(super) async fn ensure_sets(
    s: &Scope,
    ctx: &Context,
    inputs: &SetInputs<'_>,
) -> Result<Result<Option<PoolSets>, Decided>, Error> {
    let pool = s.pool.as_ref();
    let sets = ctx.sets();
    let pool_id = pool.spec.provider_id.as_deref();
    let current_name = set_name(&s.link.name, &revision(&desired_template(inputs)));
    let mut older = Vec::new();
    let mut current = None;
    let mut adopted = false;
    for set in ctx.sets_of(s) {
        match set_ownership(&set, &s.link, pool_id, ctx.kairon.owner()) {
            Ownership::Ours => {}
            Ownership::OursBeforeMove { .. } => {
                sets.adopt(&set, &s.link.uid, &s.ns).await?;
                ctx.events
                    .normal(
                        pool,
                        event::MACHINE_SET_ADOPTED,
                        "Adopt",
                        format!("Kairon MachineSet {}/{} adopted", s.ns, set.name_any()),
                    )
                    .await;
                adopted = true;
                continue;
            }
            // Labelled with the pool's name but not provably its own: another pool's (of the
            // same name elsewhere) or anyone's. Left alone.
            Ownership::Foreign(_) if set.name_any() != current_name => continue,
            Ownership::Foreign(why) => {
                return Ok(Err(waiting(
                    reason::INSTANCE_CONFLICT,
                    format!("Kairon MachineSet {}/{current_name} is not this pool's: {why}", s.ns),
                )));
            }
        }
        if set.name_any() == current_name {
            current = Some((*set).clone());
        } else {
            older.push((*set).clone());
        }
    }
    if adopted {
        return Ok(Ok(None));
    }
    let current = match current {
        Some(set) => set,
        None => {
            let desired = desired_machine_set(inputs, pool_id, 0);
            let set = match sets.create(desired).await? {
                SetCreated::New(set) => {
                    info!(set = %set.name_any(), "created Kairon MachineSet");
                    let (reason, what) = if older.is_empty() {
                        (event::MACHINE_SET_CREATED, "created")
                    } else {
                        (event::ROLLING_OUT, "created for a new revision: the pool rolls")
                    };
                    ctx.events
                        .normal(
                            pool,
                            reason,
                            "Create",
                            format!("Kairon MachineSet {}/{current_name} {what}", s.ns),
                        )
                        .await;
                    set
                }
                // Not in the cache yet, or someone else's: whose it is decides.
                SetCreated::Existing(set) => match set_ownership(&set, &s.link, pool_id, ctx.kairon.owner()) {
                    Ownership::Foreign(why) => {
                        return Ok(Err(waiting(
                            reason::INSTANCE_CONFLICT,
                            format!("Kairon MachineSet {}/{current_name} is not this pool's: {why}", s.ns),
                        )));
                    }
                    _ => set,
                },
            };
            if pool_id.is_none() {
                record_provider_id(s, ctx, &set).await?;
            }
            return Ok(Ok(None));
        }
    };
    if pool_id.is_none() {
        record_provider_id(s, ctx, &current).await?;
        return Ok(Ok(None));
    }
    Ok(Ok(Some(PoolSets { current, older })))
}

async fn record_provider_id(s: &Scope, ctx: &Context, set: &MachineSet) -> Result<(), Error> {
    let Some(uid) = set.metadata.uid.as_deref() else {
        return Ok(());
    };
    ctx.writer(&s.ns)
        .merge_patch(
            s.pool.as_ref(),
            "spec.providerID",
            json!({"spec": {"providerID": machine_set_provider_id(uid)}}),
        )
        .await
}

/// Releases, in each set with more live members (not deleting, not released) than its
/// `spec.replicas`, as many of the newest never-started members as are over: Kairon then
/// removes those rather than members of its own choice. Returns their names.
pub(super) async fn release_excess(sets: &PoolSets, ctx: &Context) -> Result<Vec<String>, Error> {
    let mut released = Vec::new();
    for set in sets.all() {
        let members = ctx.members_of(set);
        let live: Vec<_> = members
            .iter()
            .filter(|vm| vm.metadata.deletion_timestamp.is_none() && !is_released(vm))
            .collect();
        let over_of = |replicas: i32| live.len().saturating_sub(usize::try_from(replicas.max(0)).unwrap_or(0));
        if over_of(set.spec.replicas) == 0 {
            continue;
        }
        // The caches of sets and of members are two watches: a raise the set's cache does not
        // show yet looks like members over its size. Only the set as the API server has it
        // decides.
        let Some(now) = ctx
            .sets()
            .get(&set.namespace().unwrap_or_default(), &set.name_any())
            .await?
        else {
            continue;
        };
        let over = over_of(now.spec.replicas);
        if over == 0 {
            continue;
        }
        let mut unstarted: Vec<_> = live.into_iter().filter(|vm| awaits_start(vm)).collect();
        unstarted.sort_by_key(|vm| std::cmp::Reverse((vm.creation_timestamp(), vm.name_any())));
        for vm in unstarted.into_iter().take(over) {
            ctx.kairon.mark_released(vm).await?;
            info!(instance = %vm.name_any(), set = %set.name_any(), "released a member over its set's size");
            released.push(vm.name_any());
        }
    }
    Ok(released)
}

/// Forgets the release records of members that are gone with their KaironMachines (while a
/// KaironMachine is still being deleted, its record says its set was lowered for it: its
/// release, which may find the member already deleted by Kairon, must not lower it twice), and
/// deletes sets of older revisions that have nothing left (no replicas, no member): Kairon's
/// set finalizer would delete any member still there, undrained.
pub(super) async fn tidy_sets(s: &Scope, sets: &PoolSets, ctx: &Context) -> Result<bool, Error> {
    let mut busy = false;
    for set in sets.all() {
        let members = ctx.members_of(set);
        let gone: Vec<String> = released_members(set)
            .into_iter()
            .filter(|uid| {
                !members
                    .iter()
                    .any(|vm| vm.metadata.uid.as_deref() == Some(uid.as_str()))
                    && released_name(set, uid)
                        .is_none_or(|name| ctx.kaironmachines.get(&ObjectRef::new(name).within(&s.ns)).is_none())
            })
            .collect();
        if !gone.is_empty() {
            match ctx.sets().forget_releases(set, &gone).await {
                Ok(()) | Err(SetError::Stale { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            busy = true;
        }
    }
    for set in &sets.older {
        if set.spec.replicas > 0 || !ctx.members_of(set).is_empty() || set.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // Read again from the API server: the cache may not show a member Kairon just made.
        let Some(fresh) = ctx.sets().get(&s.ns, &set.name_any()).await? else {
            continue;
        };
        if fresh.spec.replicas > 0 || fresh.status.as_ref().and_then(|st| st.replicas).unwrap_or(0) > 0 {
            continue;
        }
        if ctx.sets().delete(&fresh).await? == Deletion::Started {
            info!(set = %fresh.name_any(), "deleted the empty Kairon MachineSet of an older revision");
            ctx.events
                .normal(
                    s.pool.as_ref(),
                    event::MACHINE_SET_DELETED,
                    "Delete",
                    format!(
                        "Kairon MachineSet {}/{} of an older revision deleted: it is empty",
                        s.ns,
                        fresh.name_any()
                    ),
                )
                .await;
        }
        busy = true;
    }
    Ok(busy)
}
