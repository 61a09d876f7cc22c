//! PEP 723 inline script metadata: the `# /// script` … `# ///` block and its `dependencies`.

use thiserror::Error;

/// Why a script's metadata block could not be used.
#[derive(Debug, Error, PartialEq)]
pub enum Pep723Error {
    #[error("the `# /// script` block is never closed with `# ///`")]
    Unclosed,
    #[error("more than one `# /// script` block")]
    Duplicate,
    #[error("the `# /// script` block is not valid TOML: {0}")]
    Toml(String),
    #[error("`dependencies` in the `# /// script` block must be a list of strings")]
    BadDependencies,
}

/// The `dependencies` of the script's PEP 723 block, in the order written, or `None` when the
/// code has no `script` block. A block without `dependencies` gives an empty list.
///
/// Follows the PEP's reference rules: the block opens with a line that is exactly
/// `# /// script`, every content line is `#` or starts with `# `, and it closes at the last
/// `# ///` line before a line that is not a comment.
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
    let table: toml::Table = toml_text
        .parse()
        .map_err(|e: toml::de::Error| Pep723Error::Toml(e.message().to_owned()))?;
    match table.get("dependencies") {
        None => Ok(Some(Vec::new())),
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

    #[test]
    fn bad_toml_is_an_error() {
        assert!(matches!(
            script_dependencies("# /// script\n# dependencies = [\n# ///\n"),
            Err(Pep723Error::Toml(_))
        ));
    }
}
