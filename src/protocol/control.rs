//! The control socket: how a front, a zygote, the per-host zygote service and an operator
//! speak to each other. A message is one JSON datagram of a `SOCK_SEQPACKET` UNIX socket
//! (message boundaries are kept), its descriptors attached as `SCM_RIGHTS`.
//!
//! - zygote → front, once: [`Control::Forkable`], when the zygote has one thread and may fork;
//! - front → zygote: [`Control::Fork`] with the new worker's stdin, stdout and stderr, or
//!   [`Control::ForkInto`] with its scratch folder as well (a scientific zygote's);
//! - zygote → front: [`Control::Forked`] with the child's pidfd, by which the front kills it and
//!   sees it end (the zygote reaps it), or [`Control::ForkFailed`];
//! - the service's own messages: [`Control::Hello`], [`Control::Serving`], and an operator's
//!   [`Control::Status`] and [`Control::Stop`].
//!
//! The zygote's side is `src/interpreter/fork_server.rs`; the front's, `src/worker/zygote_client.rs`;
//! the service's, `src/worker/zygote_service/`.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A message on a zygote's control socket (`fork_server.rs`, `zygote_client.rs`) or on the socket of
/// the per-host zygote service (`zygote_service/`): one JSON datagram of a `SOCK_SEQPACKET`
/// socket, its descriptors attached as `SCM_RIGHTS`, as many as [`Control::descriptors`] says.
/// The service relays `Fork`, `Forked` and `ForkFailed` between a front and its zygote
/// unchanged, so that a front forks the same way from either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    /// Zygote → front, once: the zygote is single-threaded and serves fork requests.
    Forkable,
    /// Front → zygote (or service): fork one worker, whose stdin, stdout and stderr are attached.
    Fork,
    /// Front → a scientific zygote: fork one worker, whose stdin, stdout, stderr and scratch
    /// folder (an open directory, its guest's `/` in place of the zygote's) are attached.
    ForkInto,
    /// Zygote → front: the child's process id, its pidfd attached (the front kills it and
    /// sees it end by it; the zygote reaps it).
    Forked { pid: u32 },
    /// Zygote → front: the fork failed, and why.
    ForkFailed { reason: String },
    /// Service → front or operator, first on every connection: which service this is (the
    /// digest of what shapes its interpreters, `zygote_service::ServiceKey`) and its pid.
    Hello { digest: String, pid: u32 },
    /// Service → front, once its zygote is forkable: the packages every fork has (`--deps`,
    /// normalized name → version).
    Serving {
        installed: std::collections::BTreeMap<String, String>,
    },
    /// Operator → service: how it stands.
    Status,
    /// Service → operator: the answer to [`Control::Status`].
    StatusReport(ServiceStatus),
    /// Operator → service: end now (its zygote and every worker forked from it with it).
    Stop,
    /// Service → operator: the answer to [`Control::Stop`], sent before it ends.
    Stopping,
}

/// How a zygote service stands ([`Control::StatusReport`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceStatus {
    /// Whether its zygote forks (else it still warms up).
    pub ready: bool,
    /// Fronts connected (the asking connection not counted).
    pub fronts: usize,
    /// Workers forked for those fronts that still run.
    pub workers: usize,
    /// Seconds since the service started.
    pub uptime_s: u64,
    /// Seconds without a front after which it exits (`--zygote-idle-exit`).
    pub idle_exit_s: u64,
}

impl Control {
    /// How many descriptors the message carries.
    pub fn descriptors(&self) -> usize {
        match self {
            Control::Fork => 3,
            Control::ForkInto => 4,
            Control::Forked { .. } => 1,
            Control::Forkable
            | Control::ForkFailed { .. }
            | Control::Hello { .. }
            | Control::Serving { .. }
            | Control::Status
            | Control::StatusReport(_)
            | Control::Stop
            | Control::Stopping => 0,
        }
    }
}

/// Most descriptors one control message carries (a fork request's stdin, stdout, stderr and
/// scratch folder).
const MAX_CONTROL_FDS: usize = 4;

/// Longest control message (bytes): a [`Control::Serving`] lists the `--deps` installed, so
/// this leaves room for a few hundred packages.
pub const CONTROL_MESSAGE_MAX: usize = 64 << 10;

