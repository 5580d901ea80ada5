#!/usr/bin/env bash
# The README's "Write your own controller" as a new user meets it: a crate outside this workspace
# made from the README's text alone (the `<!-- walkthrough: Cargo.toml -->` block for its
# dependencies, the `<!-- walkthrough: examples/src/bin/greeter.rs -->` block for its main.rs),
# built with its `path` dependency pointed at this checkout, then run against kinformer-apiserver
# until it has reconciled a Greeting into a ConfigMap holding the Greeting's message.
#
# Usage: .ci/fresh-clone.sh   (needs kubectl on PATH; CI runs it after `cargo test --workspace`)
#
# Two things are not from the README, and neither changes what is checked:
# - the crate shares this workspace's target directory and Cargo.lock, and is built with the workspace's
#   [profile.dev] settings (passed with --config), so the dependencies the workspace already
#   compiled with the same features are reused rather than compiled a second time;
# - KINFORMER_APISERVER may name an already built kinformer-apiserver (CI passes the one
#   `cargo test --workspace` built); without it the script builds it with the README's command.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The README's two marked blocks.
python3 - "$root/README.md" "$work/greeter" "$root/kinformer" <<'EOF'
import os, re, sys
readme, dest, kinformer = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(readme).read()
def block(marker, lang):
    head = "<!-- walkthrough: %s -->\n```%s\n" % (marker, lang)
    if text.count(head) != 1:
        sys.exit("README.md: expected one block marked %r" % marker)
    return text.split(head, 1)[1].split("\n```\n", 1)[0] + "\n"
deps = block("Cargo.toml", "toml")
main = block("examples/src/bin/greeter.rs", "rust")
# The README's kinformer line is a path dependency on a clone beside the crate: point it here.
line = re.compile(r'^(kinformer\s*=\s*\{.*\bpath\s*=\s*)"[^"]*"', re.M)
if len(line.findall(deps)) != 1:
    sys.exit("README.md: the Cargo.toml block has no `kinformer = { path = ... }` line")
deps = line.sub(lambda m: m.group(1) + '"%s"' % kinformer, deps)
os.makedirs(os.path.join(dest, "src"))
with open(os.path.join(dest, "Cargo.toml"), "w") as f:
    f.write('[package]\nname = "readme-greeter"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n')
    f.write(deps)
    # A workspace of its own: not a member of any workspace above the temporary directory.
    f.write("\n[workspace]\n")
with open(os.path.join(dest, "src", "main.rs"), "w") as f:
    f.write(main)
EOF
cp "$root/Cargo.lock" "$work/greeter/Cargo.lock"
echo "--- fresh-clone: the README's controller crate:"
sed 's/^/    /' "$work/greeter/Cargo.toml"

echo "--- fresh-clone: cargo build (outside the workspace, target/ shared)"
# From the crate's directory, as a user builds it: this workspace's .cargo/config.toml (its
# K8S_OPENAPI_ENABLED_VERSION) does not apply; the README's `v1_33` feature chooses the version.
(cd "$work/greeter" && CARGO_TARGET_DIR="$target" cargo build \
  --config 'profile.dev.debug="line-tables-only"' \
  --config 'profile.dev.package."*".opt-level=1' \
  --config 'profile.dev.package."*".debug=false')
greeter="$target/debug/readme-greeter"
echo "--- fresh-clone: built after $(elapsed)"

apiserver=${KINFORMER_APISERVER:-}
if [ -z "$apiserver" ] || [ ! -x "$apiserver" ]; then
  cargo build -p kinformer-envtest --bin kinformer-apiserver
  apiserver="$target/debug/kinformer-apiserver"
fi

# The API server, as the README's "The API server on its own" starts it.
"$apiserver" --listen 127.0.0.1:0 --kubeconfig "$work/kubeconfig" >"$work/apiserver.log" 2>&1 &
pids+=($!)
export KUBECONFIG="$work/kubeconfig"
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND until it succeeds
  local deadline=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "error: fresh-clone: $what did not happen within the deadline"
      echo "--- apiserver log:"; tail -20 "$work/apiserver.log" || true
      echo "--- greeter log:"; tail -40 "$work/greeter.log" 2>/dev/null || true
      exit 1
    fi
    sleep 0.2
  done
}
wait_for 60 "kinformer-apiserver writing its kubeconfig" test -s "$work/kubeconfig"
wait_for 60 "kinformer-apiserver answering" kubectl get --raw /readyz

# The controller, with its default metrics and probe ports (0.0.0.0:8080 and :8081).
"$greeter" >"$work/greeter.log" 2>&1 &
pids+=($!)
wait_for 60 "the greeter installing the Greeting CRD" kubectl get crd greetings.example.com
cat >"$work/greeting.yaml" <<'EOF'
apiVersion: example.com/v1
kind: Greeting
metadata:
  name: hello
  namespace: default
spec:
  message: hello from the README
EOF
wait_for 30 "kubectl creating a Greeting" kubectl apply -f "$work/greeting.yaml"

has_message() {
  [ "$(kubectl get configmap hello -n default -o 'jsonpath={.data.message}')" = "hello from the README" ] &&
    [ "$(kubectl get configmap hello -n default -o 'jsonpath={.metadata.ownerReferences[0].kind}')" = "Greeting" ]
}
wait_for 60 "the greeter reconciling Greeting default/hello into ConfigMap hello" has_message
grep -q 'reconciled' "$work/greeter.log" || {
  echo "error: fresh-clone: the greeter logged no reconcile line"; tail -40 "$work/greeter.log"; exit 1
}
echo "--- fresh-clone: the README's controller reconciled default/hello into its ConfigMap ($(elapsed) in all)"
grep -m1 'reconciled' "$work/greeter.log" | sed 's/^/    /'
