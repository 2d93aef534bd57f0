//! What a cluster refuses before any round trip: keys across hash slots (unless allowed),
//! and fencing counters that would not share their key's slot.

use crate::backend::fence::fence_key;
use crate::backend::slot::{by_slot, slot};
use crate::{Error, Result};

/// On a cluster: the keys must share a hash slot unless `across_slots`, and with
/// `fencing` each counter (`prefix` + its name) must share its key's slot.
pub(crate) fn check_slots(
    keys: &[String],
    names: &[String],
    prefix: &str,
    across_slots: bool,
    fencing: bool,
) -> Result<()> {
    let groups = by_slot(keys);
    if groups.len() > 1 && !across_slots {
        let listed: Vec<String> = keys
            .iter()
            .zip(names)
            .map(|(key, name)| format!("{name:?} (slot {})", slot(key)))
            .collect();
        return Err(Error::InvalidInput(format!(
            "keys in different cluster hash slots: {}; one atomic lock needs one slot: give \
             the keys a common hash tag (like {{order42}}:a, {{order42}}:b), or allow \
             LockOptions::across_slots",
            listed.join(", ")
        )));
    }
    if fencing {
        for (key, name) in keys.iter().zip(names) {
            if slot(&format!("{prefix}{}", fence_key(key))) != slot(key) {
                return Err(Error::InvalidInput(format!(
                    "the fencing counter of {name:?} would be in another hash slot (a key or \
                     prefix with an unmatched brace): use a key with a hash tag"
                )));
            }
        }
    }
    Ok(())
}

/// On a cluster, with `fencing`: a semaphore's counter (`prefix` + its name) must share
/// the slot of the semaphore's key, which is `keys[0]`.
pub(crate) fn check_semaphore_slot(keys: &[String], prefix: &str, fencing: bool) -> Result<()> {
    let Some(key) = keys.first().filter(|_| fencing) else {
        return Ok(());
    };
    if slot(&format!("{prefix}{}", fence_key(key))) != slot(key) {
        return Err(Error::InvalidInput(format!(
            "the fencing counter of semaphore {key:?} would be in another hash slot (a name \
             or prefix with an unmatched brace): use a name with a hash tag"
        )));
    }
    Ok(())
}
