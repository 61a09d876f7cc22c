//! Bounds on untrusted text, checked before any recursive parser sees it (docs/architecture.md §9).
//!
//! Requirement strings come from user code (PEP 723 `dependencies`, imports) and from the
//! `Requires-Dist` of downloaded wheels; `pep508_rs` parses them recursively (one stack frame
//! set per parenthesis of a marker, a few KiB each in debug builds), so 3,000 parentheses
//! overflow a tokio worker's 2 MiB stack and abort the whole server. It also builds each
//! marker into a shared decision diagram whose size can double with every extra pair of
//! comparisons (measured: 16 pairs of `extra == …` take 0.25 s, each further pair about twice
//! as long), so the number of comparisons is bounded too. The PEP 723 block is TOML; `toml`
//! has its own depth guard, but the block is bounded here as well so that the limit is ours,
//! documented, and reported in words a user understands.
//!
//! Every check is a single linear pass that allocates nothing.

use thiserror::Error;

/// Longest requirement string accepted (bytes). Real requirements, markers included, are well
/// under 200 bytes; 4 KiB leaves room for long but honest markers.
pub const MAX_REQUIREMENT_BYTES: usize = 4096;

/// Deepest nesting of `(`/`[`/`{` accepted (levels), in a requirement or in the PEP 723 TOML
/// (where a dotted key counts one level per dot). Real markers nest two or three levels.
pub const MAX_NESTING: usize = 32;

/// Most comparisons in one requirement's marker (count). Real markers have fewer than ten;
/// 16 keeps `pep508_rs`'s decision diagram to a few milliseconds in the worst case.
pub const MAX_MARKER_COMPARISONS: usize = 16;

/// Largest PEP 723 `# /// script` block accepted (bytes of TOML, comment prefixes removed).
pub const MAX_SCRIPT_METADATA_BYTES: usize = 64 << 10;

/// Most entries in a PEP 723 block's `dependencies` (count).
pub const MAX_SCRIPT_DEPENDENCIES: usize = 256;

/// How much of an untrusted string an error message quotes (characters); see [`excerpt`].
pub const EXCERPT_CHARS: usize = 80;

/// Which bound a piece of untrusted text broke. The messages complete a sentence whose subject
/// is the text ("the requirement is …" / "`…`: …").
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub enum BoundsError {
    /// The text is longer than `limit` bytes.
    #[error("longer than {limit} bytes ({len} bytes)")]
    Length { len: usize, limit: usize },
    /// Brackets (or, in TOML, dotted keys) nest deeper than `limit` levels.
    #[error("nested more than {limit} levels deep")]
    Depth { limit: usize },
    /// The marker has more than `limit` comparisons.
    #[error("a marker with more than {limit} comparisons")]
    MarkerComparisons { limit: usize },
}

/// Checks a PEP 508 requirement string from user code or a wheel's `Requires-Dist` against
/// [`MAX_REQUIREMENT_BYTES`], [`MAX_NESTING`] and [`MAX_MARKER_COMPARISONS`]; call it before
/// `pep508_rs::Requirement::from_str`.
///
/// Errors: the first bound the text breaks.
pub fn check_requirement(text: &str) -> Result<(), BoundsError> {
    if text.len() > MAX_REQUIREMENT_BYTES {
        return Err(BoundsError::Length {
            len: text.len(),
            limit: MAX_REQUIREMENT_BYTES,
        });
    }
    if requirement_depth_exceeds(text, MAX_NESTING) {
        return Err(BoundsError::Depth { limit: MAX_NESTING });
    }
    if marker_comparisons(text) > MAX_MARKER_COMPARISONS {
        return Err(BoundsError::MarkerComparisons {
            limit: MAX_MARKER_COMPARISONS,
        });
    }
    Ok(())
}

