# Quipu, built from source in a multi-stage image.
#   docker build -t quipu .
# The build stage needs cmake (pingora compiles zlib-ng with it) and a C compiler (bundled
# SQLite); the runtime stage is a slim Debian with the one binary.

FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p quipu && strip target/release/quipu

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /var/lib/quipu quipu \
    && mkdir -p /var/lib/quipu /etc/quipu && chown quipu /var/lib/quipu
COPY --from=build /src/target/release/quipu /usr/local/bin/quipu
COPY conf/quipu.toml /etc/quipu/quipu.toml
USER quipu
WORKDIR /var/lib/quipu
ENV QUIPU_CONFIG=/etc/quipu/quipu.toml
EXPOSE 8080 9091
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s CMD curl -fsS http://127.0.0.1:8080/health || exit 1
ENTRYPOINT ["quipu"]
CMD ["serve"]
