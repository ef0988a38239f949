//! Kconfig `.config` and fragment parsing, fragment merging and the
//! requested-versus-final diff that makes the configure step fail closed.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The value of one Kconfig symbol as written in a `.config` file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum Value {
    Yes,
    Module,
    /// `# CONFIG_X is not set`
    NotSet,
    /// A quoted string, unescaped.
    Str(String),
    /// An int or hex literal, kept as written (`1000`, `0x1000000`).
    Number(String),
}

impl Value {
    /// Whether the symbol is enabled (built in or as a module) or carries a value.
    pub fn is_set(&self) -> bool {
        !matches!(self, Value::NotSet)
    }

    /// The text after `CONFIG_X=` in a `.config`, or `is not set`.
    pub fn to_config_text(&self) -> String {
        match self {
            Value::Yes => "y".into(),
            Value::Module => "m".into(),
            Value::NotSet => "is not set".into(),
            Value::Str(s) => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
            Value::Number(n) => n.clone(),
        }
    }

    /// The full `.config` line for `symbol` (which includes the `CONFIG_` prefix).
    pub fn config_line(&self, symbol: &str) -> String {
        match self {
            Value::NotSet => format!("# {symbol} is not set"),
            other => format!("{symbol}={}", other.to_config_text()),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_config_text())
    }
}

/// One `CONFIG_X=...` or `# CONFIG_X is not set` line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The symbol including its `CONFIG_` prefix.
    pub symbol: String,
    pub value: Value,
    /// 1-based line number in the parsed text.
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}: {text:?}")]
pub struct ParseError {
    pub line: usize,
    pub reason: &'static str,
    pub text: String,
}

/// Parses `.config` or fragment text. Blank lines and comments are skipped;
/// any other line that is not an assignment is an error, so a typo in a
/// fragment cannot silently request nothing.
pub fn parse_assignments(text: &str) -> Result<Vec<Assignment>, ParseError> {
    let mut out = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        let error = |reason| ParseError {
            line,
            reason,
            text: raw.to_string(),
        };
        if let Some(comment) = trimmed.strip_prefix('#') {
            if let Some(symbol) = comment
                .trim()
                .strip_suffix("is not set")
                .map(str::trim_end)
                .filter(|s| s.starts_with("CONFIG_"))
            {
                if !is_symbol(symbol) {
                    return Err(error("invalid symbol name"));
                }
                out.push(Assignment {
                    symbol: symbol.to_string(),
                    value: Value::NotSet,
                    line,
                });
            }
            continue;
        }
        let (symbol, value) = trimmed
            .split_once('=')
            .ok_or_else(|| error("expected CONFIG_NAME=value"))?;
        let symbol = symbol.trim();
        if !symbol.starts_with("CONFIG_") || !is_symbol(symbol) {
            return Err(error("invalid symbol name"));
        }
        let value = parse_value(value.trim()).ok_or_else(|| error("invalid value"))?;
        out.push(Assignment {
            symbol: symbol.to_string(),
            value,
            line,
        });
    }
    Ok(out)
}

fn is_symbol(symbol: &str) -> bool {
    symbol.len() > "CONFIG_".len()
        && symbol
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b.is_ascii_lowercase())
}

fn parse_value(text: &str) -> Option<Value> {
    match text {
        "y" => return Some(Value::Yes),
        "m" => return Some(Value::Module),
        // `CONFIG_X=n` is accepted by Kconfig and means "not set".
        "n" => return Some(Value::NotSet),
        _ => {}
    }
    if let Some(inner) = text.strip_prefix('"') {
        let mut unescaped = String::new();
        let mut chars = inner.chars();
        loop {
            match chars.next()? {
                '\\' => unescaped.push(chars.next()?),
                '"' => break,
                c => unescaped.push(c),
            }
        }
        return chars.as_str().trim().is_empty().then_some(Value::Str(unescaped));
    }
    let is_number = if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())
    } else {
        let digits = text.strip_prefix('-').unwrap_or(text);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    };
    is_number.then(|| Value::Number(text.to_string()))
}

/// A parsed `.config`: the last assignment of each symbol wins, as in Kconfig.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    values: BTreeMap<String, Value>,
}

