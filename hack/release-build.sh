#!/usr/bin/env bash
# The release build of capkr-manager: the exact command the Dockerfile runs, and the one
# `make release-build` and tests/distribution/distribution_image.rs run (there is no Docker engine in CI).
#
# A statically linked binary (glibc, `crt-static`; rustls + ring, no OpenSSL) for the
# host's linux-gnu target, so it runs on a base image without a libc (distroless/static).
# The last line on stdout is the path of the binary.
#
#   CAPKR_RELEASE_TARGET   Rust target triple (default: <uname -m>-unknown-linux-gnu)
#   CAPKR_RELEASE_PROFILE  Cargo profile (default: release; the image test takes
#                          static-check, the release profile unoptimized)
#   CARGO_TARGET_DIR       honoured as usual (default: target)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CAPKR_RELEASE_TARGET:-$(uname -m)-unknown-linux-gnu}
PROFILE=${CAPKR_RELEASE_PROFILE:-release}
# Passing --target keeps RUSTFLAGS away from build scripts and proc macros, and the output
# (target/<triple>/<profile>) away from the debug build the tests use.
export RUSTFLAGS="-C target-feature=+crt-static"
cd "$ROOT"
cargo build --locked --profile "$PROFILE" --bin capkr-manager --target "$TARGET" >&2
echo "${CARGO_TARGET_DIR:-$ROOT/target}/$TARGET/$PROFILE/capkr-manager"
