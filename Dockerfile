# Multi-stage build of a static, non-root image with one entrypoint, for each platform buildx
# asks for (linux/amd64, linux/arm64). The build stage runs `make release TARGETARCH=...`: the
# Makefile maps amd64 and arm64 to the musl triples `make image` ships (IMAGE_ARCHS), and the
# binary is the one `make release` builds for that triple. (tests/it/packaging.rs keeps it so.)
# Releases are built without a container engine by `make image`; this file is for those who
# build with Docker.
FROM rust:1.95-bookworm AS build
ARG TARGETARCH
RUN apt-get update && apt-get install -y --no-install-recommends make musl-tools \
 && rm -rf /var/lib/apt/lists/*
# ring's C code is compiled with musl-gcc (musl-tools), which targets the build platform's own CPU;
# cc-rs would look for aarch64-linux-musl-gcc, which Debian does not ship, on arm64.
ENV CC_x86_64_unknown_linux_musl=musl-gcc CC_aarch64_unknown_linux_musl=musl-gcc
WORKDIR /src
COPY Makefile Cargo.toml Cargo.lock ./
COPY src ./src
# Cargo.toml names the benchmark target: the manifest does not parse without its file.
COPY benches ./benches
RUN make release TARGETARCH=$TARGETARCH \
 && install -D "$(make -s release-path TARGETARCH=$TARGETARCH)" /out/reloader

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/reloader /reloader
USER 65532:65532
ENTRYPOINT ["/reloader"]
