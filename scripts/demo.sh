#!/usr/bin/env bash
# `make demo`: the operator's main job end to end, on a private local control plane in
# target/demo (never the one `make cluster-up` or the tests use). Pods run on fake nodes (kube-
# scheduler places them, kwok plays their kubelet), so a reload really replaces old pods with new
# ones: that is what the demo waits for and shows, with the policy reaching RolledOut.
set -Eeuo pipefail

# A relative DEMO_OPERATOR is relative to where the demo was started.
if [ -n "${DEMO_OPERATOR:-}" ]; then DEMO_OPERATOR=$(realpath -- "$DEMO_OPERATOR"); fi
cd "$(dirname "$0")/.."
ROOT=$PWD
DEMO_DIR=$ROOT/target/demo
TESTENV=$ROOT/target/testenv/bin/testenv
KUBECTL=$ROOT/target/testenv/bin/kubectl
OPERATOR=${DEMO_OPERATOR:-$ROOT/target/debug/reloader}
OPERATOR_LOG=$DEMO_DIR/reloader.log
OPERATOR_PIDFILE=$DEMO_DIR/reloader.pid
NS=reloader-demo
TIMEOUT=${DEMO_TIMEOUT:-60}  # seconds for each wait
MAKE=${MAKE:-make}
# Only ever talk to the demo's own cluster.
export KUBECONFIG=$DEMO_DIR/kubeconfig

STEPS=11
step_no=0
now_ms() { echo $(($(date +%s%N) / 1000000)); }
since() { local ms=$(($(now_ms) - $1)); printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100)); }
started=$(now_ms)
run_started=
step() { step_no=$((step_no + 1)); echo; echo "[$step_no/$STEPS] $*"; }
info() { echo "    $*"; }
indent() { sed 's/^/    /'; }
fail() { echo "demo: FAILED: $*" >&2; exit 1; }
k() { "$KUBECTL" -n "$NS" "$@"; }

operator_pid=
cluster_started=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM ERR
  set +e
  echo
  if [ "$rc" -ne 0 ] && [ -f "$OPERATOR_LOG" ]; then
    echo "---- last lines of the operator log ($OPERATOR_LOG) ----" >&2
    tail -n 40 "$OPERATOR_LOG" >&2
    echo "---- control plane logs: $DEMO_DIR/logs ----" >&2
  fi
  echo "cleanup: stopping the operator and the demo control plane"
  if [ -n "$operator_pid" ] && kill -0 "$operator_pid" 2>/dev/null; then
    kill -TERM "$operator_pid"
    for _ in $(seq 50); do kill -0 "$operator_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$operator_pid" 2>/dev/null
    wait "$operator_pid" 2>/dev/null
  fi
  rm -f "$OPERATOR_PIDFILE"
  if [ -n "$cluster_started" ]; then "$TESTENV" down --dir "$DEMO_DIR" | indent; fi
  if [ "$rc" -eq 0 ]; then
    echo "demo: passed in $(since "$started") (after the builds: $(since "$run_started"))"
  else
    echo "demo: failed (exit $rc); operator log kept at $OPERATOR_LOG" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "demo: FAILED: this command exited non-zero: $BASH_COMMAND" >&2' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_for DESCRIPTION COMMAND...: runs COMMAND every half second until it succeeds or TIMEOUT.