/// Checks the TOML of a PEP 723 block against [`MAX_SCRIPT_METADATA_BYTES`] and
/// [`MAX_NESTING`]; call it before `toml` parses the block.
///
/// Errors: the first bound the text breaks.
pub fn check_script_toml(text: &str) -> Result<(), BoundsError> {
    if text.len() > MAX_SCRIPT_METADATA_BYTES {
        return Err(BoundsError::Length {
            len: text.len(),
            limit: MAX_SCRIPT_METADATA_BYTES,
        });
    }
    if toml_depth_exceeds(text, MAX_NESTING) {
        return Err(BoundsError::Depth { limit: MAX_NESTING });
    }
    Ok(())
}

/// At most [`EXCERPT_CHARS`] characters of `text` for an error message, with `…` and the full
/// length in bytes when it was cut, so that a 6 KB string is not echoed whole.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
    }
}

/// Whether `(`/`[`/`{` nest deeper than `limit` in a requirement, as `pep508_rs` would see them.
///
/// Only a marker recurses, and it starts after some `;` (which one depends on whether a URL
/// comes first, and a URL may itself hold `;` and quotes). So the scan follows every reading at
/// once: the one from the start of the text, plus one starting unquoted at depth 0 after each
/// `;`. Readings that agree on the quote state then evolve alike, so only the deepest of each
/// state is kept: three counters. Quoted strings are as in PEP 508 (`'…'` or `"…"`, no escapes).
/// An unquoted closer that does not match decrements too; in a marker that is a parse error,
/// after which nothing more is parsed.
fn requirement_depth_exceeds(text: &str, limit: usize) -> bool {
    // Deepest depth of the readings currently outside quotes, in `"…"`, in `'…'`.
    let mut unquoted: Option<usize> = Some(0);
    let mut double: Option<usize> = None;
    let mut single: Option<usize> = None;
    for b in text.bytes() {
        let (u, d, s) = (unquoted, double, single);
        match b {
            // Readings outside quotes open a string; readings inside this kind close it.
            b'"' => (unquoted, double) = (d, u),
            b'\'' => (unquoted, single) = (s, u),
            b'(' | b'[' | b'{' => unquoted = u.map(|n| n + 1),
            b')' | b']' | b'}' => unquoted = u.map(|n| n.saturating_sub(1)),
            // Any `;` may be where the marker starts, whatever the other readings think.
            b';' => unquoted = Some(u.unwrap_or(0)),
            _ => {}
        }
        if unquoted.is_some_and(|n| n > limit) {
            return true;
        }
    }
    false
}

/// An upper bound on the comparisons in a requirement's marker: one more than its `and`/`or`
/// words. `pep508_rs` only takes such a word when it stands between whitespace, parentheses or
/// quotes, so splitting on those (and on every other non-word character) finds each of them;
/// words inside quoted values are counted too, which can only overcount.
fn marker_comparisons(text: &str) -> usize {
    let operators = text
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '-'))
        .filter(|word| *word == "and" || *word == "or")
        .count();
    operators + 1
}

/// Whether arrays, inline tables, table headers and dotted keys nest deeper than `limit` in
/// TOML text. Strings and comments are skipped as TOML defines them (basic strings with `\`
/// escapes, literal strings, their `"""`/`'''` multi-line forms). A dotted key adds one level
/// per dot to the bracket it sits in; a dot in a value (`1.5`) is counted too, which can only
/// overcount.
fn toml_depth_exceeds(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    let mut scan = TomlScan::default();
    let mut i = 0;
    while i < bytes.len() {
        i += scan.step(bytes, i);
        if scan.depth + scan.dots > limit {
            return true;
        }
        i += 1;
    }
    false
}

/// The delimiter of a multi-line basic string (TOML).
const MULTI_BASIC_DELIMITER: &[u8] = b"\"\"\"";
/// The delimiter of a multi-line literal string (TOML).
const MULTI_LITERAL_DELIMITER: &[u8] = b"'''";
/// Quotes right before a multi-line string's closing delimiter that TOML counts as content
/// (`""""` is a quote, then the delimiter); at most two, or they would close it themselves.
const MAX_QUOTES_BEFORE_CLOSING: usize = 2;

