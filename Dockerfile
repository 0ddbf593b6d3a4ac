# Multi-stage build of a static, non-root image with one entrypoint.
# The build stage runs `make release`, the same command CI runs for the release binary, with the
# musl target for a static binary. (tests/packaging.rs keeps it that way.)
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends make musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile Cargo.toml Cargo.lock ./
COPY src ./src
# Cargo.toml names the benchmark target: the manifest does not parse without its file.
COPY benches ./benches
RUN make release TARGET=x86_64-unknown-linux-musl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/reloader /reloader
USER 65532:65532
ENTRYPOINT ["/reloader"]
