//! What a commit asks of its own trial boots: how many tries it gets, how
//! long the latency check measures, its budget, and what an INVALID latency
//! verdict means. The recipe sets it (`device.boot-tries`,
//! `device.health.*`, `rt.budget-us`); the commit carries it as JSON under
//! [`METADATA_KEY`]; the device reads it back with [`HealthPolicy::parse`].

use serde::{Deserialize, Serialize};

/// The commit metadata key holding the policy as JSON.
pub const METADATA_KEY: &str = "imgbuild.health";
/// Tries a trial gets: one digit, so GRUB can count down by comparing strings.
pub const BOOT_TRIES: std::ops::RangeInclusive<u8> = 1..=9;
/// Seconds the latency check may measure.
pub const LATENCY_SECONDS: std::ops::RangeInclusive<u32> = 1..=3600;
/// Worst-case latency budgets, in microseconds.
pub const BUDGET_US: std::ops::RangeInclusive<u64> = 1..=1_000_000;

/// What an INVALID latency verdict (a VM, SMIs, no load) does to a trial.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnInvalid {
    /// The boot passes; the log and the record say INVALID.
    #[default]
    Warn,
    /// The boot fails like an over-budget one.
    Fail,
}

impl OnInvalid {
    pub fn as_str(self) -> &'static str {
        match self {
            OnInvalid::Warn => "warn",
            OnInvalid::Fail => "fail",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct HealthPolicy {
    pub boot_tries: u8,
    pub latency_seconds: u32,
    pub on_invalid: OnInvalid,
    pub budget_us: u64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            boot_tries: 3,
            latency_seconds: 60,
            on_invalid: OnInvalid::Warn,
            budget_us: 100,
        }
    }
}

/// Why a policy was refused: the field and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct PolicyError {
    pub field: &'static str,
    pub message: String,
}

fn out_of<T: std::fmt::Display>(field: &'static str, value: T, range: (T, T)) -> PolicyError {
    PolicyError {
        field,
        message: format!("{value} is outside {}..={}", range.0, range.1),
    }
}

impl HealthPolicy {
    /// Checks every field against its range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !BOOT_TRIES.contains(&self.boot_tries) {
            return Err(out_of("boot-tries", self.boot_tries, BOOT_TRIES.into_inner()));
        }
        if !LATENCY_SECONDS.contains(&self.latency_seconds) {
            let range = LATENCY_SECONDS.into_inner();
            return Err(out_of("latency-seconds", self.latency_seconds, range));
        }
        if !BUDGET_US.contains(&self.budget_us) {
            return Err(out_of("budget-us", self.budget_us, BUDGET_US.into_inner()));
        }
        Ok(())
    }

    /// The policy from a commit's [`METADATA_KEY`] value. Missing fields
    /// take their defaults; unknown fields are ignored (a newer builder may
    /// add some); a value out of range is refused.
    pub fn parse(json: &str) -> Result<HealthPolicy, PolicyError> {
        let policy: HealthPolicy = serde_json::from_str(json).map_err(|e| PolicyError {
            field: METADATA_KEY,
            message: e.to_string(),
        })?;
        policy.validate()?;
        Ok(policy)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a plain struct serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_round_trips_and_defaults_what_is_missing() {
        let policy = HealthPolicy {
            boot_tries: 2,
            latency_seconds: 10,
            on_invalid: OnInvalid::Fail,
            budget_us: 150,
        };
        assert_eq!(HealthPolicy::parse(&policy.to_json()), Ok(policy));
        assert_eq!(HealthPolicy::parse("{}"), Ok(HealthPolicy::default()));
        let newer = r#"{"boot-tries": 4, "a-later-field": true}"#;
        assert_eq!(HealthPolicy::parse(newer).unwrap().boot_tries, 4);
    }

    #[test]
    fn out_of_range_and_malformed_policies_name_the_field() {
        for (json, field) in [
            (r#"{"boot-tries": 0}"#, "boot-tries"),
            (r#"{"boot-tries": 10}"#, "boot-tries"),
            (r#"{"latency-seconds": 0}"#, "latency-seconds"),
            (r#"{"latency-seconds": 3601}"#, "latency-seconds"),
            (r#"{"budget-us": 0}"#, "budget-us"),
            (r#"{"on-invalid": "ignore"}"#, METADATA_KEY),
            (r#"{"boot-tries": -1}"#, METADATA_KEY),
            ("not json", METADATA_KEY),
        ] {
            assert_eq!(HealthPolicy::parse(json).unwrap_err().field, field, "{json}");
        }
    }
}
