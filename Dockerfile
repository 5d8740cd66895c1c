# syntax=docker/dockerfile:1
# dbservice-operator: one static binary (admission webhooks + controller) on distroless.
#
#   docker build -t dbservice-operator:0.1.0 .        (or: buildah bud -t dbservice-operator:0.1.0 .)
#
# The two base images are build arguments whose defaults are the production images. Where they cannot be
# pulled (the offline test machines), tests/cluster/images.sh passes local stand-ins; the stages below are
# the same either way.
ARG BUILDER_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# Build stage: static musl binary (rustls + ring, no OpenSSL, no libc at runtime).
FROM ${BUILDER_IMAGE} AS build

# musl-gcc compiles ring's C/assembly for the musl target. The version comes from the
# bookworm archive the base image tracks; pinning it would break on every Debian point release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl

WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Cargo.toml declares the benchmark target; cargo refuses a manifest whose targets are missing.
COPY benches ./benches

# Cache mounts keep the crate registry and incremental artifacts between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl \
    && install -D -m 0755 target/x86_64-unknown-linux-musl/release/dbservice-operator /out/dbservice-operator

# Runtime stage: no shell, no package manager, uid/gid 65532 ("nonroot").
FROM ${RUNTIME_IMAGE}

LABEL org.opencontainers.image.title="dbservice-operator" \
      org.opencontainers.image.description="Kubernetes operator for PostgreSQL: admission webhooks and a self-healing controller in one binary" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"

COPY --from=build /out/dbservice-operator /usr/local/bin/dbservice-operator

USER 65532:65532
# 9443: HTTPS admission webhooks (/validate, /mutate); 8080: HTTP /healthz /readyz /metrics.
EXPOSE 9443 8080
ENTRYPOINT ["/usr/local/bin/dbservice-operator"]
CMD ["run"]
