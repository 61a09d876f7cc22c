//! The second wall, tried as native code that took over a worker would (the second wall, docs/architecture.md §3.2): a real
//! worker boots Pyodide, seals itself, then runs the probes of `src/interpreter/confine/escape.rs`
//! (compiled only with the `escape-test` feature). Every attempt must fail: with an errno, or by
//! the kernel killing the worker (seccomp), after which the next probe runs in a new worker.
//!
//! `cargo test --features escape-test --test sandbox_escape`
#![cfg(all(target_os = "linux", feature = "escape-test"))]

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

const WORKER: &str = env!("CARGO_BIN_EXE_mcp-run-python");

/// Writes one request frame: header length, JSON header, attachment count, attachments.
fn write_frame(out: &mut impl Write, header: &str, attachments: &[&[u8]]) {
    out.write_all(&(header.len() as u32).to_le_bytes()).unwrap();
    out.write_all(header.as_bytes()).unwrap();
    out.write_all(&(attachments.len() as u32).to_le_bytes())
        .unwrap();
    for a in attachments {
        out.write_all(&(a.len() as u64).to_le_bytes()).unwrap();
        out.write_all(a).unwrap();
    }
    out.flush().unwrap();
}

/// Reads one reply frame: its JSON header and attachments.
fn read_frame(input: &mut impl Read) -> (serde_json::Value, Vec<Vec<u8>>) {
    let mut n = [0u8; 4];
    input.read_exact(&mut n).expect("a frame from the worker");
    let mut header = vec![0u8; u32::from_le_bytes(n) as usize];
    input.read_exact(&mut header).unwrap();
    input.read_exact(&mut n).unwrap();
    let mut attachments = Vec::new();
    for _ in 0..u32::from_le_bytes(n) {
        let mut len = [0u8; 8];
        input.read_exact(&mut len).unwrap();
        let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
        input.read_exact(&mut bytes).unwrap();
        attachments.push(bytes);
    }
    (serde_json::from_slice(&header).unwrap(), attachments)
}

/// What one worker run reported: probe results by index, and how it ended.
struct Run {
    results: Vec<(usize, String, String)>,
    last_trying: Option<(usize, String)>,
    done: bool,
    signal: Option<i32>,
    log: String,
}

/// `snapshot` in a file the next worker started inherits (no close-on-exec), as the server
/// hands it over, and the argument that names it.
fn snapshot_file(snapshot: &[u8]) -> (std::fs::File, String) {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(snapshot).unwrap();
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let arg = format!("--snapshot-fd={}", file.as_raw_fd());
    (file, arg)
}

/// Starts a worker that boots (making a snapshot, or restoring `snapshot`), seals itself and
/// runs the probes from `first`.
fn run_worker(
    port: u16,
    first: usize,
    snapshot: Option<&[u8]>,
    without_seccomp: bool,
) -> (Run, Option<Vec<u8>>) {
    run_worker_with(port, first, snapshot, without_seccomp, &[])
}

