//! One PEP 508 requirement parsed from untrusted text (user code, `--deps`, a wheel's
//! `Requires-Dist`): bounded first ([`super::bounds`]), then handed to `pep508_rs`.
//!
//! Its own module because both the resolver ([`super::resolver`], for the call's requirements)
//! and the provider ([`super::provider`], for each version's `Requires-Dist`) parse
//! requirements, and the resolver uses the provider: living in either would make the two
//! import each other.

use super::bounds;
use pep508_rs::{Pep508ErrorSource, Requirement};
use std::str::FromStr;
use thiserror::Error;

/// Why a requirement string was not parsed.
#[derive(Debug, Error)]
pub enum BadRequirement {
    /// Over a bound of [`bounds::check_requirement`]; never handed to the parser.
    #[error(transparent)]
    Bounds(#[from] bounds::BoundsError),
    /// The parser's message (without the text it quotes and underlines, since the caller
    /// quotes the requirement in excerpt itself).
    #[error(transparent)]
    Syntax(Pep508ErrorSource),
}

/// Parses one PEP 508 requirement from untrusted text (user code, `--deps`, a wheel's
/// `Requires-Dist`), checking [`bounds::check_requirement`] first so that `pep508_rs`'s
/// recursive parser never sees text that could exhaust the stack or its decision diagram.
///
/// Errors: the bound broken, or the parser's message.
pub fn parse_requirement(text: &str) -> Result<Requirement, BadRequirement> {
    bounds::check_requirement(text)?;
    Requirement::from_str(text).map_err(|e| BadRequirement::Syntax(e.message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::bounds::tests::nested;

    #[test]
    fn parse_requirement_bounds_before_parsing() {
        assert!(matches!(
            parse_requirement(&nested(1000)),
            Err(BadRequirement::Bounds(bounds::BoundsError::Depth { .. }))
        ));
        assert_eq!(
            parse_requirement(&nested(1000))
                .err()
                .map(|e| e.to_string()),
            Some("nested more than 32 levels deep".to_owned())
        );
        let Err(syntax) = parse_requirement("rich <<< 13") else {
            panic!("expected a syntax error");
        };
        assert!(matches!(syntax, BadRequirement::Syntax(_)));
        // The parser's message alone, not its quote of the text underlined.
        assert!(!syntax.to_string().contains('\n'), "{syntax}");
        let ok = parse_requirement("rich<13; python_version >= \"3.8\"").expect("parses");
        assert_eq!(ok.name.to_string(), "rich");
    }
}
