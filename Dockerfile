# syntax=docker/dockerfile:1
# The gatewayd image: gatewayd (the entrypoint) and bch-tui, on Debian 12 slim, as user 10001.
#
#   docker build -t registry.example/bch/gatewayd:0.1.0 .
#
# deploy/kubernetes runs it (docs/kubernetes.md); its pods run as the same numeric user.

# The toolchain the workspace is built and tested with (rust-version in Cargo.toml is the floor).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches persist between builds (BuildKit); the binaries are copied out of
# the cached target directory in the same step, since a cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gatewayd -p bch-tui \
    && install -D -m 0755 -t /out target/release/gatewayd target/release/bch-tui

# The same Debian release as the build stage: gatewayd links glibc dynamically (docs/deploy.md).
FROM debian:bookworm-slim
# A fixed numeric user and group, so a pod's runAsUser / runAsNonRoot can name and check them.
RUN groupadd --system --gid 10001 bch \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin bch
COPY --from=build /out/gatewayd /out/bch-tui /usr/local/bin/
USER 10001:10001
# Data plane, control plane (metrics, admin API, telemetry websocket), Envoy's endpoint picker.
EXPOSE 8080 9090 9002
# Logs go to stderr; SIGTERM stops it gracefully (shutdown_grace_ms). Give it --config FILE.
ENTRYPOINT ["/usr/local/bin/gatewayd"]
