//! The one hash of the manager: for deciding whether two things are the same (watch triggers,
//! event repeats), never for storage or security.

use std::hash::{DefaultHasher, Hash, Hasher};

/// A hash of `v`, stable within one process.
pub(crate) fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}
