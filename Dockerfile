# syntax=docker/dockerfile:1
# mcp-run-python as a container image (README "Running many replicas", deploy/README.md).
#
#   docker build -t mcp-run-python:0.1.0 .
#   docker run --rm -p 3001:3001 mcp-run-python:0.1.0            # streamable HTTP, --stateful, on 0.0.0.0:3001
#
# Two stages:
#  - builder: Rust on Debian 12 (bookworm). scripts/setup.sh installs JavaScriptCore
#    (libjavascriptcoregtk-4.1-0, which the workers open at run time) and fetches the pinned
#    Pyodide from the npm registry, checked against its sha512 (skipped when the build context
#    already holds a verified pyodide-assets/); then the release binary is built with the
#    locked dependencies. Pyodide is embedded in the binary.
#  - runtime: Debian 12 slim with only the shared libraries the binary loads
#    (libjavascriptcoregtk-4.1-0 pulls in ICU and GLib), root certificates for package downloads,
#    tini as PID 1, a non-root user, and the binary.
#
# The base images are build arguments so that a mirror or a locally made image can stand in
# (deploy/README.md, "Building the image"). The seccomp profile a container runs under decides
# whether the workers get their namespaces: see deploy/kubernetes/statefulset.yaml.

# checkov:skip=CKV_DOCKER_7:the FROM lines name these build arguments, whose defaults carry explicit tags
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# What scripts/setup.sh would install, in a layer of its own so that a source change does not
# repeat it; the same reason as in the runtime stage for not pinning versions.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       libjavascriptcoregtk-4.1-0 \
    && rm -rf /var/lib/apt/lists/*
COPY . .
# Pyodide: kept from the build context's pyodide-assets/ when its integrity stamp matches the
# pin, else fetched from the npm registry and checked against the pinned sha512.
RUN scripts/setup.sh
# The cache mounts keep cargo's downloads and build between image builds (BuildKit, Buildah).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && install -D -m 0755 target/release/mcp-run-python /out/mcp-run-python

FROM ${RUNTIME_IMAGE} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Package versions are not pinned one by one: the base image's Debian release (bookworm) is the
# pin, and Debian replaces webkit2gtk (JavaScriptCore) in the archive at every security update,
# so an exact version would stop resolving within weeks.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       libjavascriptcoregtk-4.1-0 ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --no-log-init --uid 10001 --user-group --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin mcp \
    && install -d -o 10001 -g 10001 -m 0700 /var/cache/mcp-run-python /var/lib/mcp-run-python/state
COPY --from=builder /out/mcp-run-python /usr/local/bin/mcp-run-python
# The download cache and the Pyodide memory snapshot (<cache-dir>/snapshots/, 30 MiB, made at
# the first start) go here; mount a writable volume when the root file system is read-only.
ENV XDG_CACHE_HOME=/var/cache
USER 10001:10001
EXPOSE 3001
# tini is PID 1: it forwards SIGTERM to the server (which drains) and reaps any orphan, such as
# an interpreter whose zygote died before it could reap it.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/mcp-run-python"]
CMD ["streamable-http", "--host", "0.0.0.0", "--port", "3001", "--stateful", \
     "--cache-dir", "/var/cache/mcp-run-python"]
# For `docker run` (Kubernetes ignores it and probes /healthz and /readyz itself,
# deploy/kubernetes/statefulset.yaml): GET /healthz on the default port through bash's /dev/tcp,
# as the image has no HTTP client. Change the port here when the command changes it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/3001 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
