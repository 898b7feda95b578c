# syntax=docker/dockerfile:1
# capkr-manager image: a static binary on distroless/static, running as non-root (65532).
#
#   docker build -t ghcr.io/zyvor/cluster-api-provider-kairon:v0.1.0 .
#
# The build stage runs hack/release-build.sh: the same script, flags and target that
# `make release-build` and tests/distribution/distribution_image.rs use in CI (where there is no Docker
# engine); that test checks the binary is statically linked and starts.
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds; the binary is copied out of
# the cached target dir because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bin=$(hack/release-build.sh | tail -1) && cp "$bin" /capkr-manager

# No shell, no libc, no package manager; user nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /capkr-manager /capkr-manager
USER 65532:65532
ENTRYPOINT ["/capkr-manager"]