wait_for() {
  local what=$1; shift
  local deadline=$(($(date +%s) + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$operator_pid" ] && ! kill -0 "$operator_pid" 2>/dev/null; then
      fail "the operator exited while waiting for $what"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.5
  done
}

rs_count() { k get rs -l "app=$1" -o name | grep -c .; }
has_replicasets() { [ "$(rs_count "$1")" -ge "$2" ]; }
has_annotation() {
  [ -n "$(k get deploy "$1" -o "jsonpath={.metadata.annotations.${2//./\\.}}")" ]
}
# Bash's /dev/tcp, so a fresh CI machine needs no curl; a subshell, so the socket closes with it.
readyz() (
  reply=
  exec 3<>"/dev/tcp/${1%:*}/${1##*:}"
  printf 'GET /readyz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$1" >&3
  read -r -t 2 reply <&3 || true
  [[ $reply == HTTP/1.?" 200"* ]]
)
events_for() {
  local name
  for name in "$@"; do
    [ -n "$(k get events --field-selector "reason=Reloaded,involvedObject.name=$name" -o name)" ] || return 1
  done
}
policy_reloaded() { [ "$(k get rp "$1" -o 'jsonpath={.status.reloadCount}')" -ge 1 ] 2>/dev/null; }
show_replicasets() {
  k get rs -l "app=$1" --sort-by=.metadata.creationTimestamp -o custom-columns='REPLICASET:.metadata.name,REVISION:.metadata.annotations.deployment\.kubernetes\.io/revision,POD-TEMPLATE-HASH:.metadata.labels.pod-template-hash,DESIRED:.spec.replicas,CREATED:.metadata.creationTimestamp' | indent
}
# Pods of app=$1 not being deleted, by name.
live_pods() {
  k get pods -l "app=$1" -o 'jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' | awk 'NF==1{print $1}' | sort
}
ready_pods() {
  k get pods -l "app=$1" -o 'jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | awk '$2=="True"{n++} END{print n+0}'
}
target_rolled_out() { [ "$(k get rp "$1" -o 'jsonpath={.status.targets[0].rollout}')" = RolledOut ]; }
all_ready() { [ "$(ready_pods "$1")" -ge "$2" ]; }
show_pods() {
  k get pods -l "app=$1" --sort-by=.metadata.creationTimestamp -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,READY:.status.conditions[?(@.type=="Ready")].status,CREATED:.metadata.creationTimestamp' | indent
}
show_env() {
  k get deploy "$1" -o 'jsonpath={range .spec.template.spec.containers[*].env[*]}{.name}={.value}{"\n"}{end}' | indent
}

mkdir -p "$DEMO_DIR"
echo "make demo: the operator rolls two Deployments when their ConfigMap and Secret change,"
echo "on a private control plane in ${DEMO_DIR#"$ROOT"/}."

step "Build the local control plane and kubectl (make testenv)"
if [ ! -x "$TESTENV" ]; then
  info "first run: this compiles etcd, kube-apiserver, kube-controller-manager and kubectl from the"
  info "official Kubernetes Go modules; it takes several minutes (later runs are cached)"
fi
"$MAKE" -s --no-print-directory testenv kubectl | indent
info "$("$TESTENV" version), kubectl at ${KUBECTL#"$ROOT"/}"

step "Build the operator"
if [ -n "${DEMO_OPERATOR:-}" ]; then
  [ -x "$OPERATOR" ] || fail "DEMO_OPERATOR=$OPERATOR is not an executable"
  info "using DEMO_OPERATOR=$OPERATOR"
else
  info "cargo build --locked --bin reloader"
  cargo build --locked --bin reloader 2>&1 | { grep -Ev '^\s*(Compiling|Blocking)' || true; } | indent
fi

step "Start a private control plane in ${DEMO_DIR#"$ROOT"/}"
run_started=$(now_ms)
# A run that was killed hard may have left its operator or cluster behind.
if [ -f "$OPERATOR_PIDFILE" ]; then
  old=$(cat "$OPERATOR_PIDFILE")
  if [ "$(readlink "/proc/$old/exe" 2>/dev/null)" = "$(readlink -f "$OPERATOR")" ]; then
    info "stopping the operator a previous run left behind (pid $old)"
    kill -TERM "$old" 2>/dev/null || true
  fi
  rm -f "$OPERATOR_PIDFILE"
fi
"$TESTENV" down --dir "$DEMO_DIR" >/dev/null
cluster_started=1
"$TESTENV" up --dir "$DEMO_DIR" --detach | indent

step "Install the ReloadPolicy CRD"
"$KUBECTL" apply --server-side -f crd/reloadpolicy.yaml | indent
"$KUBECTL" wait --for condition=Established --timeout "${TIMEOUT}s" crd/reloadpolicies.reloader.rs | indent

step "Start the operator"
# Port 0: the kernel picks a free loopback port; the operator logs the address it bound.
# Emptied first, so the address grep below never reads a previous run's log.
: >"$OPERATOR_LOG"
NO_COLOR=1 "$OPERATOR" --log-format plain --metrics-addr 127.0.0.1:0 >"$OPERATOR_LOG" 2>&1 &
operator_pid=$!
echo "$operator_pid" >"$OPERATOR_PIDFILE"
logged_address() { grep -q 'address=127\.0\.0\.1:[0-9]' "$OPERATOR_LOG"; }
wait_for "the operator to log its HTTP address" logged_address
addr=$(grep -o 'address=127\.0\.0\.1:[0-9]*' "$OPERATOR_LOG" | head -n1 | cut -d= -f2)
wait_for "the operator's /readyz at $addr" readyz "$addr"
info "pid $operator_pid, ready at http://$addr/readyz, log ${OPERATOR_LOG#"$ROOT"/}"

step "Apply examples/demo and wait for the first ReplicaSets"
"$KUBECTL" create namespace "$NS" | indent
k apply --server-side -f examples/demo/ | indent
for app in web api; do wait_for "the first ReplicaSet of deployment/$app" has_replicasets "$app" 1; done
# The operator records the hashes it has seen on each workload; changing the sources before that
# baseline exists would make the change the baseline, and nothing would roll.
wait_for "the baseline on deployment/web" has_annotation web reloader.rs/source-hashes
wait_for "the baseline on deployment/api" has_annotation api reloader.rs/policy-hashes
"$KUBECTL" wait -n "$NS" --for condition=Ready --timeout "${TIMEOUT}s" rp/api-credentials | indent
for app in web api; do wait_for "two Ready pods of deployment/$app" all_ready "$app" 2; done
info "the operator recorded what each Deployment has seen (annotations reloader.rs/source-hashes"
info "on web, reloader.rs/policy-hashes on api); nothing rolled. Pods run on kwok's fake nodes:"
k get deployments,replicasets,pods -o wide | indent
web_before=$(live_pods web)
api_before=$(live_pods api)

step "Change the ConfigMap's data and the Secret's data"
changed_at=$(now_ms)
k patch configmap demo-config --type merge -p '{"data":{"greeting":"hello, changed"}}' | indent
# stringData is written into data by the API server; the value is never printed.
k patch secret demo-secret --type merge -p '{"stringData":{"password":"rotated-password"}}' | indent

step "Wait for the operator to roll both Deployments"
for app in web api; do
  wait_for "a new ReplicaSet of deployment/$app (the operator did not roll it)" has_replicasets "$app" 2
  info "deployment/$app: new ReplicaSet $(since "$changed_at") after the change"
done

step "Wait for the rollouts to finish: old pods replaced by new ones"
"$KUBECTL" -n "$NS" rollout status deploy/web --timeout "${TIMEOUT}s" | indent
# The policy's RolledOut condition: False while a target rolls, True once every one has.
wait_for "reloadpolicy/api-credentials to report its target rolled out" target_rolled_out api-credentials
"$KUBECTL" -n "$NS" wait --for condition=RolledOut --timeout "${TIMEOUT}s" rp/api-credentials | indent
info "rolled out $(since "$changed_at") after the change"
replaced=0
for app in web api; do
  case $app in web) before=$web_before ;; api) before=$api_before ;; esac
  after=$(live_pods "$app")
  gone=$(comm -23 <(echo "$before") <(echo "$after") | grep -c . || true)
  new=$(comm -13 <(echo "$before") <(echo "$after") | grep -c . || true)
  [ "$gone" -ge 2 ] && [ "$new" -ge 2 ] || fail "deployment/$app: expected its 2 old pods replaced, $gone gone and $new new"
  replaced=$((replaced + gone))
  info "deployment/$app: $gone old pods replaced by $new new ones:"
  show_pods "$app" | indent
done
info "pods replaced in all: $replaced"

step "What the operator did"
for app in web api; do
  case $app in
    web) echo "    deployment/web (annotation reloader.stakater.com/auto: \"true\", uses ConfigMap demo-config):" ;;
    api) echo "    deployment/api (selected by ReloadPolicy api-credentials, watches Secret demo-secret):" ;;
  esac
  show_replicasets "$app" | indent
  echo "      pod template env written by the operator (hashes of the source data):"
  show_env "$app" | indent
done
wait_for "a Reloaded Event on each Deployment" events_for web api
wait_for "the policy's status to count the reload" policy_reloaded api-credentials
echo "    Events:"
k get events --sort-by=.lastTimestamp \
  -o custom-columns='OBJECT:.involvedObject.kind,NAME:.involvedObject.name,REASON:.reason,MESSAGE:.message' |
  awk 'NR==1 || $3=="Reloaded"' | indent | indent
echo "    kubectl get reloadpolicies:"
k get reloadpolicies | indent | indent
echo "    status of reloadpolicy/api-credentials:"
k get rp api-credentials -o 'jsonpath={range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}reloadCount={.status.reloadCount}{"\n"}' | indent | indent

step "Tear down: stop the operator and the control plane"
