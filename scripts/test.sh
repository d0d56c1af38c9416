#!/usr/bin/env bash
# The project's test command: installs missing test tools, builds every target
# and runs every test. Tests start their own redis-server/nginx/namespaces;
# nothing here starts a system service.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-deps.sh
cargo build --all-targets
# Every bench target once, as a smoke test: criterion runs each benchmark of
# benches/ once; the whole-process harnesses of bench/ run only with their
# drivers' arguments, so here they print their usage and exit. Criterion
# rejects libtest's --test-threads, hence the separate run and
# RUST_TEST_THREADS below.
cargo test --bench '*'
RUST_TEST_THREADS=2 cargo test --lib --bins --tests --examples
