# Multi-stage build of a static, non-root image with one entrypoint.
# (No Docker engine runs on the development machines; the release build command here is the one
# `make release` runs, with the musl target for a static binary.)
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --locked --release --bin reloader --target x86_64-unknown-linux-musl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/reloader /reloader
USER 65532:65532
ENTRYPOINT ["/reloader"]