impl Config {
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let values = parse_assignments(text)?
            .into_iter()
            .map(|a| (a.symbol, a.value))
            .collect();
        Ok(Config { values })
    }

    /// The value of `symbol` (with its `CONFIG_` prefix); `None` when absent.
    pub fn get(&self, symbol: &str) -> Option<&Value> {
        self.values.get(symbol)
    }

    pub fn is_enabled(&self, symbol: &str) -> bool {
        matches!(self.get(symbol), Some(Value::Yes | Value::Module))
    }

    /// The single definition of "this configuration is PREEMPT_RT".
    pub fn is_preempt_rt(&self) -> bool {
        self.get("CONFIG_PREEMPT_RT") == Some(&Value::Yes)
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// Where a requested symbol came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub file: String,
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A symbol value asked for by a fragment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub symbol: String,
    pub value: Value,
    pub origin: Origin,
}

/// A symbol set by more than one fragment; the later one wins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redefinition {
    pub symbol: String,
    pub earlier: Request,
    pub later: Request,
}

/// All fragments merged in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedFragments {
    /// Final request per symbol, in symbol order.
    pub requests: BTreeMap<String, Request>,
    pub redefinitions: Vec<Redefinition>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {source}")]
pub struct FragmentError {
    pub file: String,
    #[source]
    pub source: ParseError,
}

/// Merges `(name, text)` fragments in order: a later assignment of the same
/// symbol replaces an earlier one and is reported as a redefinition.
pub fn merge_fragments<'a>(
    fragments: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<MergedFragments, FragmentError> {
    let mut merged = MergedFragments::default();
    for (file, text) in fragments {
        let assignments = parse_assignments(text).map_err(|source| FragmentError {
            file: file.to_string(),
            source,
        })?;
        for assignment in assignments {
            let request = Request {
                symbol: assignment.symbol.clone(),
                value: assignment.value,
                origin: Origin {
                    file: file.to_string(),
                    line: assignment.line,
                },
            };
            if let Some(earlier) = merged.requests.insert(assignment.symbol.clone(), request.clone()) {
                merged.redefinitions.push(Redefinition {
                    symbol: assignment.symbol,
                    earlier,
                    later: request,
                });
            }
        }
    }
    Ok(merged)
}

impl MergedFragments {
    /// Applies the requests onto a base `.config` text: every line that sets a
    /// requested symbol is removed and the requested lines are appended, which
    /// is what `scripts/kconfig/merge_config.sh` does.
    pub fn apply_to(&self, base_config: &str) -> String {
        let mut out = String::with_capacity(base_config.len() + self.requests.len() * 32);
        for line in base_config.lines() {
            let symbol = line_symbol(line);
            if symbol.is_some_and(|s| self.requests.contains_key(s)) {
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("# imgbuild: merged fragments\n");
        for request in self.requests.values() {
            out.push_str(&request.value.config_line(&request.symbol));
            out.push('\n');
        }
        out
    }
}

fn line_symbol(line: &str) -> Option<&str> {
    let line = line.trim();
    if let Some(comment) = line.strip_prefix('#') {
        return comment
            .trim()
            .strip_suffix("is not set")
            .map(str::trim_end)
            .filter(|s| s.starts_with("CONFIG_"));
    }
    line.split_once('=')
        .map(|(s, _)| s.trim())
        .filter(|s| s.starts_with("CONFIG_"))
}

/// What became of one requested symbol after `olddefconfig`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Kept,
    /// The symbol was asked to be enabled or to carry a value and is now unset or absent.
    Dropped,
    /// The symbol holds a different value than requested.
    Changed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolDiff {
    pub request: Request,
    /// The final value; `None` when the symbol is absent from the final config.
    pub actual: Option<Value>,
    pub outcome: Outcome,
}

impl SymbolDiff {
    pub fn actual_text(&self) -> String {
        match &self.actual {
            None => "absent".into(),
            Some(v) => v.config_line(&self.request.symbol),
        }
    }
}

impl fmt::Display for SymbolDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.outcome {
            Outcome::Kept => "kept",
            Outcome::Dropped => "DROPPED",
            Outcome::Changed => "CHANGED",
        };
        write!(
            f,
            "{verb} {} (requested {} at {}; final: {})",
            self.request.symbol,
            self.request.value.config_line(&self.request.symbol),
            self.request.origin,
            self.actual_text()
        )
    }
}

