//! `imgbuild --version`: the version, the git commit it was built from and
//! the libostree it runs against.

/// The commit of the build (`build.rs`: the checkout's HEAD, or
/// `$IMGBUILD_GIT_COMMIT`, or `unknown`).
pub const GIT_COMMIT: &str = env!("IMGBUILD_GIT_COMMIT");

/// What `--version` prints after the program name.
pub fn long_version() -> String {
    let (year, release) = crate::ostree::library_version();
    format!(
        "{}\ncommit {GIT_COMMIT}\nlibostree {year}.{release}",
        env!("CARGO_PKG_VERSION")
    )
}