/// The arguments of a scientific worker (docs/architecture.md §5.4): the artifacts the
/// scientific tests made ready in `CARGO_TARGET_TMPDIR` (`tests/scientific.rs`, run first by
/// scripts/test.sh) and a scratch folder of its own.
fn scientific_args(scratch: &std::path::Path) -> Vec<String> {
    let runtimes =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("scientific-cache/runtimes");
    let artifacts = std::fs::read_dir(&runtimes)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (tests/scientific.rs prepares it)",
                runtimes.display()
            )
        })
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.join("lib").is_dir())
        .expect("unpacked scientific artifacts");
    let zip = std::fs::read_dir(artifacts.join("lib"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .find(|name| name.ends_with(".zip"))
        .expect("the standard library's zip");
    vec![
        "--runtime=scientific".to_owned(),
        format!("--artifacts={}", artifacts.display()),
        format!("--stdlib-zip={zip}"),
        format!("--scratch={}", scratch.display()),
    ]
}

fn run_worker_with(
    port: u16,
    first: usize,
    snapshot: Option<&[u8]>,
    without_seccomp: bool,
    extra: &[String],
) -> (Run, Option<Vec<u8>>) {
    let hole = if without_seccomp {
        ",without-seccomp"
    } else {
        ""
    };
    let snapshot = snapshot.map(snapshot_file);
    let mut child = Command::new(WORKER)
        .arg("__worker")
        .arg(format!("--escape-test={port},{first}{hole}"))
        .args(snapshot.as_ref().map(|(_, arg)| arg))
        .args(extra)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mode = match (&snapshot, extra.is_empty()) {
        (Some(_), _) => "load",
        (None, true) => "make",
        // A scientific worker boots plainly.
        (None, false) => "none",
    };
    // The worker has its own copy of the descriptor.
    drop(snapshot);
    write_frame(
        &mut stdin,
        &format!(r#"{{"op":"boot","snapshot":"{mode}"}}"#),
        &[],
    );
    let (ready, mut made) = read_frame(&mut stdout);
    let mut run = observe(&ready, stderr, without_seccomp);
    drop(stdin);
    let status = child.wait().unwrap();
    run.signal = status.signal();
    (run, made.pop())
}

/// Checks a worker's `ready` frame, then reads its probe lines from `stderr` until it ends.
fn observe(ready: &serde_json::Value, stderr: impl Read, without_seccomp: bool) -> Run {
    assert_eq!(ready["kind"], "ready", "{ready}");
    let line = ready["sandbox"].as_str().unwrap_or_default().to_owned();
    if without_seccomp {
        assert!(line.contains("seccomp: off"), "{line}");
        for layer in ["landlock", "userns", "netns", "capabilities", "rlimits"] {
            assert!(
                line.contains(&format!("{layer}: on")),
                "{layer} is off: {line}"
            );
        }
    } else {
        assert_eq!(
            ready["confined"], true,
            "the worker did not seal itself fully: {line}"
        );
    }
    let mut run = Run {
        results: Vec::new(),
        last_trying: None,
        done: false,
        signal: None,
        log: String::new(),
    };
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        run.log.push_str(&line);
        run.log.push('\n');
        let Some(rest) = line.strip_prefix("escape-probe ") else {
            continue;
        };
        let mut words = rest.splitn(3, ' ');
        let (Some(index), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        let outcome = words.next().unwrap_or_default().to_owned();
        if index == "done" {
            run.done = true;
        } else if outcome == "trying" {
            run.last_trying = Some((index.parse().unwrap(), name.to_owned()));
        } else {
            run.last_trying = None;
            run.results
                .push((index.parse().unwrap(), name.to_owned(), outcome));
        }
    }
    run
}

/// A zygote (`__worker --control-fd=N`) that forks workers for the probes: each forked
/// interpreter must be as sealed as a booted one.
struct ForkServer {
    zygote: std::process::Child,
    control: OwnedFd,
    /// The zygote's stderr: it logs how each interpreter it reaped ended.
    log: Arc<Mutex<String>>,
    /// A scientific zygote's scratch root: each child gets a folder of its own there, sent
    /// with its fork request (`fork_into`).
    scratch_root: Option<std::path::PathBuf>,
}

/// What a [`ForkServer`] boots.
enum ZygoteOf<'a> {
    /// Pyodide, restored from this memory snapshot.
    Pyodide(&'a [u8]),
    /// The scientific runtime, its own scratch folder in this root (made here).
    Scientific(&'a std::path::Path),
}

impl ForkServer {
    fn start(port: u16, of: ZygoteOf<'_>, without_seccomp: bool) -> ForkServer {
        let hole = if without_seccomp {
            ",without-seccomp"
        } else {
            ""
        };
        // The zygote's end is inherited (no close-on-exec); ours is not.
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::empty(),
        )
        .unwrap();
        nix::fcntl::fcntl(
            &ours,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
        let (snapshot, args, boot, scratch_root) = match of {
            ZygoteOf::Pyodide(bytes) => {
                let (file, arg) = snapshot_file(bytes);
                (
                    Some(file),
                    vec![arg],
                    r#"{"op":"boot","snapshot":"load"}"#,
                    None,
                )
            }
            ZygoteOf::Scientific(root) => {
                let own = root.join("zygote");
                std::fs::create_dir_all(&own).unwrap();
                let args = scientific_args(&own);
                (
                    None,
                    args,
                    r#"{"op":"boot","snapshot":"none"}"#,
                    Some(root.to_owned()),
                )
            }
        };
        let mut zygote = Command::new(WORKER)
            .arg("__worker")
            .arg(format!("--escape-test={port},stdin{hole}"))
            .arg(format!("--control-fd={}", theirs.as_raw_fd()))
            .args(args)
            .env_clear()
            .env("RUST_LOG", "mcp_run_python=debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop((theirs, snapshot));
        let mut stdin = zygote.stdin.take().unwrap();
        let mut stdout = zygote.stdout.take().unwrap();
        write_frame(&mut stdin, boot, &[]);
        let (ready, _) = read_frame(&mut stdout);
        assert_eq!(ready["kind"], "ready", "{ready}");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = zygote.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        // Forkable once its engine's idle threads ended (about ten seconds).
        let (bytes, _) = receive(&ours, Duration::from_secs(180));
        let forkable: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        assert_eq!(forkable["kind"], "forkable", "{}", log.lock().unwrap());
        // Kept open for the zygote's life: it boots once and is never asked anything else.
        std::mem::forget((stdin, stdout));
        ForkServer {
            zygote,
            control: ours,
            log,
            scratch_root,
        }
    }

    /// Forks one interpreter that runs the probes from `first`.
    fn run(&self, first: usize, without_seccomp: bool) -> Run {
        let (in_r, in_w) = nix::unistd::pipe().unwrap();
        let (out_r, out_w) = nix::unistd::pipe().unwrap();
        let (err_r, err_w) = nix::unistd::pipe().unwrap();
        let mut fds = vec![in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
        let scratch = self
            .scratch_root
            .as_ref()
            .map(|root| tempfile::tempdir_in(root).unwrap());
        let folder = scratch
            .as_ref()
            .map(|dir| std::fs::File::open(dir.path()).unwrap());
        fds.extend(folder.as_ref().map(|f| f.as_raw_fd()));
        let request: &[u8] = match folder {
            Some(_) => br#"{"kind":"fork_into"}"#,
            None => br#"{"kind":"fork"}"#,
        };
        sendmsg::<()>(
            self.control.as_raw_fd(),
            &[IoSlice::new(request)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        drop((in_r, out_w, err_w, folder));
        let (bytes, _pidfd) = receive(&self.control, Duration::from_secs(30));
        let forked: serde_json::Value = serde_json::from_slice(&bytes).expect("a control message");
        let pid = forked["pid"].as_u64().expect("a pid") as u32;
        let mut stdin = std::fs::File::from(in_w);
        writeln!(stdin, "{first}").unwrap();
        let mut stdout = std::fs::File::from(out_r);
        let (ready, _) = read_frame(&mut stdout);
        if !without_seccomp && self.scratch_root.is_none() {
            // The kernel tracks the pages it writes (src/interpreter/dirty_pages.rs), through the
            // only ioctl calls the filter allows.
            let line = ready["sandbox"].as_str().unwrap_or_default();
            assert!(
                line.contains("ioctl on 2 page-tracking descriptors only"),
                "{line}"
            );
        }
        let mut run = observe(&ready, std::fs::File::from(err_r), without_seccomp);
        drop(stdin);
        // Only the zygote sees how its child ended: it logs it when it reaps it.
        let ended = format!("interpreter {pid} ended: ");
        for _ in 0..200 {
            let log = self.log.lock().unwrap().clone();
            if let Some(rest) = log.split(&ended).nth(1) {
                let how = rest.lines().next().unwrap_or_default();
                run.signal = how
                    .strip_prefix("signal ")
                    .and_then(|n| n.trim_end_matches('"').parse().ok());
                return run;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the zygote never reaped {pid}:\n{}",
            self.log.lock().unwrap()
        );
    }
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        let _ = self.zygote.kill();
        let _ = self.zygote.wait();
    }
}

/// One message from the control socket, waited for at most `timeout`.
fn receive(control: &OwnedFd, timeout: Duration) -> (Vec<u8>, Vec<OwnedFd>) {
    let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
    let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut waited = Duration::ZERO;
    while poll(&mut fds, PollTimeout::from(millis.min(1000))).unwrap() == 0 {
        waited += Duration::from_millis(u64::from(millis.min(1000)));
        assert!(waited < timeout, "no message from the zygote");
    }
    let mut buf = [0u8; 512];
    let mut space = nix::cmsg_space!([RawFd; 3]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        control.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .unwrap();
    let mut owned = Vec::new();
    for cmsg in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: just received; owned once, here.
            owned.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let n = msg.bytes;
    (buf[..n].to_vec(), owned)
}

/// What every probe came to, in order: `(name, outcome)`, where the outcome is `blocked errno
/// N`, `ALLOWED …` or `killed by SIGSYS (seccomp)`.
struct Outcomes {
    results: Vec<(String, String)>,
    connected: bool,
    wrote: bool,
}

impl Outcomes {
    fn allowed(&self) -> Vec<&str> {
        self.results
            .iter()
            .filter(|(_, o)| o.starts_with("ALLOWED"))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    fn report(&self) -> String {
        let lines: Vec<String> = self
            .results
            .iter()
            .enumerate()
            .map(|(i, (n, o))| format!("{i:2} {n}: {o}"))
            .collect();
        lines.join("\n")
    }
}

/// Which workers run the probes.
#[derive(Clone, Copy, PartialEq)]
enum Workers {
    /// Booted Pyodide workers.
    Booted,
    /// Pyodide interpreters forked from one zygote.
    Forked,
    /// Scientific workers (wasmtime), whose guest may open files beneath its own folders.
    Scientific,
    /// Scientific workers forked from one scientific zygote, each with its own folder.
    ForkedScientific,
}

/// Runs every probe, in as many workers as the probes that kill one take.
fn probe_all(without_seccomp: bool, workers: Workers) -> Outcomes {
    let scratch = tempfile::tempdir().unwrap();
    let extra = match workers {
        Workers::Scientific => scientific_args(scratch.path()),
        Workers::Booted | Workers::Forked | Workers::ForkedScientific => Vec::new(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connected = Arc::new(AtomicBool::new(false));
    let seen = connected.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    listener.set_nonblocking(true).unwrap();
    let watcher = std::thread::spawn(move || {
        while !stopped.load(Ordering::SeqCst) {
            if listener.accept().is_ok() {
                seen.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let written = "/tmp/mcp-run-python-escape-test";
    let _ = std::fs::remove_file(written);

    let mut snapshot: Option<Vec<u8>> = None;
    let fork_server = match workers {
        Workers::Forked => {
            // A snapshot for the zygote, from a worker that runs no probe past the last.
            let (_, made) = run_worker(port, usize::MAX, None, without_seccomp);
            let snapshot = made.expect("a worker makes a snapshot");
            let of = ZygoteOf::Pyodide(&snapshot);
            Some(ForkServer::start(port, of, without_seccomp))
        }
        Workers::ForkedScientific => {
            let of = ZygoteOf::Scientific(scratch.path());
            Some(ForkServer::start(port, of, without_seccomp))
        }
        Workers::Booted | Workers::Scientific => None,
    };
    let mut first = 0;
    let mut results = Vec::new();
    loop {
        let run = if let Some(fork_server) = &fork_server {
            fork_server.run(first, without_seccomp)
        } else {
            let (run, made) =
                run_worker_with(port, first, snapshot.as_deref(), without_seccomp, &extra);
            if snapshot.is_none() && workers == Workers::Booted {
                snapshot = Some(made.expect("the first worker makes a snapshot"));
            }
            run
        };
        for (index, name, outcome) in &run.results {
            assert_eq!(*index, results.len(), "{}", run.log);
            results.push((name.clone(), outcome.clone()));
        }
        if run.done {
            break;
        }
        let Some((index, name)) = run.last_trying else {
            panic!("the worker stopped without a result:\n{}", run.log);
        };
        assert_eq!(
            run.signal,
            Some(libc::SIGSYS),
            "{name} ended the worker, but not by seccomp:\n{}",
            run.log
        );
        results.push((name, "killed by SIGSYS (seccomp)".to_owned()));
        first = index + 1;
    }
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let wrote = std::path::Path::new(written).exists();
    let _ = std::fs::remove_file(written);
    Outcomes {
        results,
        connected: connected.load(Ordering::SeqCst),
        wrote,
    }
}

#[test]
fn a_sealed_worker_cannot_escape() {
    no_probe_escapes(Workers::Booted);
}

/// Every probe fails in sealed `workers`: nothing allowed, no connection, no file written.
fn no_probe_escapes(workers: Workers) {
    let outcomes = probe_all(false, workers);
    eprintln!("{}", outcomes.report());
    assert!(
        outcomes.allowed().is_empty(),
        "escapes:\n{}",
        outcomes.report()
    );
    assert!(!outcomes.connected, "the worker reached the listener");
    assert!(!outcomes.wrote, "the worker wrote a file");
}

/// The other layers alone, as if the seccomp filter had a hole: Landlock, the namespaces and
/// the dropped capabilities still keep the host's files, network and processes out of reach.
/// What only seccomp stops (new processes, new namespaces, io_uring) is listed, not hidden.
#[test]
fn without_seccomp_the_other_layers_still_hold() {
    layers_without_seccomp_hold(Workers::Booted);
}

/// The same for an interpreter forked from the zygote: its own Landlock domain, and the
/// zygote's namespaces and empty capability sets, keep the host and its siblings out of reach.
#[test]
fn without_seccomp_a_forked_interpreter_still_holds() {
    layers_without_seccomp_hold(Workers::Forked);
}

/// A scientific worker is sealed like a Pyodide one: its filter lets it open files, but only
/// Landlock's folders are reachable, and every probe fails.
#[test]
fn a_sealed_scientific_worker_cannot_escape() {
    no_probe_escapes(Workers::Scientific);
}

/// The same without its seccomp filter: Landlock, the namespaces and the dropped
/// capabilities hold.
#[test]
fn without_seccomp_a_scientific_worker_still_holds() {
    layers_without_seccomp_hold(Workers::Scientific);
}

/// A scientific worker forked from its zygote, in its own folder, is sealed like a booted one.
#[test]
fn a_forked_scientific_worker_cannot_escape() {
    no_probe_escapes(Workers::ForkedScientific);
}

/// The same without its seccomp filter: its own Landlock domain (its folder and the
/// artifacts), and the zygote's namespaces and empty capability sets hold.
#[test]
fn without_seccomp_a_forked_scientific_worker_still_holds() {
    layers_without_seccomp_hold(Workers::ForkedScientific);
}

fn layers_without_seccomp_hold(workers: Workers) {
    let outcomes = probe_all(true, workers);
    eprintln!("{}", outcomes.report());
    /// Stopped by seccomp alone: each is harmless under the other layers (a child or a
    /// namespace inherits every one of them; an ioctl or a read reaches only the worker's own
    /// descriptors), but none is needed, so the filter forbids it. A userfaultfd that handles
    /// the kernel's faults is refused without the filter by `vm.unprivileged_userfaultfd`
    /// (0 by default), a setting of the host rather than a layer of ours.
    const SECCOMP_ONLY: [&str; 6] = [
        "fork",
        "unshare_user_namespace",
        "io_uring_setup",
        "userfaultfd_with_kernel_faults",
        "ioctl_other_descriptor",
        "read_page_map",
    ];
    let escapes: Vec<&str> = outcomes
        .allowed()
        .into_iter()
        .filter(|n| !SECCOMP_ONLY.contains(n))
        .collect();
    assert!(escapes.is_empty(), "escapes:\n{}", outcomes.report());
    assert!(!outcomes.connected, "the worker reached the listener");
    assert!(!outcomes.wrote, "the worker wrote a file");
    for (name, outcome) in &outcomes.results {
        assert!(
            !outcome.starts_with("killed"),
            "{name} killed a worker that has no seccomp filter: {outcome}"
        );
    }
}

/// An interpreter forked from the zygote is sealed like a booted worker: every probe fails.
#[test]
fn a_forked_interpreter_cannot_escape() {
    no_probe_escapes(Workers::Forked);
}
