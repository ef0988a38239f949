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
        "UTS_VERSION repeats a flag token ({token}) after the flags, which kbuild never writes: {text:?}"
    )]
    RepeatedFlag { token: String, text: String },
}

fn is_flag(token: &str) -> bool {
    token == "SMP" || PreemptModel::from_token(token).is_some()
}

/// Parses a UTS_VERSION such as `#1 SMP PREEMPT_RT Sat Nov 29 12:00:00 UTC 2026`.
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
    // A flag right after the flag slots means something was injected into the
    // build number or timestamp to imitate the flags; refuse to guess.
    if let Some(next) = tokens.peek().filter(|t| is_flag(t)) {
        return Err(UtsError::RepeatedFlag {
            token: next.to_string(),
            text: text.to_string(),
        });
    }
    let timestamp = tokens.collect::<Vec<_>>().join(" ");
    Ok(UtsVersion {
        build: build.to_string(),
        smp,
        preempt,
        timestamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let v = parse_uts_version(spoof).unwrap();
            assert!(!v.is_preempt_rt(), "{spoof}");
        }
    }

    #[test]
    fn injected_flags_are_refused() {
        // KBUILD_BUILD_VERSION="1 SMP PREEMPT_RT" on a PREEMPT_DYNAMIC kernel.
        let err = parse_uts_version("#1 SMP PREEMPT_RT SMP PREEMPT_DYNAMIC Mon").unwrap_err();
        assert!(matches!(err, UtsError::RepeatedFlag { .. }));
        // A timestamp starting with the token on a PREEMPT_DYNAMIC kernel is not RT.
        assert!(parse_uts_version("#1 SMP PREEMPT_DYNAMIC PREEMPT_RT 2026").is_err());
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
}
