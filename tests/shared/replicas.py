"""Several replicas of the real binary behind a real HAProxy started with the shipped
deploy/haproxy.cfg (README "Running many replicas"), on loopback ports: `streamable-http --stateful --state-dir` on a
shared temporary directory. Standard library only, so that both client suites use it
(tests/sdk_v1 with the 1.x clients, tests/sdk_v2 with today's)."""

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from real_binary import BINARY, INIT_TIMEOUT, LOOPBACK, POLL_INTERVAL, SHARED_CACHE, STOP_TIMEOUT, server_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy.cfg"
# Seconds to wait for every replica's /readyz to say 200 (three zygotes booting at once on two
# cores take longer than one).
READY_TIMEOUT = 180
# Seconds HAProxy needs to see a replica that turned ready again as UP: deploy/haproxy.cfg checks
# every second and wants 2 good answers in a row (`inter 1s rise 2`), plus a margin.
BALANCER_SETTLE = 3


def free_port():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, what):
    deadline = time.monotonic() + INIT_TIMEOUT
    while True:
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start")
            time.sleep(POLL_INTERVAL)


def status_of(url):
    """The HTTP status of a GET of `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def get_text(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


class Replica:
    """One replica: its process, base URL and log file."""

    def __init__(self, state_dir, log_dir, n, *args):
        self.port = free_port()
        self.base = f"http://{LOOPBACK}:{self.port}"
        self.log = pathlib.Path(log_dir) / f"replica-{n}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [BINARY, "streamable-http", "--host", LOOPBACK, "--port", str(self.port),
                 "--cache-dir", SHARED_CACHE, "--stateful", "--state-dir", str(state_dir), *args],
                env=server_env(), stderr=log)
        wait_for_port(self.port, self.proc, f"replica {n}")

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def metrics(self):
        return get_text(f"{self.base}/metrics")


@contextlib.contextmanager
def cluster(n=3, *args):
    """`n` replicas sharing a state directory behind HAProxy; yields (HAProxy's base URL, the
    replicas). Every replica still running at the end must stop cleanly on SIGTERM."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(haproxy):
        raise RuntimeError("haproxy is not installed (scripts/test.sh installs Debian's package)")
    with tempfile.TemporaryDirectory(prefix="mcp-replicas-") as tmp:
        state = pathlib.Path(tmp) / "state"
        replicas = []
        proxy = None
        try:
            for i in range(n):
                replicas.append(Replica(state, tmp, i + 1, *args))
            # Started once every replica is ready, so that HAProxy's first checks find them UP.
            wait_ready(replicas, settle=0)
            port = free_port()
            env = {**server_env(), "MCP_LB_BIND": f"{LOOPBACK}:{port}"}
            for i, replica in enumerate(replicas):
                env[f"MCP_REPLICA_{i + 1}"] = f"{LOOPBACK}:{replica.port}"
            proxy_log = open(pathlib.Path(tmp) / "haproxy.log", "wb")
            proxy = subprocess.Popen([haproxy, "-db", "-f", str(HAPROXY_CONFIG)], env=env,
                                     stdout=proxy_log, stderr=subprocess.STDOUT)
            wait_for_port(port, proxy, "haproxy")
            yield f"http://{LOOPBACK}:{port}", replicas
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait(timeout=STOP_TIMEOUT)
            codes = [r.stop() for r in replicas]
            for r in replicas:
                if r.proc.returncode not in (0, -signal.SIGKILL):
                    print(r.log.read_text()[-5000:])
            assert all(c in (0, -signal.SIGKILL) for c in codes), codes


def wait_ready(replicas, timeout=READY_TIMEOUT, settle=BALANCER_SETTLE):
    """Waits until every replica's /readyz says 200 (its zygote and a spare are ready), then
    `settle` seconds for the balancer to see it (a replica briefly out of spares is NOLB there)."""
    deadline = time.monotonic() + timeout
    for replica in replicas:
        while status_of(f"{replica.base}/readyz") != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replica.base} did not become ready")
            time.sleep(0.2)
    time.sleep(settle)
