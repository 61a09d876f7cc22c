//! Sandbox handles: the names the server mints for sandboxes and the model passes back as the
//! `sandbox_id` tool argument (MCP 2026-07-28, SEP-2567 "explicit state handles").
//!
//! A handle is `sbx_` followed by 128 bits from the operating system's random source, in
//! URL-safe base64 without padding (22 characters): it travels in JSON, in URIs
//! (`sandbox://{sandbox_id}/…`) and in the `Mcp-Param-Sandbox-Id` header (SEP-2243) without
//! escaping. While the server has no authentication a handle is a bearer capability (SEP-2567,
//! "IDs in chat history"): whoever holds it reaches the sandbox, so it is unguessable, bounded in
//! life by the registry, and written to logs only shortened ([`SandboxId::short`]).

use base64::Engine as _;
use std::fmt;

/// The prefix of every handle.
const PREFIX: &str = "sbx_";

/// Random bytes in a handle (16 bytes = 128 bits, SEP-2567's "sufficient entropy").
const RANDOM_BYTES: usize = 16;

/// Length of the random part once encoded: URL-safe base64 of 16 bytes, without padding.
const ENCODED_CHARS: usize = 22;

/// Characters of the random part kept when a handle is logged.
const SHORT_CHARS: usize = 6;

/// A sandbox handle, well formed (`sbx_` + 22 URL-safe base64 characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

/// The OS random source failed, so no handle could be minted.
#[derive(Debug, thiserror::Error)]
#[error("could not draw a sandbox handle from the operating system's random source")]
pub struct MintError(#[source] pub getrandom::Error);

impl SandboxId {
    /// A new handle from the OS random source (`getrandom`).
    ///
    /// Errors: [`MintError`] when the random source fails.
    pub fn mint() -> Result<SandboxId, MintError> {
        let mut bytes = [0u8; RANDOM_BYTES];
        getrandom::fill(&mut bytes).map_err(MintError)?;
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        Ok(SandboxId(format!("{PREFIX}{encoded}")))
    }

    /// `text` as a handle, or `None` when it cannot be one (wrong prefix, length or
    /// alphabet). Nothing is looked up: an unknown well-formed handle still parses.
    pub fn parse(text: &str) -> Option<SandboxId> {
        let random = text.strip_prefix(PREFIX)?;
        let well_formed = random.len() == ENCODED_CHARS
            && random
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        well_formed.then(|| SandboxId(text.to_owned()))
    }

    /// The handle as text, as clients see it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The handle shortened for logs (`sbx_AbCdEf…`): enough to tell sandboxes apart in a log,
    /// too little to use.
    pub fn short(&self) -> Short<'_> {
        Short(self)
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A handle as it is logged (see [`SandboxId::short`]).
pub struct Short<'a>(&'a SandboxId);

impl fmt::Display for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = PREFIX.len() + SHORT_CHARS;
        write!(f, "{}…", &self.0 .0[..kept.min(self.0 .0.len())])
    }
}

impl fmt::Debug for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_handles_are_well_formed_and_distinct() {
        let a = SandboxId::mint().expect("random");
        let b = SandboxId::mint().expect("random");
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), PREFIX.len() + ENCODED_CHARS);
        assert_eq!(SandboxId::parse(a.as_str()), Some(a.clone()));
        assert_eq!(a.short().to_string().chars().count(), 4 + SHORT_CHARS + 1);
        assert!(a.as_str().starts_with(&a.short().to_string()[..10]));
    }

    #[test]
    fn only_well_formed_text_parses() {
        for bad in [
            "",
            "sbx_",
            "sbx_short",
            "xyz_AAAAAAAAAAAAAAAAAAAAAA",
            "sbx_AAAAAAAAAAAAAAAAAAAAA/",
            "sbx_AAAAAAAAAAAAAAAAAAAAAAA",
            "sbx_AAAAAAAAAAAAAAAAAAAA==",
        ] {
            assert_eq!(SandboxId::parse(bad), None, "{bad}");
        }
        assert!(SandboxId::parse("sbx_AAAAAAAAAAAAAAAAAAAA-_").is_some());
    }
}
