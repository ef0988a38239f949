//! UTS_VERSION (`uname -v`) parsing.
//!
//! Kbuild writes `#<build> [SMP] [PREEMPT|PREEMPT_DYNAMIC|PREEMPT_RT] <timestamp>`
//! (init/Makefile). The preemption model is read from its position right after
//! the optional `SMP` flag; the timestamp is free text (`KBUILD_BUILD_TIMESTAMP`)
//! and may contain anything, so it is never searched.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreemptModel {
    /// `PREEMPT` (full preemption, not RT).
    Preempt,
    /// `PREEMPT_DYNAMIC` (boot-time selectable, never RT in 6.12).
    Dynamic,
    /// `PREEMPT_RT`, or `PREEMPT_{RT,DYNAMIC}` written by later kernels.
    Rt,
}

impl PreemptModel {
    fn from_token(token: &str) -> Option<Self> {
        match token {
            "PREEMPT" => Some(PreemptModel::Preempt),
            "PREEMPT_DYNAMIC" => Some(PreemptModel::Dynamic),
            "PREEMPT_RT" | "PREEMPT_{RT,DYNAMIC}" => Some(PreemptModel::Rt),
            _ => None,
        }
    }
}

impl fmt::Display for PreemptModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PreemptModel::Preempt => "PREEMPT",
            PreemptModel::Dynamic => "PREEMPT_DYNAMIC",
            PreemptModel::Rt => "PREEMPT_RT",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UtsVersion {
    /// The build number after `#` (kept as text: Debian writes `#1`, others may not be numeric).
    pub build: String,
    pub smp: bool,
    /// `None` for a voluntary or non-preemptible kernel.
    pub preempt: Option<PreemptModel>,
    pub timestamp: String,
}

impl UtsVersion {
    pub fn is_preempt_rt(&self) -> bool {
        self.preempt == Some(PreemptModel::Rt)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UtsError {
    #[error("UTS_VERSION is empty")]
    Empty,
    #[error("UTS_VERSION does not start with `#<build>`: {0:?}")]
    NoBuildNumber(String),
    #[error(
        "UTS_VERSION names {token} again after its flags, so it reads more than one way (kbuild never writes that): {text:?}"
    )]
    Ambiguous {
        token: String,
        text: String,
        /// The model in the flag slot, which the rest of the string contradicts.
        flagged: Option<PreemptModel>,
    },
}

/// Every preemption model kbuild or a distribution has written, matched
/// case-insensitively: a second one anywhere after the flag slot is a spoof.
const PREEMPT_MODEL_NAMES: &[&str] = &[
    "PREEMPT",
    "PREEMPT_NONE",
    "PREEMPT_VOLUNTARY",
    "PREEMPT_DYNAMIC",
    "PREEMPT_LAZY",
    "PREEMPT_RT",
    "PREEMPT_{RT,DYNAMIC}",
    "PREEMPT_{LAZY,DYNAMIC}",
    "PREEMPTION",
];

/// Why a token after the flag slots would let the text be read another way:
/// a second `#<build>` head, a second `SMP`, or a preemption model.
fn second_reading(token: &str) -> Option<&str> {
    let bare = token.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || "_{},#".contains(c)));
    let bare = bare.trim_end_matches(',');
    if bare.starts_with('#') {
        return Some("a second `#<build>` head");
    }
    if bare.eq_ignore_ascii_case("SMP") {
        return Some("a second SMP flag");
    }
    PREEMPT_MODEL_NAMES
        .iter()
        .any(|name| bare.eq_ignore_ascii_case(name))
        .then_some("a preemption model")
}

