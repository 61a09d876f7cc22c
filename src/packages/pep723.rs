//! PEP 723 inline script metadata: the `# /// script` … `# ///` block and its `dependencies`.

use super::bounds::{self, BoundsError, MAX_SCRIPT_DEPENDENCIES};
use thiserror::Error;

/// Why a script's metadata block could not be used.
#[derive(Debug, Error, PartialEq)]
pub enum Pep723Error {
    /// A `# /// script` line without a closing `# ///` among the comment lines after it.
    #[error("the `# /// script` block is never closed with `# ///`")]
    Unclosed,
    /// Two `script` blocks (the PEP makes this an error).
    #[error("more than one `# /// script` block")]
    Duplicate,
    /// The block is not TOML. The message is the parser's alone: its `Display` would quote the
    /// block and underline the place.
    #[error("the `# /// script` block is not valid TOML: {}", .0.message())]
    Toml(#[source] toml::de::Error),
    /// `dependencies` is not an array of strings.
    #[error("`dependencies` in the `# /// script` block must be a list of strings")]
    BadDependencies,
    /// The block's TOML is over [`bounds::MAX_SCRIPT_METADATA_BYTES`] bytes or nests deeper
    /// than [`bounds::MAX_NESTING`] levels. The bound is the whole reason, so it is the message
    /// rather than a source.
    #[error("the `# /// script` block is {0}")]
    Bounds(BoundsError),
    /// `dependencies` has `count` entries, more than `limit` ([`MAX_SCRIPT_DEPENDENCIES`]).
    #[error("`dependencies` in the `# /// script` block lists {count} requirements, more than the limit of {limit}")]
    TooManyDependencies { count: usize, limit: usize },
}

/// The `dependencies` of the script's PEP 723 block, in the order written, or `None` when the
/// code has no `script` block. A block without `dependencies` gives an empty list.
///
/// Follows the PEP's reference rules: the block opens with a line that is exactly
/// `# /// script`, every content line is `#` or starts with `# `, and it closes at the last
/// `# ///` line before a line that is not a comment.
///
/// Errors: see [`Pep723Error`]; the block is checked against [`bounds::check_script_toml`]
/// before it is parsed, and `dependencies` against [`MAX_SCRIPT_DEPENDENCIES`]. Each
/// requirement is bounded later, where it is parsed ([`super::requirement::parse_requirement`],
/// called by the resolver).
pub fn script_dependencies(code: &str) -> Result<Option<Vec<String>>, Pep723Error> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "# /// script" {
            i += 1;
            continue;
        }
        // Content runs while lines are comments; the block ends at the last `# ///` among them.
        let mut end = None;
        let mut j = i + 1;
        while j < lines.len() && (lines[j] == "#" || lines[j].starts_with("# ")) {
            if lines[j].trim_end() == "# ///" {
                end = Some(j);
            }
            j += 1;
        }
        let Some(end) = end else {
            return Err(Pep723Error::Unclosed);
        };
        if found.is_some() {
            return Err(Pep723Error::Duplicate);
        }
        let body: Vec<&str> = lines[i + 1..end]
            .iter()
            .map(|l| {
                l.strip_prefix("# ")
                    .unwrap_or_else(|| l.strip_prefix('#').unwrap_or(l))
            })
            .collect();
        found = Some(body.join("\n"));
        i = end + 1;
    }
    let Some(toml_text) = found else {
        return Ok(None);
    };
    // The block is untrusted text: bounded before the (recursive) TOML parser sees it.
    bounds::check_script_toml(&toml_text).map_err(Pep723Error::Bounds)?;
    let table: toml::Table = toml_text.parse().map_err(Pep723Error::Toml)?;
    match table.get("dependencies") {
        None => Ok(Some(Vec::new())),
        Some(toml::Value::Array(items)) if items.len() > MAX_SCRIPT_DEPENDENCIES => {
            Err(Pep723Error::TooManyDependencies {
                count: items.len(),
                limit: MAX_SCRIPT_DEPENDENCIES,
            })
        }
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or(Pep723Error::BadDependencies)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(Pep723Error::BadDependencies),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_dependencies() {
        let code = "# /// script\n# dependencies = [\"rich<13\", \"attrs\"]\n# ///\nimport rich\n";
        assert_eq!(
            script_dependencies(code).unwrap(),
            Some(vec!["rich<13".to_string(), "attrs".to_string()])
        );
    }

    #[test]
    fn no_block_is_none() {
        assert_eq!(script_dependencies("import os\n").unwrap(), None);
    }

    #[test]
    fn block_without_dependencies_is_empty() {
        let code = "# /// script\n# requires-python = \">=3.12\"\n# ///\n";
        assert_eq!(script_dependencies(code).unwrap(), Some(vec![]));
    }

    #[test]
    fn unclosed_block_is_an_error() {
        assert_eq!(
            script_dependencies("# /// script\n# dependencies = []\nx = 1\n"),
            Err(Pep723Error::Unclosed)
        );
    }

    /// `code` with `toml` as its PEP 723 block.
    fn script(toml: &str) -> String {
        let body: Vec<String> = toml.lines().map(|l| format!("# {l}")).collect();
        format!("# /// script\n{}\n# ///\nprint(1)\n", body.join("\n"))
    }

    #[test]
    fn toml_nesting_bomb_is_refused() {
        let code = script(&format!(
            "dependencies = {}\"a\"{}",
            "[".repeat(3000),
            "]".repeat(3000)
        ));
        let err = script_dependencies(&code).unwrap_err();
        assert_eq!(
            err,
            Pep723Error::Bounds(BoundsError::Depth {
                limit: bounds::MAX_NESTING
            })
        );
        assert_eq!(
            err.to_string(),
            "the `# /// script` block is nested more than 32 levels deep"
        );
    }

    #[test]
    fn oversized_block_is_refused() {
        let code = script(&format!(
            "dependencies = []\nx = \"{}\"",
            "a".repeat(bounds::MAX_SCRIPT_METADATA_BYTES)
        ));
        let err = script_dependencies(&code).unwrap_err();
        assert!(matches!(
            err,
            Pep723Error::Bounds(BoundsError::Length { .. })
        ));
        assert!(err
            .to_string()
            .starts_with("the `# /// script` block is longer than 65536 bytes"));
    }

    #[test]
    fn too_many_dependencies_are_refused() {
        let deps: Vec<String> = (0..=MAX_SCRIPT_DEPENDENCIES)
            .map(|i| format!("\"p{i}\""))
            .collect();
        let code = script(&format!("dependencies = [{}]", deps.join(", ")));
        assert_eq!(
            script_dependencies(&code),
            Err(Pep723Error::TooManyDependencies {
                count: MAX_SCRIPT_DEPENDENCIES + 1,
                limit: MAX_SCRIPT_DEPENDENCIES
            })
        );
    }

    #[test]
    fn a_nested_marker_is_just_a_string_here() {
        // The requirement itself is bounded where it is parsed (requirement.rs); TOML only sees a
        // string, and nesting inside strings does not count.
        let requirement = format!(
            "a ; {}python_version > \"3\"{}",
            "(".repeat(3000),
            ")".repeat(3000)
        );
        let code = script(&format!("dependencies = ['{requirement}']"));
        assert_eq!(script_dependencies(&code), Ok(Some(vec![requirement])));
    }

    #[test]
    fn bad_toml_is_an_error() {
        let err = script_dependencies("# /// script\n# dependencies = [\n# ///\n").unwrap_err();
        assert!(matches!(err, Pep723Error::Toml(_)));
        // The parser's message alone, not the block it quotes.
        let words = err.to_string();
        assert!(words.starts_with("the `# /// script` block is not valid TOML: "));
        assert!(!words.contains("dependencies"), "{words}");
    }
}
