# The one build of a CI run, shared by every tier: ci/test's test run and
# ci/e2e's binaries come from the same cargo invocation flags, so the second
# finds everything built (the features and dev-dependency unification of a
# test build differ from a plain `cargo build`, which would compile again).
# shellcheck shell=sh
cargo_flags="--workspace --release --locked --features imgbuild/fixtures"

# build_workspace: the release binaries (target/release/{imgbuild,jitter,
# emberrtos-device}) and every test binary.
build_workspace() {
    # shellcheck disable=SC2086
    cargo test $cargo_flags --no-run
}
