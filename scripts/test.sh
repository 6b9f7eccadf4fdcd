#!/usr/bin/env bash
# Runs every check and test of proftap, as CI does. Installs missing tools first.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all --check
cargo fmt --manifest-path fuzz/Cargo.toml --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# A short fuzzing run per target (docs/FUZZING.md).
scripts/fuzz.sh 12
# A test whose tool or kernel feature is missing fails, saying what is
# missing; none passes by skipping (PROFTAP_TESTS_STRICT=1 also fails the
# few unit tests of the in-process engine that would skip).
PROFTAP_TESTS_STRICT=1 cargo test --workspace
