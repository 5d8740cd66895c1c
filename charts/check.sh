#!/usr/bin/env bash
# Lint and render charts/dbservice-operator with the default values and every ci/*-values.yaml.
# Usage: charts/check.sh            (helm from $HELM, .cluster/bin, the build cache, or PATH)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
chart="$here/dbservice-operator"

# shellcheck source=/dev/null
source "$root/tests/cluster/versions.sh"
helm="${HELM:-}"
if [[ -z "$helm" ]]; then
  for c in "$root/.cluster/bin/helm" "${CACHE_ROOT:-$HOME/.cache/dbservice-operator}/helm-${HELM_VERSION:-v3.22.0}/helm"; do
    [[ -x "$c" ]] && { helm="$c"; break; }
  done
fi
helm="${helm:-helm}"

# helm template assumes an old Kubernetes unless told: render for the one the suites run, so that the
# chart's kubeVersion passes and every check below fails only for the reason it names.
template() { "$helm" template "$@" --kube-version "$KUBERNETES_VERSION"; }

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

run() {
  local name="$1"; shift
  "$helm" lint --strict --kube-version "$KUBERNETES_VERSION" "$chart" "$@" >"$out/$name.lint" 2>&1 || { cat "$out/$name.lint"; echo "FAIL lint $name"; exit 1; }
  template dbservice-operator "$chart" --namespace dbservice-system "$@" >"$out/$name.yaml" 2>"$out/$name.err" \
    || { cat "$out/$name.err"; echo "FAIL template $name"; exit 1; }
  echo "ok   $name ($(grep -c '^kind:' "$out/$name.yaml") objects)"
}

run default
for f in "$chart"/ci/*-values.yaml; do
  run "$(basename "$f" -values.yaml)" -f "$f"
done

# The oldest Kubernetes tested (tests/cluster/oldest.sh) installs it; the minor before is refused.
"$helm" template x "$chart" --kube-version "$OLDEST_KUBERNETES_VERSION" >/dev/null || { echo "FAIL on $OLDEST_KUBERNETES_VERSION"; exit 1; }
older="$(echo "$OLDEST_KUBERNETES_VERSION" | awk -F. '{printf "%s.%d.0", $1, $2 - 1}')"
refusal="$("$helm" template x "$chart" --kube-version "$older" 2>&1 >/dev/null || true)"
grep -q "chart requires kubeVersion" <<<"$refusal" || { echo "FAIL $older not refused: $refusal"; exit 1; }
echo "ok   Kubernetes $OLDEST_KUBERNETES_VERSION and later only (kubeVersion)"

# Values the schema must reject.
for bad in "replicaCount=two" "certificates.mode=magic" "webhook.timeoutSeconds=60" "unknownKey=1" "webhook.url=http://x"; do
  if template x "$chart" --set "$bad" >/dev/null 2>&1; then echo "FAIL schema accepted --set $bad"; exit 1; fi
done
# Modes that need more values must fail with a clear message.
if template x "$chart" --set certificates.mode=secret >/dev/null 2>&1; then echo "FAIL secret mode without name"; exit 1; fi
if template x "$chart" --set webhook.url=https://127.0.0.1:9443 >/dev/null 2>&1; then echo "FAIL url mode without caBundle"; exit 1; fi
echo "ok   schema rejects bad values"

# Database NetworkPolicies: the operator is told to make them, with the client selector as a flag.
rendered="$out/database-network-policies.yaml"
grep -A1 'name: DBSERVICE_DATABASE_CLIENT_SELECTOR' "$rendered" | grep -qF 'value: "app.kubernetes.io/part-of=shop,tier=api"' \
  || { echo "FAIL the client selector does not reach the operator"; exit 1; }
grep -q 'networkpolicies' "$out/default.yaml" || { echo "FAIL the operator may not write NetworkPolicies"; exit 1; }
if grep -q DBSERVICE_DATABASE_NETWORK_POLICIES "$out/default.yaml"; then echo "FAIL NetworkPolicies on by default"; exit 1; fi
echo "ok   database NetworkPolicies reach the operator only when enabled"

# Platform bounds on authors: image prefixes and import with the source's roles reach the operator.
policy="$(template x "$chart" --set-json 'operator.allowedImagePrefixes=["registry.corp.example/","quay.io/org/"]' \
  --set operator.allowImportWithSourceRoles=true)"
grep -A1 'name: DBSERVICE_ALLOWED_IMAGE_PREFIXES' <<<"$policy" | grep -qF 'value: "registry.corp.example/,quay.io/org/"' \
  || { echo "FAIL the allowed image prefixes do not reach the operator"; exit 1; }
grep -A1 'name: DBSERVICE_ALLOW_IMPORT_WITH_SOURCE_ROLES' <<<"$policy" | grep -qF 'value: "true"' \
  || { echo "FAIL allowImportWithSourceRoles does not reach the operator"; exit 1; }
grep -A1 'name: DBSERVICE_ALLOW_IMPORT_WITH_SOURCE_ROLES' "$out/default.yaml" | grep -qF 'value: "false"' \
  || { echo "FAIL import with the source's roles is allowed by default"; exit 1; }
if template x "$chart" --set-json 'operator.allowedImagePrefixes=["a,b"]' >/dev/null 2>&1; then
  echo "FAIL schema accepted an image prefix with a comma"; exit 1
fi
echo "ok   image prefixes and import with source roles reach the operator"