/// Parses a UTS_VERSION such as `#1 SMP PREEMPT_RT Sat Nov 29 12:00:00 UTC 2026`.
///
/// The timestamp is free text, so a crafted build number or timestamp could
/// imitate the flags (`#1 SMP PREEMPT_RT x SMP PREEMPT_DYNAMIC …`). Such a
/// string reads more than one way and is refused rather than guessed at.
pub fn parse_uts_version(text: &str) -> Result<UtsVersion, UtsError> {
    let text = text.trim();
    let mut tokens = text.split_whitespace().peekable();
    let first = tokens.next().ok_or(UtsError::Empty)?;
    let build = first
        .strip_prefix('#')
        .filter(|b| !b.is_empty())
        .ok_or_else(|| UtsError::NoBuildNumber(text.to_string()))?;
    let smp = tokens.next_if_eq(&"SMP").is_some();
    let preempt = tokens.peek().and_then(|t| PreemptModel::from_token(t));
    if preempt.is_some() {
        tokens.next();
    }
    let rest: Vec<&str> = tokens.collect();
    if let Some((token, why)) = rest.iter().find_map(|t| second_reading(t).map(|why| (*t, why))) {
        return Err(UtsError::Ambiguous {
            token: format!("{why} ({token:?})"),
            text: text.to_string(),
            flagged: preempt,
        });
    }
    Ok(UtsVersion {
        build: build.to_string(),
        smp,
        preempt,
        timestamp: rest.join(" "),
    })
}

/// The start of the kernel's `linux_banner` (init/version-timestamp.c):
/// `Linux version <release> (<by>@<host>) (<compiler>) <UTS_VERSION>\n`.
const BANNER_PREFIX: &[u8] = b"Linux version ";
/// A banner is a few hundred bytes; a longer run is not one.
const MAX_BANNER: usize = 1024;

/// Why the kernel's own banner does not vouch for a setup-header version string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BannerError {
    #[error("the kernel payload holds no `Linux version …` banner")]
    Missing,
    #[error("the kernel payload holds {} different banners, so it reads more than one way: {banners:?}", banners.len())]
    Several { banners: Vec<String> },
    #[error("the payload's banner is for release {banner:?} but the setup header says {header:?}")]
    ReleaseMismatch { header: String, banner: String },
    #[error("the payload's banner {banner:?} does not end with the setup header's UTS_VERSION {header:?}")]
    VersionMismatch { header: String, banner: String },
    #[error(
        "the kernel's banner {banner:?} is not `Linux version <release> (<builder>) (<compiler>) <UTS_VERSION>`: {why}"
    )]
    Unparsed { banner: String, why: String },
}

/// The distinct `linux_banner`s in an uncompressed kernel, in order of
/// appearance: NUL-terminated text from `Linux version <release> (` to a
/// final newline. Other text starting `Linux version ` is not a banner.
pub fn linux_banners(vmlinux: &[u8]) -> Vec<String> {
    let mut banners: Vec<String> = Vec::new();
    let mut from = 0;
    while let Some(at) = crate::ikconfig::find(vmlinux, BANNER_PREFIX, from) {
        from = at + BANNER_PREFIX.len();
        if let Some(banner) = banner_at(&vmlinux[at..])
            && !banners.contains(&banner)
        {
            banners.push(banner);
        }
    }
    banners
}

fn banner_at(bytes: &[u8]) -> Option<String> {
    let window = &bytes[..bytes.len().min(MAX_BANNER)];
    let nul = window.iter().position(|&b| b == 0)?;
    let text = std::str::from_utf8(&window[..nul]).ok()?;
    let body = text.strip_suffix('\n')?;
    (!body.contains('\n') && banner_release(body).is_some()).then(|| text.to_string())
}

/// The release in `Linux version <release> (…`.
fn banner_release(banner: &str) -> Option<&str> {
    let rest = banner.strip_prefix("Linux version ")?;
    let (release, _) = rest.split_once(" (")?;
    (!release.is_empty()).then_some(release)
}

