//! What `imgbuild inspect` shows of a commit's records. Listing is not
//! judging: signatures are only said to be present here; `promote` verifies.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::clean;
use super::record::Record;
use crate::io::records::{self, RecordKind, StoredRecord};

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Listed {
    pub name: String,
    pub signed: bool,
    /// `hardware-id PLATFORM: VERDICT worst/budget`, or the promotion's
    /// target ref, or why the record does not read.
    pub summary: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Listing {
    pub qualifications: Vec<Listed>,
    pub promotions: Vec<Listed>,
}

pub fn list(repo: &Path, commit: &str) -> Result<Listing> {
    let listed = |kind, summarize: fn(&StoredRecord) -> String| -> Result<Vec<Listed>> {
        Ok(records::list(repo, kind, commit)?
            .iter()
            .map(|stored| Listed {
                name: clean(&stored.name),
                signed: stored.signature.is_some(),
                summary: summarize(stored),
            })
            .collect())
    };
    Ok(Listing {
        qualifications: listed(RecordKind::Qualification, summarize_qualification)?,
        promotions: listed(RecordKind::Promotion, summarize_promotion)?,
    })
}

fn summarize_qualification(stored: &StoredRecord) -> String {
    match serde_json::from_slice::<Record>(&stored.json) {
        // The verdict and attestation first; the target's own DMI text last, quoted.
        Ok(r) => clean(&format!(
            "{}: {}, attestation {}; worst case {} us, budget {} us, {} s, host key {}; platform {:?}",
            r.hardware.id,
            r.verdict,
            r.attestation_summary(),
            r.worst_us,
            r.budget_us,
            r.duration_s,
            r.host_key_established(),
            r.hardware.platform()
        )),
        Err(error) => clean(&format!("unreadable: {error}")),
    }
}

fn summarize_promotion(stored: &StoredRecord) -> String {
    match serde_json::from_slice::<serde_json::Value>(&stored.json) {
        Ok(doc) => clean(&format!(
            "promoted to {} on {}",
            doc["to"].as_str().unwrap_or("?"),
            doc["promoted"].as_str().unwrap_or("?")
        )),
        Err(error) => clean(&format!("unreadable: {error}")),
    }
}

pub fn render(listing: &Listing) -> String {
    let mut out = String::new();
    for (title, items) in [
        ("qualifications", &listing.qualifications),
        ("promotions", &listing.promotions),
    ] {
        out.push_str(&format!("{title}: {}\n", items.len()));
        for item in items {
            let signed = if item.signed { "signed" } else { "UNSIGNED" };
            out.push_str(&format!("  {} ({signed})\n    {}\n", item.name, item.summary));
        }
    }
    out
}