/// Classifies every requested symbol against the final configuration.
pub fn diff(merged: &MergedFragments, final_config: &Config) -> Vec<SymbolDiff> {
    merged
        .requests
        .values()
        .map(|request| {
            let actual = final_config.get(&request.symbol).cloned();
            let outcome = classify(&request.value, actual.as_ref());
            SymbolDiff {
                request: request.clone(),
                actual,
                outcome,
            }
        })
        .collect()
}

fn classify(requested: &Value, actual: Option<&Value>) -> Outcome {
    match (requested, actual) {
        (Value::NotSet, None | Some(Value::NotSet)) => Outcome::Kept,
        (Value::NotSet, Some(_)) => Outcome::Changed,
        (_, None | Some(Value::NotSet)) => Outcome::Dropped,
        (want, Some(got)) if want == got => Outcome::Kept,
        (Value::Number(want), Some(Value::Number(got))) if numbers_equal(want, got) => Outcome::Kept,
        _ => Outcome::Changed,
    }
}

fn numbers_equal(a: &str, b: &str) -> bool {
    fn parse(n: &str) -> Option<i128> {
        match n.strip_prefix("0x").or_else(|| n.strip_prefix("0X")) {
            Some(hex) => i128::from_str_radix(hex, 16).ok(),
            None => n.parse().ok(),
        }
    }
    matches!((parse(a), parse(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_value_kind() {
        let text = "\
#
# Automatically generated file; DO NOT EDIT.
CONFIG_PREEMPT_RT=y
CONFIG_E1000E=m
# CONFIG_EXPERT is not set
CONFIG_LOCALVERSION=\"-rt \\\"x\\\"\"
CONFIG_HZ=1000
CONFIG_PHYSICAL_START=0x1000000
CONFIG_OFFSET=-5
";
        let config = Config::parse(text).unwrap();
        assert_eq!(config.get("CONFIG_PREEMPT_RT"), Some(&Value::Yes));
        assert_eq!(config.get("CONFIG_E1000E"), Some(&Value::Module));
        assert_eq!(config.get("CONFIG_EXPERT"), Some(&Value::NotSet));
        assert_eq!(
            config.get("CONFIG_LOCALVERSION"),
            Some(&Value::Str("-rt \"x\"".into()))
        );
        assert_eq!(config.get("CONFIG_HZ"), Some(&Value::Number("1000".into())));
        assert_eq!(
            config.get("CONFIG_PHYSICAL_START"),
            Some(&Value::Number("0x1000000".into()))
        );
        assert_eq!(config.get("CONFIG_OFFSET"), Some(&Value::Number("-5".into())));
        assert!(config.is_preempt_rt());
        assert_eq!(config.len(), 7);
    }

    #[test]
    fn string_values_round_trip_through_config_lines() {
        let value = Value::Str("a \"b\" \\c".into());
        let line = value.config_line("CONFIG_X");
        let reparsed = Config::parse(&line).unwrap();
        assert_eq!(reparsed.get("CONFIG_X"), Some(&value));
    }

    #[test]
    fn rejects_malformed_lines_with_their_number() {
        let err = parse_assignments("CONFIG_A=y\nPREEMPT_RT=y\n").unwrap_err();
        assert_eq!(err.line, 2);
        let err = parse_assignments("CONFIG_A=yes please\n").unwrap_err();
        assert_eq!(err.reason, "invalid value");
        let err = parse_assignments("CONFIG_A=\"open\n").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(parse_assignments("CONFIG_A\n").is_err());
        assert!(parse_assignments("CONFIG_=y\n").is_err());
    }

    #[test]
    fn not_preempt_rt_when_module_absent_or_unset() {
        assert!(!Config::parse("CONFIG_PREEMPT=y\n").unwrap().is_preempt_rt());
        assert!(
            !Config::parse("# CONFIG_PREEMPT_RT is not set\n")
                .unwrap()
                .is_preempt_rt()
        );
        // A later line wins, as in Kconfig.
        assert!(
            !Config::parse("CONFIG_PREEMPT_RT=y\n# CONFIG_PREEMPT_RT is not set\n")
                .unwrap()
                .is_preempt_rt()
        );
    }

    #[test]
    fn merge_reports_redefinitions_and_later_wins() {
        let merged = merge_fragments([
            ("base.config", "CONFIG_EXPERT=y\nCONFIG_HZ=250\n"),
            ("rt.config", "# comment\nCONFIG_HZ=1000\nCONFIG_PREEMPT_RT=y\n"),
        ])
        .unwrap();
        assert_eq!(merged.requests["CONFIG_HZ"].value, Value::Number("1000".into()));
        assert_eq!(merged.requests["CONFIG_HZ"].origin.to_string(), "rt.config:2");
        assert_eq!(merged.redefinitions.len(), 1);
        assert_eq!(
            merged.redefinitions[0].earlier.origin.to_string(),
            "base.config:2"
        );
    }

    #[test]
    fn merge_error_names_the_fragment() {
        let err = merge_fragments([("bad.config", "CONFIG_OK=y\ngarbage\n")]).unwrap_err();
        assert_eq!(err.file, "bad.config");
        assert_eq!(err.source.line, 2);
        assert!(err.to_string().starts_with("bad.config: line 2"));
    }

    #[test]
    fn apply_replaces_base_lines() {
        let merged = merge_fragments([("f", "CONFIG_A=m\n# CONFIG_B is not set\n")]).unwrap();
        let out = merged.apply_to("CONFIG_A=y\nCONFIG_B=y\nCONFIG_C=y\n# CONFIG_D is not set\n");
        let config = Config::parse(&out).unwrap();
        assert_eq!(config.get("CONFIG_A"), Some(&Value::Module));
        assert_eq!(config.get("CONFIG_B"), Some(&Value::NotSet));
        assert_eq!(config.get("CONFIG_C"), Some(&Value::Yes));
        assert_eq!(out.matches("CONFIG_A").count(), 1);
    }

    #[test]
    fn diff_classifies_kept_dropped_changed() {
        let merged = merge_fragments([(
            "rt.config",
            "CONFIG_PREEMPT_RT=y\nCONFIG_EXPERT=y\nCONFIG_E1000E=y\n# CONFIG_KASAN is not set\n\
             CONFIG_HZ=1000\n# CONFIG_DEBUG_PREEMPT is not set\nCONFIG_START=0x10\nCONFIG_GONE=m\n",
        )])
        .unwrap();
        let final_config = Config::parse(
            "# CONFIG_PREEMPT_RT is not set\n# CONFIG_EXPERT is not set\nCONFIG_E1000E=m\n\
             CONFIG_HZ=1000\nCONFIG_DEBUG_PREEMPT=y\nCONFIG_START=16\n",
        )
        .unwrap();
        let outcomes: BTreeMap<_, _> = diff(&merged, &final_config)
            .into_iter()
            .map(|d| (d.request.symbol.clone(), d.outcome))
            .collect();
        assert_eq!(outcomes["CONFIG_PREEMPT_RT"], Outcome::Dropped);
        assert_eq!(outcomes["CONFIG_EXPERT"], Outcome::Dropped);
        assert_eq!(outcomes["CONFIG_E1000E"], Outcome::Changed);
        assert_eq!(outcomes["CONFIG_KASAN"], Outcome::Kept);
        assert_eq!(outcomes["CONFIG_HZ"], Outcome::Kept);
        assert_eq!(outcomes["CONFIG_DEBUG_PREEMPT"], Outcome::Changed);
        assert_eq!(outcomes["CONFIG_START"], Outcome::Kept);
        assert_eq!(outcomes["CONFIG_GONE"], Outcome::Dropped);
    }

    #[test]
    fn diff_display_names_origin_and_final_value() {
        let merged = merge_fragments([("rt.config", "\nCONFIG_PREEMPT_RT=y\n")]).unwrap();
        let final_config = Config::parse("# CONFIG_PREEMPT_RT is not set\n").unwrap();
        let text = diff(&merged, &final_config)[0].to_string();
        assert_eq!(
            text,
            "DROPPED CONFIG_PREEMPT_RT (requested CONFIG_PREEMPT_RT=y at rt.config:2; \
             final: # CONFIG_PREEMPT_RT is not set)"
        );
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(text in "\\PC*") {
            let _ = Config::parse(&text);
        }

        #[test]
        fn parser_never_panics_on_config_like_lines(
            lines in proptest::collection::vec("(# )?CONFIG_[A-Z0-9_]{0,8}(=|[ a-z]{0,12})[\"0-9a-zA-Z\\\\ ]{0,8}", 0..20)
        ) {
            let _ = Config::parse(&lines.join("\n"));
        }
    }
}