/// A control message and the descriptors it carried.
pub type Message = (Control, Vec<OwnedFd>);

/// Why a control message could not be read or sent.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("the control socket failed")]
    Io(#[source] nix::Error),
    #[error("a control message carried more descriptors than expected")]
    Truncated,
    #[error("a control message is not one the protocol declares")]
    Malformed(#[source] serde_json::Error),
    #[error("a `{0:?}` control message carried {1} descriptors")]
    Descriptors(Control, usize),
}

/// One message read from the control socket, with the descriptors it declares (at most
/// four); `None` at end of file (the other side closed the socket).
///
/// Errors: [`ControlError`].
pub fn receive(control: BorrowedFd<'_>) -> Result<Option<Message>, ControlError> {
    let mut buf = vec![0u8; CONTROL_MESSAGE_MAX];
    let mut space = nix::cmsg_space!([RawFd; MAX_CONTROL_FDS]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        control.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(ControlError::Io)?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(ControlError::Io)? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: SCM_RIGHTS installed these descriptors in this process just now; each
            // is owned once, here.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let (len, truncated) = (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC));
    if truncated {
        return Err(ControlError::Truncated);
    }
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    let message: Control = serde_json::from_slice(&buf[..len]).map_err(ControlError::Malformed)?;
    if fds.len() != message.descriptors() {
        return Err(ControlError::Descriptors(message, fds.len()));
    }
    Ok(Some((message, fds)))
}

/// Sends `message` with `fds` attached (`SCM_RIGHTS`; as many as it declares) on the control
/// socket.
///
/// Errors: [`ControlError::Io`]; [`ControlError::Descriptors`] for the wrong count.
pub fn send(control: BorrowedFd<'_>, message: &Control, fds: &[RawFd]) -> Result<(), ControlError> {
    if fds.len() != message.descriptors() {
        return Err(ControlError::Descriptors(message.clone(), fds.len()));
    }
    let bytes = serde_json::to_vec(message).map_err(ControlError::Malformed)?;
    send_bytes(control, &bytes, fds)
}

/// Sends `bytes` with `fds` attached (`SCM_RIGHTS`) on the control socket.
fn send_bytes(control: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> Result<(), ControlError> {
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(fds)]
    };
    sendmsg::<()>(
        control.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(ControlError::Io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_declare_their_descriptors() {
        for (message, fds) in [
            (Control::Forkable, 0),
            (Control::Fork, 3),
            (Control::ForkInto, 4),
            (Control::Forked { pid: 7 }, 1),
            (Control::ForkFailed { reason: "x".into() }, 0),
        ] {
            assert_eq!(message.descriptors(), fds);
            let json = serde_json::to_string(&message).unwrap();
            assert_eq!(serde_json::from_str::<Control>(&json).unwrap(), message);
        }
        assert!(serde_json::from_str::<Control>(r#"{"kind":"forked"}"#).is_err());
        assert!(serde_json::from_str::<Control>(r#"{"kind":"exec"}"#).is_err());
    }

    #[test]
    fn the_zygote_services_messages_keep_their_wire_shape_and_carry_no_descriptors() {
        let status = Control::StatusReport(ServiceStatus {
            ready: true,
            fronts: 2,
            workers: 3,
            uptime_s: 4,
            idle_exit_s: 600,
        });
        let wire = serde_json::to_value(&status).unwrap();
        assert_eq!(wire["kind"], "status_report");
        assert_eq!(wire["fronts"], 2);
        let back: Control = serde_json::from_value(wire).unwrap();
        assert_eq!(back, status);
        let hello: Control =
            serde_json::from_str(r#"{"kind":"hello","digest":"ab","pid":7}"#).unwrap();
        assert_eq!(
            hello,
            Control::Hello {
                digest: "ab".into(),
                pid: 7
            }
        );
        for message in [
            hello,
            status,
            Control::Status,
            Control::Stop,
            Control::Stopping,
        ] {
            assert_eq!(message.descriptors(), 0, "{message:?}");
        }
        assert_eq!(Control::Fork.descriptors(), 3);
        // A peer cannot smuggle fields into a message that has fields.
        let smuggled = r#"{"kind":"hello","digest":"ab","pid":7,"more":1}"#;
        assert!(serde_json::from_str::<Control>(smuggled).is_err());
    }
}