/// Since Linux 6.1 kbuild compiles init/version.c before the build number is
/// known and links the real banner from init/version-timestamp.c, so the
/// weak, overridden copy stays in the image: the same text with `#` and no
/// build number. `candidate` is that copy of `real` only when nothing else differs.
fn is_placeholder_of(candidate: &str, real: &str) -> bool {
    real.match_indices(") #").any(|(at, head)| {
        let digits_start = at + head.len();
        let digits = real[digits_start..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        digits > 0 && candidate.len() + digits == real.len() && {
            let (before, after) = (&real[..digits_start], &real[digits_start + digits..]);
            candidate.strip_prefix(before) == Some(after)
        }
    })
}

/// The one banner in `vmlinux`, its placeholder copy aside.
fn the_banner(vmlinux: &[u8]) -> Result<String, BannerError> {
    let all = linux_banners(vmlinux);
    let mut banners: Vec<String> = all
        .iter()
        .filter(|b| !all.iter().any(|real| is_placeholder_of(b, real)))
        .cloned()
        .collect();
    match banners.len() {
        0 => Err(BannerError::Missing),
        1 => Ok(banners.remove(0)),
        _ => Err(BannerError::Several { banners }),
    }
}

/// The version string of a kernel that has no other (an arm64 `Image`): its
/// one banner, `Linux version <release> (<builder>) (<compiler>) <UTS_VERSION>`,
/// read one way only, under the rules [`matching_banner`] applies to a
/// bzImage's.
#[cfg(feature = "image")]
pub fn banner_version(vmlinux: &[u8]) -> Result<crate::bzimage::KernelVersion, BannerError> {
    use crate::bzimage::{KernelVersion, closing_paren, parse_version_string};
    let banner = the_banner(vmlinux)?;
    let unparsed = |why: &str| BannerError::Unparsed {
        banner: banner.clone(),
        why: why.to_string(),
    };
    let body = banner
        .strip_prefix("Linux version ")
        .and_then(|b| b.strip_suffix('\n'))
        .ok_or_else(|| unparsed("no `Linux version ` head or no final newline"))?;
    // The header's form, `<release> (<builder>) <rest>`, where the rest
    // starts with the compiler's group.
    let head = parse_version_string(body).map_err(|e| unparsed(&e.to_string()))?;
    let compiler = head
        .uts_version
        .strip_prefix('(')
        .ok_or_else(|| unparsed("no `(<compiler>)` after the builder"))?;
    let close = closing_paren(compiler).ok_or_else(|| unparsed("the compiler's group is not closed"))?;
    let uts_version = compiler[close + 1..].trim();
    if uts_version.is_empty() {
        return Err(unparsed("no UTS_VERSION after the compiler"));
    }
    matching_banner(vmlinux, &head.release, uts_version)?;
    Ok(KernelVersion {
        raw: body.to_string(),
        release: head.release,
        builder: head.builder,
        uts_version: uts_version.to_string(),
    })
}

/// The one banner in `vmlinux`, required to name `release` and to end with
/// exactly `uts_version` and a newline: what ties a setup-header version
/// string to the kernel that the image really boots.
pub fn matching_banner(vmlinux: &[u8], release: &str, uts_version: &str) -> Result<String, BannerError> {
    let banner = the_banner(vmlinux)?;
    let found = banner_release(banner.trim_end()).unwrap_or_default();
    if found != release {
        return Err(BannerError::ReleaseMismatch {
            header: release.to_string(),
            banner: found.to_string(),
        });
    }
    // Mainline writes `) UTS_VERSION\n`: the compiler's closing parenthesis first.
    // The part before the version (release, builder, compiler) names no
    // preemption model and no second `SMP`: a crafted build timestamp such as
    // `#1 SMP PREEMPT_DYNAMIC x) #1 SMP PREEMPT_RT …` must not end the right way.
    let head = banner
        .strip_suffix(&format!(") {uts_version}\n"))
        .filter(|head| !head.contains("PREEMPT") && !head.contains(" SMP "));
    if head.is_none() {
        return Err(BannerError::VersionMismatch {
            header: uts_version.to_string(),
            banner,
        });
    }
    Ok(banner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RT_BANNER: &str = "Linux version 6.1.0-57-rt-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0, GNU ld 2.40) #1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)\n";
    const RT_UTS: &str = "#1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)";

    fn kernel_with(banners: &[&str]) -> Vec<u8> {
        let mut vmlinux = b"\x7fELF".to_vec();
        for banner in banners {
            vmlinux.extend_from_slice(banner.as_bytes());
            vmlinux.push(0);
        }
        vmlinux
    }

    #[test]
    fn banner_matches_release_and_uts_version() {
        let vmlinux = kernel_with(&[RT_BANNER]);
        assert_eq!(
            matching_banner(&vmlinux, "6.1.0-57-rt-amd64", RT_UTS).unwrap(),
            RT_BANNER
        );
        assert!(matches!(
            matching_banner(&vmlinux, "6.1.0-57-cloud-amd64", RT_UTS),
            Err(BannerError::ReleaseMismatch { .. })
        ));
        // Ends with the UTS_VERSION exactly, not merely containing it.
        assert!(matches!(
            matching_banner(
                &vmlinux,
                "6.1.0-57-rt-amd64",
                "PREEMPT_RT Debian 6.1.192-3 (2026-11-26)"
            ),
            Err(BannerError::VersionMismatch { .. })
        ));
        assert_eq!(
            matching_banner(b"Linux version %s\n\0", "6.1", RT_UTS),
            Err(BannerError::Missing)
        );
    }

    #[test]
    fn the_placeholder_banner_of_a_split_build_is_not_a_second_banner() {
        let placeholder = RT_BANNER.replace(") #1 SMP", ") # SMP");
        let vmlinux = kernel_with(&[&placeholder, RT_BANNER]);
        assert!(matching_banner(&vmlinux, "6.1.0-57-rt-amd64", RT_UTS).is_ok());
        // Anything else that differs is a second banner.
        let other = RT_BANNER.replace(") #1 SMP PREEMPT_RT", ") # SMP PREEMPT_DYNAMIC");
        let vmlinux = kernel_with(&[&other, RT_BANNER]);
        assert!(matches!(
            matching_banner(&vmlinux, "6.1.0-57-rt-amd64", RT_UTS),
            Err(BannerError::Several { .. })
        ));
    }

    #[test]
    fn mainline_rt() {
        let v = parse_uts_version("#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025").unwrap();
        assert!(v.is_preempt_rt());
        assert!(v.smp);
        assert_eq!(v.build, "1");
        assert_eq!(v.timestamp, "Sun Nov 30 00:00:00 UTC 2025");
    }

    #[test]
    fn debian_rt_and_generic() {
        let rt = parse_uts_version("#1 SMP PREEMPT_RT Debian 6.1.158-1 (2025-11-09)").unwrap();
        assert!(rt.is_preempt_rt());
        let generic = parse_uts_version("#1 SMP PREEMPT_DYNAMIC Debian 6.1.158-1 (2025-11-09)").unwrap();
        assert!(!generic.is_preempt_rt());
        assert_eq!(generic.preempt, Some(PreemptModel::Dynamic));
        let none = parse_uts_version("#1 SMP Debian 6.1.158-1 (2025-11-09)").unwrap();
        assert_eq!(none.preempt, None);
    }

    #[test]
    fn uniprocessor_rt() {
        let v = parse_uts_version("#3 PREEMPT_RT Thu Jan  1 00:00:00 UTC 1970").unwrap();
        assert!(v.is_preempt_rt());
        assert!(!v.smp);
    }

    #[test]
    fn later_kernels_rt_dynamic() {
        assert!(
            parse_uts_version("#1 SMP PREEMPT_{RT,DYNAMIC} x")
                .unwrap()
                .is_preempt_rt()
        );
    }

    #[test]
    fn timestamp_containing_the_token_does_not_fool_it() {
        for spoof in [
            "#1 SMP PREEMPT_DYNAMIC built-with-PREEMPT_RT-love 2026",
            "#1 SMP Mon PREEMPT_RT Nov 30 2026",
            "#1 SMP PREEMPT Mon Nov 30 PREEMPT_RT 2026",
            "#1 SMP PREEMPT_RT_FAKE 2026",
            "#1 SMP preempt_rt 2026",
        ] {
            let rt = parse_uts_version(spoof).is_ok_and(|v| v.is_preempt_rt());
            assert!(!rt, "{spoof}");
        }
    }

    fn assert_ambiguous(text: &str) {
        let err = parse_uts_version(text).unwrap_err();
        assert!(matches!(err, UtsError::Ambiguous { .. }), "{text}: {err}");
    }

    #[test]
    fn injected_flags_are_refused() {
        // KBUILD_BUILD_VERSION="1 SMP PREEMPT_RT" on a PREEMPT_DYNAMIC kernel.
        assert_ambiguous("#1 SMP PREEMPT_RT SMP PREEMPT_DYNAMIC Mon");
        // A timestamp starting with the token on a PREEMPT_DYNAMIC kernel is not RT.
        assert_ambiguous("#1 SMP PREEMPT_DYNAMIC PREEMPT_RT 2026");
    }

    #[test]
    fn a_second_reading_anywhere_is_refused() {
        for spoof in [
            // A crafted build number: KBUILD_BUILD_VERSION="1 SMP PREEMPT_RT x".
            "#1 SMP PREEMPT_RT x SMP PREEMPT_DYNAMIC Thu Nov 27 2026",
            // What `uname -v` shows for a crafted build host `h) #1 SMP PREEMPT_RT (x`.
            "#1 SMP PREEMPT_RT (x) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)",
            "#1 SMP PREEMPT_RT Debian 6.1.192-3 (PREEMPT_DYNAMIC)",
            "#1 SMP PREEMPT_RT built PREEMPT_VOLUNTARY",
            "#1 SMP PREEMPT_RT x preempt 2026",
            "#1 SMP PREEMPT_RT x PREEMPT_NONE, 2026",
            "#1 SMP PREEMPT_RT x PREEMPT_{RT,DYNAMIC} 2026",
            "#1 SMP PREEMPT_RT x #2 2026",
        ] {
            assert_ambiguous(spoof);
        }
    }

    #[test]
    fn genuine_strings_still_pass() {
        for genuine in [
            "#1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)",
            "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025",
            "#1 SMP PREEMPT_RT Debian 6.12.57-1 (2025-11-05)",
            "#7 PREEMPT_RT Thu Jan  1 00:00:00 UTC 1970",
        ] {
            assert!(parse_uts_version(genuine).unwrap().is_preempt_rt(), "{genuine}");
        }
        let generic = parse_uts_version("#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)").unwrap();
        assert_eq!(generic.preempt, Some(PreemptModel::Dynamic));
    }

    #[test]
    fn malformed() {
        assert_eq!(parse_uts_version("  "), Err(UtsError::Empty));
        assert!(matches!(
            parse_uts_version("SMP PREEMPT_RT"),
            Err(UtsError::NoBuildNumber(_))
        ));
        assert!(matches!(
            parse_uts_version("# SMP"),
            Err(UtsError::NoBuildNumber(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_uts_version(&text);
        }

        #[test]
        fn rt_only_in_the_flag_slot(ts in "[A-Za-z0-9_: ]{0,40}") {
            // Whatever the timestamp says, a PREEMPT_DYNAMIC kernel is never RT.
            if let Ok(v) = parse_uts_version(&format!("#1 SMP PREEMPT_DYNAMIC {ts}")) {
                proptest::prop_assert!(!v.is_preempt_rt());
            }
        }
    }

    #[test]
    fn a_banner_with_a_second_version_before_the_real_one_is_refused() {
        let crafted = "Linux version 6.1.0-57-rt-amd64 (k@h) (gcc-12 12.2.0) #1 SMP PREEMPT_DYNAMIC x) #1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)\n";
        let err = matching_banner(&kernel_with(&[crafted]), "6.1.0-57-rt-amd64", RT_UTS).unwrap_err();
        assert!(matches!(err, BannerError::VersionMismatch { .. }), "{err}");
        matching_banner(&kernel_with(&[RT_BANNER]), "6.1.0-57-rt-amd64", RT_UTS).unwrap();
    }
}
