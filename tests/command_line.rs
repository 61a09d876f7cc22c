//! The command line keeps every flag and alias it had before its settings were regrouped
//! (docs/architecture.md §6): each command's `--help` still names each flag of the list taken
//! from the binary before the change, the hidden earlier names still parse, and the modes keep
//! their names and aliases. A flag that a user's script passes must never vanish quietly.

use std::process::Command;

/// `mcp-run-python --help`'s flags before the regrouping (aliases included: `--dependencies`).
const SERVER_FLAGS: &[&str] = &[
    "--allow-host",
    "--allow-net",
    "--allow-origin",
    "--auth-audience",
    "--auth-jwks",
    "--auth-server",
    "--auth-token-file",
    "--cache-dir",
    "--confinement",
    "--dependencies",
    "--ca-file",
    "--deps",
    "--disable-networking",
    "--drain-timeout",
    "--fetch-timeout",
    "--fresh-worker",
    "--functions-socket",
    "--help",
    "--hibernate-after",
    "--host",
    "--index-url",
    "--install-timeout",
    "--isolation",
    "--max-code-size",
    "--max-concurrent-fetches",
    "--max-fetch-bytes",
    "--max-fetches-per-call",
    "--max-hibernated-bytes",
    "--max-image-bytes",
    "--max-mount-bytes",
    "--max-queue",
    "--max-sandboxes",
    "--max-session-file-bytes",
    "--max-sessions",
    "--max-tasks",
    "--max-tool-bytes",
    "--max-tool-calls",
    "--memory",
    "--mount",
    "--no-shared-zygote",
    "--no-snapshot",
    "--no-zygote",
    "--offline",
    "--output-cap",
    "--packages-url",
    "--port",
    "--result-cap",
    "--return-mode",
    "--sandbox-idle-timeout",
    "--secret",
    "--sandbox-max-lifetime",
    "--session-idle-timeout",
    "--spares",
    "--state-dir",
    "--stateful",
    "--task-timeout",
    "--task-ttl",
    "--timeout",
    "--tools-config",
    "--verbose",
    "--version",
    "--workers",
    "--zygote-idle-exit",
    "--zygote-socket",
];

/// `mcp-run-python packages download --help`'s flags before the regrouping.
const DOWNLOAD_FLAGS: &[&str] = &[
    "--cache-dir",
    "--dest",
    "--help",
    "--index-url",
    "--offline",
    "--packages-url",
    "--verbose",
];

/// `mcp-run-python zygote status|stop --help`'s flags before the regrouping.
const ZYGOTE_FLAGS: &[&str] = &["--cache-dir", "--help", "--zygote-socket"];

/// The modes a front serves or runs, as users name them.
const MODES: &[&str] = &[
    "stdio",
    "streamable-http",
    "streamable-http-stateless",
    "sse",
    "warmup",
    "example",
];

fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-run-python"))
}

/// The standard output of the binary run with `args`, which must succeed.
fn output_of(args: &[&str]) -> String {
    let out = binary().args(args).output().expect("the binary runs");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `--flag` a help text names.
fn flags_in(help: &str) -> Vec<String> {
    help.split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']' | '='))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_owned()
        })
        .collect()
}

fn assert_keeps(args: &[&str], before: &[&str]) {
    let help = output_of(&[args, &["--help"]].concat());
    let now = flags_in(&help);
    let lost: Vec<&&str> = before
        .iter()
        .filter(|f| !now.iter().any(|n| n == *f))
        .collect();
    assert!(lost.is_empty(), "{args:?} --help lost {lost:?}:\n{help}");
}

#[test]
fn every_command_keeps_every_flag_it_had() {
    assert_keeps(&[], SERVER_FLAGS);
    assert_keeps(&["packages", "download"], DOWNLOAD_FLAGS);
    assert_keeps(&["zygote", "status"], ZYGOTE_FLAGS);
    assert_keeps(&["zygote", "stop"], ZYGOTE_FLAGS);
}

#[test]
fn the_modes_and_hidden_earlier_names_still_parse() {
    let help = output_of(&["--help"]);
    for mode in MODES {
        assert!(help.contains(mode), "--help lost the mode {mode}:\n{help}");
    }
    // `--help` after other arguments: they must parse first, so each is accepted.
    output_of(&["stdio", "--sandbox", "strict", "--help"]);
    output_of(&["--confinement=off", "streamable_http", "--help"]);
    output_of(&[
        "streamable_http_stateless",
        "--dependencies",
        "rich",
        "--help",
    ]);
    output_of(&["--port", "3001", "sse", "--deps=a,b", "--help"]);
    let unknown = binary()
        .args(["stdio", "--no-such-flag"])
        .output()
        .expect("runs");
    assert!(!unknown.status.success(), "an unknown flag must be refused");
}
