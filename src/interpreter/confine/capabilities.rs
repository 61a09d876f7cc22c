//! Capabilities (capabilities(7)): a worker keeps none. Dropped while the worker has one thread
//! (capability sets are per thread; threads created later inherit the caller's), before the
//! engine starts.
//!
//! In a user namespace of its own the worker's capabilities reach nothing of the host's
//! anyway; this matters where user namespaces are refused and the server runs as root: the
//! worker would otherwise hold `CAP_SYS_ADMIN`, `CAP_DAC_OVERRIDE`, `CAP_KILL` … on the host.

use super::{ConfineError, Layer};
use caps::CapSet;

/// Empties the ambient, inheritable, bounding, effective and permitted sets, in that order
/// (the bounding set can be lowered only while `CAP_SETPCAP` is still effective).
///
/// Errors: a set that cannot be emptied, other than the bounding set, which a process without
/// `CAP_SETPCAP` cannot lower (harmless then: its permitted set is empty and
/// `PR_SET_NO_NEW_PRIVS` stops `execve` from granting any).
pub fn drop_all() -> Result<Layer, ConfineError> {
    let clear = |set: CapSet, what: &'static str| {
        caps::clear(None, set).map_err(|e| ConfineError::Capabilities { what, source: e })
    };
    clear(CapSet::Ambient, "ambient")?;
    clear(CapSet::Inheritable, "inheritable")?;
    let bounding = clear(CapSet::Bounding, "bounding");
    clear(CapSet::Effective, "effective")?;
    clear(CapSet::Permitted, "permitted")?;
    Ok(Layer::On(match bounding {
        Ok(()) => "none, bounding set empty".to_owned(),
        Err(_) => "none; bounding set kept: no CAP_SETPCAP to lower it".to_owned(),
    }))
}
