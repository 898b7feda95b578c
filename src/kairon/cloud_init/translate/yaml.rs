//! How far the YAML parser may go on bootstrap data, which a tenant writes: bounds on aliases,
//! nodes and the text aliases repeat, and telling a parse stopped at them from a bad document.

/// At most this many aliases (`*name`) in bootstrap data: CAPI's bootstrap providers write
/// none, and each repeats what its anchor holds.
pub const MAX_YAML_ALIASES: usize = 1_000;
/// At most this many YAML nodes, aliases expanded: a cloud-config of the largest bootstrap data
/// allowed has a few thousand.
pub const MAX_YAML_NODES: usize = 100_000;
/// At most this many bytes of text, counted each time an alias repeats it (or twice the
/// bootstrap data's size, if that is more: `--max-bootstrap-data-bytes` may be raised).
pub const MAX_YAML_EXPANDED_BYTES: usize = 4 * 1024 * 1024;

/// How far the YAML parser may go on bootstrap data, which a tenant writes: its defaults let a
/// few KiB of aliases expand to tens of MiB held by one reconcile (a "billion laughs").
pub(super) fn yaml_options(input_bytes: usize) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_aliases = MAX_YAML_ALIASES;
    budget.max_anchors = MAX_YAML_ALIASES;
    budget.max_nodes = MAX_YAML_NODES;
    budget.max_events = 2 * MAX_YAML_NODES;
    budget.max_recorded_anchor_events = MAX_YAML_NODES;
    budget.max_recorded_anchor_bytes = MAX_YAML_EXPANDED_BYTES.max(2 * input_bytes);
    budget.max_total_scalar_bytes = MAX_YAML_EXPANDED_BYTES.max(2 * input_bytes);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Whether the parser stopped at [`yaml_options`]' bounds (the error itself, or wrapped with
/// where it happened).
pub(super) fn over_budget(mut e: &serde_saphyr::Error) -> bool {
    use serde_saphyr::Error as E;
    while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = e {
        e = error;
    }
    matches!(
        e,
        E::Budget { .. }
            | E::AliasReplayLimitExceeded { .. }
            | E::AliasExpansionLimitExceeded { .. }
            | E::AliasReplayStackDepthExceeded { .. }
            | E::AliasReplayCounterOverflow { .. }
    )
}