/// Where the scan of [`toml_depth_exceeds`] stands: outside strings, or inside which kind.
#[derive(Clone, Copy, PartialEq, Default)]
enum TomlState {
    /// Keys, values and brackets: where nesting counts.
    #[default]
    Normal,
    /// After `#`, to the end of the line.
    Comment,
    /// In `"…"` (with `\` escapes).
    Basic,
    /// In `'…'` (no escapes).
    Literal,
    /// In `"""…"""` (with `\` escapes).
    MultiBasic,
    /// In `'''…'''` (no escapes).
    MultiLiteral,
}

/// The nesting of the TOML read so far by [`toml_depth_exceeds`].
#[derive(Default)]
struct TomlScan {
    state: TomlState,
    /// Levels contributed by each open bracket (1 plus the dots of the key before it), whose
    /// sum is `depth`; bounded by the limit, so the stack is small.
    open: Vec<usize>,
    depth: usize,
    /// Dots of the key being read (since the last `=`, `,`, newline or bracket).
    dots: usize,
}

impl TomlScan {
    /// Reads the byte at `at` of `bytes`; returns how many bytes after it were read with it
    /// (an escaped byte, the rest of a multi-line delimiter), which the caller skips.
    fn step(&mut self, bytes: &[u8], at: usize) -> usize {
        let b = bytes[at];
        let rest = &bytes[at..];
        match self.state {
            TomlState::Normal => self.normal(b, rest),
            TomlState::Comment => {
                if b == b'\n' {
                    self.state = TomlState::Normal;
                    self.dots = 0;
                }
                0
            }
            TomlState::Basic => match b {
                // An escape hides the next byte (`\"` does not end the string).
                b'\\' => 1,
                // A single-line string cannot span lines; the parser reports it there.
                b'"' | b'\n' => {
                    self.state = TomlState::Normal;
                    0
                }
                _ => 0,
            },
            TomlState::Literal => {
                if b == b'\'' || b == b'\n' {
                    self.state = TomlState::Normal;
                }
                0
            }
            TomlState::MultiBasic => match b {
                b'\\' => 1,
                b'"' if rest.starts_with(MULTI_BASIC_DELIMITER) => {
                    self.close_multi_line(bytes, at, MULTI_BASIC_DELIMITER)
                }
                _ => 0,
            },
            TomlState::MultiLiteral => {
                if rest.starts_with(MULTI_LITERAL_DELIMITER) {
                    self.close_multi_line(bytes, at, MULTI_LITERAL_DELIMITER)
                } else {
                    0
                }
            }
        }
    }

    /// Reads byte `b` outside strings and comments (`rest` starts with it): opens a string or
    /// comment, opens or closes a bracket, or counts a key's dot. Returns the bytes read with
    /// it (the rest of a multi-line delimiter).
    fn normal(&mut self, b: u8, rest: &[u8]) -> usize {
        match b {
            b'#' => self.state = TomlState::Comment,
            b'"' if rest.starts_with(MULTI_BASIC_DELIMITER) => {
                self.state = TomlState::MultiBasic;
                return MULTI_BASIC_DELIMITER.len() - 1;
            }
            b'"' => self.state = TomlState::Basic,
            b'\'' if rest.starts_with(MULTI_LITERAL_DELIMITER) => {
                self.state = TomlState::MultiLiteral;
                return MULTI_LITERAL_DELIMITER.len() - 1;
            }
            b'\'' => self.state = TomlState::Literal,
            b'[' | b'{' => {
                let levels = 1 + self.dots;
                self.open.push(levels);
                self.depth += levels;
                self.dots = 0;
            }
            b']' | b'}' => {
                self.depth -= self.open.pop().unwrap_or(0);
                self.dots = 0;
            }
            b'.' => self.dots += 1,
            b'=' | b',' | b'\n' => self.dots = 0,
            _ => {}
        }
        0
    }

