//! A Debian package's license, as its DEP-5 copyright file states it, in
//! SPDX terms (pure). Nothing is guessed: a file that is not DEP-5, or has no
//! `Files: *` paragraph, states no license; a name SPDX does not define, or
//! that Debian's short names do not pin to one SPDX identifier, becomes a
//! `LicenseRef-` naming the Debian text.

use std::str::FromStr;

use deb822_lossless::Deb822;

/// A stated license as an SPDX expression, with the `LicenseRef-`s it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatedLicense {
    pub expression: String,
    /// `(LicenseRef-… id, the Debian name it stands for)`.
    pub references: Vec<(String, String)>,
}

/// The `License:` of the `Files: *` paragraph of a machine-readable
/// (DEP-5) copyright file; `None` when the file states none that way.
pub fn stated_by_copyright(copyright: &str) -> Option<String> {
    let document = Deb822::from_str(copyright).ok()?;
    let mut paragraphs = document.paragraphs();
    let header = paragraphs.next()?;
    if !header.get("Format")?.contains("copyright-format") {
        return None;
    }
    paragraphs
        .find(|p| {
            p.get("Files")
                .is_some_and(|files| files.split_whitespace().any(|f| f == "*"))
        })
        .and_then(|p| p.get("License"))
        .and_then(|license| license.lines().next().map(|l| l.trim().to_string()))
        .filter(|name| !name.is_empty())
}

/// The SPDX form of a Debian license line (`GPL-2+ or Artistic-2.0`).
/// `and`/`or` between terms are kept; anything else (commas, parentheses,
/// `with` exceptions) makes the whole line one `LicenseRef-`.
pub fn to_spdx(debian: &str) -> StatedLicense {
    let words: Vec<&str> = debian.split_whitespace().collect();
    let simple = !debian.contains([',', '(', ')'])
        && words.len() % 2 == 1
        && words
            .iter()
            .skip(1)
            .step_by(2)
            .all(|w| matches!(w.to_ascii_lowercase().as_str(), "and" | "or"));
    if !simple {
        return reference_for(debian);
    }
    let mut references = Vec::new();
    let mut parts = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if i % 2 == 1 {
            parts.push(word.to_ascii_uppercase());
        } else if let Some(id) = spdx_id(word) {
            parts.push(id);
        } else {
            let stated = reference_for(word);
            parts.push(stated.expression);
            references.extend(stated.references);
        }
    }
    references.sort();
    references.dedup();
    StatedLicense {
        expression: parts.join(" "),
        references,
    }
}

fn reference_for(debian: &str) -> StatedLicense {
    let id = reference_id(debian);
    StatedLicense {
        expression: id.clone(),
        references: vec![(id, debian.to_string())],
    }
}

/// `LicenseRef-debian-<name>`, the name made a valid id.
pub fn reference_id(debian: &str) -> String {
    format!("LicenseRef-debian-{}", super::document::id_string(debian))
}

/// The SPDX identifier of one license name: an SPDX id as such, or a
/// Debian short name that maps to exactly one (GPL/LGPL/AGPL/GFDL with a
/// version and optional `+`, BSD-n-clause, Expat).
fn spdx_id(name: &str) -> Option<String> {
    if let Some(id) = current_id(name) {
        return Some(id);
    }
    let (base, or_later) = match name.strip_suffix('+') {
        Some(base) => (base, true),
        None => (name, false),
    };
    let mapped = match base {
        "Expat" if !or_later => "MIT".to_string(),
        "BSD-2-clause" | "BSD-3-clause" | "BSD-4-clause" if !or_later => base.replace("clause", "Clause"),
        _ => {
            let (family, version) = base.rsplit_once('-')?;
            if !matches!(family, "GPL" | "LGPL" | "AGPL" | "GFDL") || version.is_empty() {
                return None;
            }
            let version = if version.contains('.') {
                version.to_string()
            } else {
                format!("{version}.0")
            };
            let suffix = if or_later { "or-later" } else { "only" };
            format!("{family}-{version}-{suffix}")
        }
    };
    current_id(&mapped)
}

/// An identifier of the SPDX license list that is not deprecated (`GPL-2.0`,
/// `LGPL-2.1+` are: they say nothing of "only" or "or later").
fn current_id(name: &str) -> Option<String> {
    spdx::license_id(name)
        .filter(|license| !license.is_deprecated() && license.name == name)
        .map(|license| license.name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_short_names_map_to_one_spdx_id_or_a_reference() {
        for (debian, spdx) in [
            ("GPL-2+", "GPL-2.0-or-later"),
            ("GPL-2", "GPL-2.0-only"),
            ("LGPL-2.1+", "LGPL-2.1-or-later"),
            ("GFDL-1.3+", "GFDL-1.3-or-later"),
            ("BSD-3-clause", "BSD-3-Clause"),
            ("Expat", "MIT"),
            ("Apache-2.0", "Apache-2.0"),
            ("Zlib", "Zlib"),
            ("GPL-2.0+", "GPL-2.0-or-later"),
            ("GPL-2+ or Artistic-2.0", "GPL-2.0-or-later OR Artistic-2.0"),
            ("public-domain", "LicenseRef-debian-public-domain"),
            ("Artistic", "LicenseRef-debian-Artistic"),
        ] {
            let stated = to_spdx(debian);
            assert_eq!(stated.expression, spdx, "{debian}");
            spdx::Expression::parse(&stated.expression).unwrap_or_else(|e| panic!("{debian}: {e}"));
            for (id, _) in &stated.references {
                assert!(stated.expression.contains(id.as_str()));
            }
        }
        for (debian, prefix) in [
            (
                "GPL-3+ with Bison exception",
                "LicenseRef-debian-GPL-3--with-Bison-exception-",
            ),
            (
                "GPL-2+, and BSD-3-clause",
                "LicenseRef-debian-GPL-2---and-BSD-3-clause-",
            ),
        ] {
            let stated = to_spdx(debian);
            assert!(
                stated.expression.starts_with(prefix),
                "{debian}: {}",
                stated.expression
            );
            assert_eq!(
                stated.references,
                [(stated.expression.clone(), debian.to_string())]
            );
        }
        assert_eq!(
            to_spdx("GPL-2+ or public-domain").references,
            [(
                "LicenseRef-debian-public-domain".to_string(),
                "public-domain".to_string()
            )]
        );
    }

    #[test]
    fn only_a_dep5_files_star_paragraph_states_the_license() {
        let dep5 = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
                    Upstream-Name: x\n\n\
                    Files: debian/*\nCopyright: 2020 A\nLicense: GPL-2+\n\n\
                    Files: *\nCopyright: 2019 B\nLicense: BSD-3-clause\n Redistribution and use...\n";
        assert_eq!(stated_by_copyright(dep5).as_deref(), Some("BSD-3-clause"));
        let no_star = dep5.replace("Files: *", "Files: src/*");
        assert_eq!(stated_by_copyright(&no_star), None);
        assert_eq!(
            stated_by_copyright("This package was debianized by A.\n\nLicense: GPL\n"),
            None
        );
        assert_eq!(stated_by_copyright(""), None);
    }
}
