//! The bootstrap configs already found to be a MachinePool's: every member of a pool boots from
//! the same Secret, made by the same config, so the config's metadata is read once per pool
//! (and per Secret), not once per member. In memory; bounded (forgotten all at once past
//! [`MAX_CHECKED`], read again as needed).

use std::collections::HashSet;
use std::sync::Mutex;

/// How many checks are kept before all are forgotten.
const MAX_CHECKED: usize = 4096;

/// A check that passed: this Secret was made by this config, which this MachinePool controls
/// (all by UID).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct CheckedKey {
    pub secret: String,
    pub config: String,
    pub owner: String,
}

#[derive(Debug, Default)]
pub struct CheckedConfigs(Mutex<HashSet<CheckedKey>>);

impl CheckedConfigs {
    pub fn contains(&self, key: &CheckedKey) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains(key)
    }

    pub fn insert(&self, key: CheckedKey) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= MAX_CHECKED {
            all.clear();
        }
        all.insert(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> CheckedKey {
        CheckedKey {
            secret: format!("s{n}"),
            config: "c".into(),
            owner: "o".into(),
        }
    }

    #[test]
    fn a_check_is_kept_until_too_many_are() {
        let c = CheckedConfigs::default();
        assert!(!c.contains(&key(0)));
        c.insert(key(0));
        assert!(c.contains(&key(0)));
        for n in 1..MAX_CHECKED {
            c.insert(key(n));
        }
        assert!(c.contains(&key(0)), "still there at the bound");
        c.insert(key(MAX_CHECKED));
        assert!(
            !c.contains(&key(0)) && c.contains(&key(MAX_CHECKED)),
            "forgotten past it"
        );
    }
}
