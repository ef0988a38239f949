//! A distcc host list as `kernel.build.distcc`, `$DISTCC_HOSTS` and
//! `--distcc` give it (pure): part of the recipe's model, read by the
//! kernel stage's compiler set-up.

/// distcc's own limit for a host given without `/N`.
const DEFAULT_SLOTS: usize = 2;

/// One distcc host: `HOST[:PORT][/LIMIT][,OPTIONS]`, `@HOST` (over ssh) or `localhost`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistccHost {
    pub spec: String,
    pub slots: usize,
}

/// A distcc host list as `DISTCC_HOSTS` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistccHosts {
    pub hosts: Vec<DistccHost>,
    /// The list as given, passed to distcc unchanged.
    pub text: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostsError {
    #[error("the distcc host list is empty")]
    Empty,
    #[error("distcc host {host:?}: {why}")]
    BadHost { host: String, why: &'static str },
}

impl DistccHosts {
    /// Parses a host list (pure). Options (`--randomize`, `--localslots=N`)
    /// are kept for distcc and take no job slots.
    pub fn parse(text: &str) -> Result<DistccHosts, HostsError> {
        let mut hosts = Vec::new();
        for word in text.split_whitespace().filter(|w| !w.starts_with("--")) {
            let bad = |why| HostsError::BadHost {
                host: word.to_string(),
                why,
            };
            let allowed = |c: char| c.is_ascii_alphanumeric() || ".:/,@_[]-+=".contains(c);
            if !word.chars().all(allowed) {
                return Err(bad("holds a character no host specification does"));
            }
            let name = word
                .trim_start_matches('@')
                .split([':', '/', ','])
                .next()
                .unwrap_or_default();
            if name.is_empty() && !word.starts_with('[') {
                return Err(bad("names no host"));
            }
            let slots = match word.split_once('/') {
                None => DEFAULT_SLOTS,
                Some((_, rest)) => rest
                    .split(',')
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| bad("the limit after `/` is not a number from 1 to 1024"))?,
            };
            hosts.push(DistccHost {
                spec: word.to_string(),
                slots,
            });
        }
        if hosts.is_empty() {
            return Err(HostsError::Empty);
        }
        Ok(DistccHosts {
            hosts,
            text: text.split_whitespace().collect::<Vec<_>>().join(" "),
        })
    }

    pub fn slots(&self) -> usize {
        self.hosts.iter().map(|h| h.slots).sum()
    }
}