    /// Ends a multi-line string whose closing `delimiter` starts at `at`; returns the bytes
    /// read with its first one: the rest of the delimiter, and up to
    /// [`MAX_QUOTES_BEFORE_CLOSING`] more quotes (`""""` ends after 4: the first quote is
    /// content).
    fn close_multi_line(&mut self, bytes: &[u8], at: usize, delimiter: &[u8]) -> usize {
        self.state = TomlState::Normal;
        let mut read = delimiter.len() - 1;
        for _ in 0..MAX_QUOTES_BEFORE_CLOSING {
            if bytes.get(at + read + 1) == Some(&delimiter[0]) {
                read += 1;
            }
        }
        read
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::str::FromStr;

    /// A stack far smaller than a tokio worker's 2 MiB (bytes), to show that nothing recurses.
    const SMALL_STACK_BYTES: usize = 256 << 10;

    /// A requirement whose marker nests `depth` parentheses.
    pub(crate) fn nested(depth: usize) -> String {
        format!(
            "a ; {}python_version > \"3\"{}",
            "(".repeat(depth),
            ")".repeat(depth)
        )
    }

    /// Runs `f` on a thread with [`SMALL_STACK_BYTES`] of stack; a stack overflow would abort
    /// the test binary.
    pub(crate) fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(SMALL_STACK_BYTES)
            .spawn(f)
            .expect("spawn a test thread")
            .join()
            .expect("the test thread finished")
    }

    #[test]
    fn three_thousand_parentheses_are_refused_without_recursing() {
        let text = nested(3000);
        assert!(text.len() > MAX_REQUIREMENT_BYTES);
        // Under the length bound too, so that the nesting check itself is exercised.
        let short = nested(1000);
        assert!(short.len() <= MAX_REQUIREMENT_BYTES);
        let (long, deep) = on_small_stack(move || {
            (
                check_requirement(&text),
                check_requirement(&short).map(|()| {
                    pep508_rs::Requirement::<pep508_rs::VerbatimUrl>::from_str(&short).is_ok()
                }),
            )
        });
        assert_eq!(
            long,
            Err(BoundsError::Length {
                len: nested(3000).len(),
                limit: MAX_REQUIREMENT_BYTES
            })
        );
        assert_eq!(deep, Err(BoundsError::Depth { limit: MAX_NESTING }));
        assert_eq!(
            BoundsError::Depth { limit: MAX_NESTING }.to_string(),
            "nested more than 32 levels deep"
        );
        assert!(long
            .unwrap_err()
            .to_string()
            .starts_with("longer than 4096 bytes"));
    }

    #[test]
    fn the_deepest_accepted_requirement_parses_on_a_small_stack() {
        let text = nested(MAX_NESTING);
        let parsed = on_small_stack(move || {
            check_requirement(&text)
                .map(|()| pep508_rs::Requirement::<pep508_rs::VerbatimUrl>::from_str(&text).is_ok())
        });
        assert_eq!(parsed, Ok(true));
        assert!(check_requirement(&nested(MAX_NESTING + 1)).is_err());
    }

    #[test]
    fn normal_requirements_pass() {
        for text in [
            "rich<13",
            "attrs",
            "requests[socks,security] >= 2.31, <3",
            "pkg (>=1.0)",
            "numpy>=1.22.4; python_version < \"3.11\" and platform_machine != \"aarch64\"",
            "tomli>=1.1.0; python_version < '3.11' and (sys_platform == 'win32' or (os_name == 'posix' and implementation_name == 'cpython'))",
            "typing-extensions>=4; extra == \"dev\"",
            "name @ https://example.com/a;b'c.whl ; python_version > '3'",
        ] {
            assert_eq!(check_requirement(text), Ok(()), "{text}");
        }
    }

