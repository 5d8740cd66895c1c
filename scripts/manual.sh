#!/usr/bin/env bash
# Builds the manual (docs/manual, mdBook) into target/manual. mdBook is installed once from crates.io
# into ~/.cache/dbservice-operator/mdbook-VERSION (search on, the server and file watcher left out:
# about 3 minutes cold). tests/manual.rs checks the links; mdBook fails on a page missing from
# SUMMARY.md or an include that is not there.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=tests/cluster/versions.sh
. "$repo/tests/cluster/versions.sh"
mdbook="$CACHE_ROOT/mdbook-$MDBOOK_VERSION/mdbook"
if [ ! -x "$mdbook" ]; then
  echo "[manual] installing mdBook $MDBOOK_VERSION (once)" >&2
  work="$(mktemp -d)"
  cargo install mdbook --version "${MDBOOK_VERSION#v}" --locked --no-default-features --features search \
    --root "$work" --quiet
  mkdir -p "$(dirname "$mdbook")"
  mv "$work/bin/mdbook" "$mdbook"
  rm -rf "$work"
fi
"$mdbook" build "$repo/docs/manual" 2>&1 | grep -v '^ INFO' || true
[ -s "$repo/target/manual/index.html" ] || { echo "[manual] mdBook wrote no index.html" >&2; exit 1; }
# A warning is an error here (a missing include or page).
if "$mdbook" build "$repo/docs/manual" 2>&1 | grep -E 'WARN|ERROR'; then exit 1; fi
echo "[manual] built: $repo/target/manual/index.html ($(find "$repo/target/manual" -name '*.html' | wc -l) pages)"
