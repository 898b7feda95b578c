//! An evacuation always finishes or says why: Machines that will never get a Node hold no turn,
//! and "a MachineHealthCheck selects it" is what the MachineHealthChecks say now, not the
//! condition one left behind on the Machine.

use super::tests::{Case, M, case, check};
use super::*;

#[test]
fn peers_that_never_get_a_node_and_checks_that_are_gone_hold_nothing() {
    let mhc = M {
        mhc: true,
        ..M::default()
    };
    let never = M {
        no_node: true,
        old: true,
        ..mhc
    };
    check([
        case(
            "a worker marked while a MachineHealthCheck selected it, gone since, is deleted",
            M {
                marked: true,
                ours: true,
                stale: true,
                ..M::default()
            },
            Act::Delete,
            Some((Status::True, reason::REPLACEMENT_REQUESTED, "is deleted")),
        ),
        case(
            "a control plane whose MachineHealthCheck is gone (its condition left behind) says so",
            M {
                cp: true,
                stale: true,
                ..M::default()
            },
            Act::Nothing,
            Some((
                Status::True,
                reason::NO_MACHINE_HEALTH_CHECK,
                "create a MachineHealthCheck",
            )),
        ),
        case(
            "a worker whose MachineHealthCheck is gone is deleted, not marked",
            M {
                stale: true,
                ..M::default()
            },
            Act::Delete,
            Some((Status::True, reason::REPLACEMENT_REQUESTED, "is deleted")),
        ),
        Case {
            others: vec![(
                "a-failed",
                M {
                    failed: true,
                    no_node: true,
                    ..mhc
                },
                false,
            )],
            ..case(
                "a Machine that failed before its Node holds no turn",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            others: vec![("a-never", never, false)],
            ..case(
                "a Machine without a Node for longer than a Node takes holds no turn",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            others: vec![(
                "a-gone",
                M {
                    deleting: true,
                    no_node: true,
                    ..mhc
                },
                false,
            )],
            ..case(
                "a Machine deleted before it had a Node holds no turn",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            others: vec![(
                "a-marked",
                M {
                    marked: true,
                    stale: true,
                    ..M::default()
                },
                false,
            )],
            ..case(
                "a Machine marked with no MachineHealthCheck to act on it holds no turn",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            short: Some(("its workers have 1 of 2 Machines available (2 in all)", 1)),
            others: vec![("a-never", never, false)],
            ..case(
                "a shortfall the Machines that never get a Node explain holds no turn",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            short: Some(("its workers have 1 of 3 Machines available (2 in all)", 2)),
            others: vec![("a-never", never, false)],
            ..case(
                "a shortfall beyond them still waits for the replacement",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "1 of 3")),
            )
        },
    ]);
}
