#!/usr/bin/env bash
# Packs a built binary as krew's `dbservice` plugin: OUT/kubectl-dbservice-linux-amd64.tar.gz (the
# binary as kubectl-dbservice, the licence-free README) and OUT/dbservice.yaml, the krew manifest
# with that archive's sha256. Install from them without a plugin index:
#   kubectl krew install --manifest=OUT/dbservice.yaml --archive=OUT/kubectl-dbservice-linux-amd64.tar.gz
# For an index, publish the archive and set URI (the manifest's `uri`) to where it is served.
# Usage: scripts/krew-manifest.sh BINARY OUT [VERSION] [URI]
set -euo pipefail
binary="${1:?usage: krew-manifest.sh BINARY OUT [VERSION] [URI]}"
out="${2:?usage: krew-manifest.sh BINARY OUT [VERSION] [URI]}"
here="$(cd "$(dirname "$0")/.." && pwd)"
version="${3:-v$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)}"
archive_name="kubectl-dbservice-linux-amd64.tar.gz"
uri="${4:-https://example.invalid/dbservice-operator/releases/$version/$archive_name}"
[ -x "$binary" ] || { echo "krew-manifest: $binary is not an executable" >&2; exit 1; }
mkdir -p "$out"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$binary" "$stage/kubectl-dbservice"
cp "$here/README.md" "$stage/README.md"
tar -C "$stage" -czf "$out/$archive_name" kubectl-dbservice README.md
sha256="$(sha256sum "$out/$archive_name" | cut -d' ' -f1)"
cat > "$out/dbservice.yaml" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: dbservice
spec:
  version: $version
  homepage: ${uri%/releases/*}
  shortDescription: Day-2 verbs for dbservice-operator's PostgreSQL databases
  description: |
    status, switchover, restart, reload, fence, hibernate, backup-now, psql, logs and report for
    the DatabaseServices of dbservice-operator; each verb writes what the documented annotation
    or field does.
  platforms:
  - selector:
      matchLabels:
        os: linux
        arch: amd64
    uri: $uri
    sha256: $sha256
    bin: kubectl-dbservice
    files:
    - from: kubectl-dbservice
      to: .
    - from: README.md
      to: .
YAML
echo "krew-manifest: $out/dbservice.yaml ($version, sha256 $sha256)"