    #[test]
    fn quoted_closers_cannot_hide_depth() {
        // The parser sees `)` inside quotes as text: each `(` here is one more level.
        let text = format!("a ; {}", "( extra == \")\" or ".repeat(40));
        assert!(requirement_depth_exceeds(&text, MAX_NESTING));
        // A quote in a URL before the marker must not invert what counts as quoted.
        let text = format!("a @ https://x/'y ; {}", "( extra == ')' or ".repeat(40));
        assert!(requirement_depth_exceeds(&text, MAX_NESTING));
        // Parentheses inside a quoted value are text, not nesting.
        let text = format!("a ; platform_version == \"{}\"", "(".repeat(100));
        assert!(!requirement_depth_exceeds(&text, MAX_NESTING));
    }

    #[test]
    fn long_markers_are_refused_before_the_decision_diagram_grows() {
        let pairs: Vec<String> = (0..40)
            .map(|i| format!("(extra == \"a{i}\" and extra == \"b{i}\")"))
            .collect();
        let text = format!("a ; {}", pairs.join(" or "));
        assert!(text.len() <= MAX_REQUIREMENT_BYTES);
        assert_eq!(
            check_requirement(&text),
            Err(BoundsError::MarkerComparisons {
                limit: MAX_MARKER_COMPARISONS
            })
        );
        // `and`/`or` glued to quotes or parentheses still count.
        let glued = format!("a ; {}", "(extra=='x')or".repeat(20)) + "(extra=='y')";
        assert!(marker_comparisons(&glued) > MAX_MARKER_COMPARISONS);
        // `platform_machine`, `sys_platform` contain "or" but are not the word.
        assert_eq!(
            marker_comparisons("a ; sys_platform == 'x' and platform_machine == 'y'"),
            2
        );
    }

    #[test]
    fn toml_nesting_bombs_are_refused() {
        let arrays = format!("x = {}{}", "[".repeat(5000), "]".repeat(5000));
        assert_eq!(
            check_script_toml(&arrays),
            Err(BoundsError::Depth { limit: MAX_NESTING })
        );
        let tables = format!("x = {}{}", "{a = ".repeat(100), "}".repeat(100));
        assert!(check_script_toml(&tables).is_err());
        let dotted = format!("{} = 1", vec!["a"; 100].join("."));
        assert!(check_script_toml(&dotted).is_err());
        let header = format!("[{}]", vec!["a"; 100].join("."));
        assert!(check_script_toml(&header).is_err());
        let big = format!("x = \"{}\"", "a".repeat(MAX_SCRIPT_METADATA_BYTES));
        assert!(matches!(
            check_script_toml(&big),
            Err(BoundsError::Length { .. })
        ));
    }

    #[test]
    fn toml_strings_and_comments_are_not_nesting() {
        let text = format!(
            "dependencies = [\"a[b]\", 'c{}', \"\\\"{}\"]\n# {}\nx = \"\"\"\n{}\n\"\"\"\ny = '''{}'''\n[tool.x]\nv = 1.5\n",
            "[".repeat(100),
            "{".repeat(100),
            "[".repeat(100),
            "[".repeat(100),
            "{".repeat(100)
        );
        assert_eq!(check_script_toml(&text), Ok(()));
        // Strings close where TOML closes them: what follows is counted again.
        let text = format!("x = \"\\\\\"{}", "[".repeat(40));
        assert!(check_script_toml(&text).is_err());
    }

    #[test]
    fn excerpts_are_short() {
        assert_eq!(excerpt("rich<13"), "rich<13");
        let long = nested(3000);
        let short = excerpt(&long);
        assert!(short.chars().count() < EXCERPT_CHARS + 20, "{short}");
        assert!(short.ends_with(&format!("… ({} bytes)", long.len())));
        // Cuts on character boundaries.
        assert!(excerpt(&"é".repeat(200)).starts_with("éé"));
    }
}
