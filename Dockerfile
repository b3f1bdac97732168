# syntax=docker/dockerfile:1
# Quipu in two stages: compile with the Rust toolchain, run on a slim Debian as a non-root user.
#
#   docker build -t quipu .
#   docker run -p 8080:8080 -p 127.0.0.1:9091:9091 -v quipu-data:/var/lib/quipu quipu
#
# The image runs conf/quipu.toml (also the binary's embedded default); docker-compose.yml mounts
# deploy/quipu.compose.toml over it. Operator commands run in the container against the same
# store: `docker compose exec quipu quipu tenant create acme`.

FROM rust:1.95-bookworm AS builder
# pingora builds zlib-ng with cmake; the bundled SQLite needs the C compiler the image has.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary leaves the
# cache through /out.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p quipu --locked \
    && install -D -m 0755 target/release/quipu /out/quipu

FROM debian:bookworm-slim AS runtime
# curl is for the healthcheck; ca-certificates for nothing Quipu does today (upstreams are
# plain http inside their network) but for operators' debugging.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 quipu \
    && useradd --system --uid 10001 --gid quipu --home-dir /var/lib/quipu --shell /usr/sbin/nologin quipu \
    && install -d -o quipu -g quipu -m 0750 /var/lib/quipu \
    && install -d -m 0755 /etc/quipu
COPY --from=builder /out/quipu /usr/local/bin/quipu
COPY conf/quipu.toml /etc/quipu/quipu.toml
ENV QUIPU_CONFIG=/etc/quipu/quipu.toml \
    QUIPU_LOG=info
USER quipu:quipu
WORKDIR /var/lib/quipu
# The ledger (SQLite) lives here; keep it on a volume.
VOLUME ["/var/lib/quipu"]
# 8080: the API; 9091: Prometheus /metrics (metrics_listen must be 0.0.0.0:9091 to be reached).
EXPOSE 8080 9091
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/health || exit 1
# SIGTERM drains: running streams get grace_period_seconds, queued ledger rows are written.
STOPSIGNAL SIGTERM
ENTRYPOINT ["quipu"]
CMD ["serve"]
