//! The site's pages, rendered from [`Site`] (pure): `index.html` (every
//! ref's history), `matrix.html` (commits × boards), a page per commit and
//! a page per qualification record. Every string from a commit, a record or
//! a device goes through [`esc`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::html::{bytes, esc, facts, link, page, table, tagged};
use super::model::{Authenticity, CommitView, PromotionView, RecordView, Site};
use super::plot;
use crate::commands::diff::CommitDiff;
use crate::qualify::record::Record;

/// The most histogram buckets a record's page lists as a table.
const MAX_HISTOGRAM_ROWS: usize = 2000;

/// One file of the site: its path under the site's root, and its text.
pub type SiteFile = (String, String);

/// Every page of the site.
pub fn render(site: &Site) -> Vec<SiteFile> {
    let mut files = vec![
        ("index.html".to_string(), index(site)),
        ("matrix.html".to_string(), matrix(site)),
    ];
    for view in site.commits.values() {
        files.push((commit_page(&view.info.checksum), commit(site, view)));
        for record in &view.records {
            files.push((
                record_page(&view.info.checksum, &record.name),
                record_view(view, record),
            ));
        }
    }
    files
}

/// The path of a commit's page.
pub fn commit_page(checksum: &str) -> String {
    format!("commit/{checksum}.html")
}

/// The path of a record's page: its name when that is a record name the
/// store allows (as `imgbuild qualify` writes them), else `~` and a hash of
/// it, which no such name can be.
pub fn record_page(checksum: &str, name: &str) -> String {
    let stem = name.strip_suffix(".json").unwrap_or(name);
    let plain = crate::io::records::check_name(name).is_ok() && !stem.is_empty();
    let stem = match plain {
        true => stem.to_string(),
        false => format!("~{}", crate::io::hashing::sha256_hex(name)),
    };
    format!("record/{checksum}/{stem}.html")
}

/// Refuses two pages at one path: one would hide the other.
pub fn check_unique(files: &[SiteFile]) -> anyhow::Result<()> {
    let mut seen = BTreeSet::new();
    match files.iter().find(|(rel, _)| !seen.insert(rel.as_str())) {
        Some((rel, _)) => {
            anyhow::bail!("two pages would be written to {rel}: a record's name collides with another's")
        }
        None => Ok(()),
    }
}

/// The class a verdict is styled with: one of the three jitter gives, or
/// `unknown` (a record's own word is never a class of the site's).
fn verdict_class(verdict: &str) -> &'static str {
    match verdict {
        "PASS" => "PASS",
        "FAIL" => "FAIL",
        "INVALID" => "INVALID",
        _ => "unknown",
    }
}

fn short(checksum: &str) -> &str {
    &checksum[..checksum.len().min(12)]
}

fn meta(view: &CommitView, key: &str) -> String {
    view.info
        .metadata
        .get(key)
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
        .unwrap_or_default()
}

fn date(timestamp: u64) -> String {
    rtreport::utc::rfc3339(timestamp)
}

/// The word alone, for tables with a column per fact.
fn authenticity_word(value: &Authenticity) -> String {
    match value {
        Authenticity::NotAuthentic(_) => tagged(value.word(), "NOT authentic"),
        _ => tagged(value.word(), value.word()),
    }
}

/// The word and, for what is not authentic, why.
fn authenticity(value: &Authenticity) -> String {
    match value {
        Authenticity::NotAuthentic(why) => {
            format!("{} ({})", tagged(value.word(), "NOT authentic"), esc(why))
        }
        Authenticity::Unsigned => tagged(value.word(), "unsigned"),
        Authenticity::Authentic => tagged(value.word(), "authentic"),
    }
}

/// `n pass of m` for the commit's RT checks, or why there are none.
fn checks_summary(view: &CommitView) -> String {
    match &view.evidence {
        Ok(evidence) => {
            let failed = evidence.failures().count();
            let passed = evidence
                .checks
                .iter()
                .filter(|c| c.status == rtcheck::Status::Pass)
                .count();
            let word = if failed == 0 { "pass" } else { "fail" };
            tagged(
                word,
                &format!("{passed} pass, {failed} fail of {}", evidence.checks.len()),
            )
        }
        Err(_) => tagged("skip", "no RT evidence"),
    }
}

fn index(site: &Site) -> String {
    let mut body = String::from("<h1>EmberRTOS releases</h1>\n");
    let _ = writeln!(
        body,
        "<p>Signatures checked against {}.</p>",
        esc(&site.trusted.join(", "))
    );
    for history in &site.refs {
        let _ = writeln!(body, "<h2>{}</h2>", esc(&history.name));
        let rows: Vec<Vec<String>> = history
            .commits
            .iter()
            .filter_map(|checksum| site.commits.get(checksum))
            .map(|view| {
                let update = match &view.changes {
                    Some(Ok(diff)) => bytes(diff.download.bytes),
                    Some(Err(_)) => "unknown".into(),
                    None => "first".into(),
                };
                vec![
                    link(&commit_page(&view.info.checksum), short(&view.info.checksum)),
                    esc(&meta(view, "version")),
                    esc(&date(view.info.timestamp)),
                    esc(&meta(view, crate::stages::commit::key::FLAVOR)),
                    esc(&meta(view, crate::stages::commit::key::KERNEL_RELEASE)),
                    checks_summary(view),
                    authenticity_word(&view.signature),
                    qualification_summary(&view.records),
                    update,
                ]
            })
            .collect();
        body.push_str(&table(
            &format!("{} commits of {}, newest first", rows.len(), history.name),
            &[
                "Commit",
                "Version",
                "Date",
                "Flavor",
                "Kernel",
                "RT checks",
                "Signature",
                "Qualified",
                "Update",
            ],
            &rows,
        ));
    }
    page("EmberRTOS releases", "", &body)
}

/// `2 PASS of 3 authentic records`.
fn qualification_summary(records: &[RecordView]) -> String {
    let authentic: Vec<&Record> = records
        .iter()
        .filter(|r| r.authenticity == Authenticity::Authentic)
        .filter_map(|r| r.record.as_ref().ok())
        .collect();
    let passed = authentic.iter().filter(|r| r.verdict == "PASS").count();
    let others = records.len() - authentic.len();
    let mut text = format!("{passed} PASS of {} authentic", authentic.len());
    if others > 0 {
        let _ = write!(text, ", {others} not");
    }
    esc(&text)
}

/// A commit's authentic records, by board: the one that finished last.
fn latest_authentic(view: &CommitView) -> BTreeMap<&str, (&RecordView, &Record)> {
    let mut latest: BTreeMap<&str, (&RecordView, &Record)> = BTreeMap::new();
    let authentic = view
        .records
        .iter()
        .filter(|r| r.authenticity == Authenticity::Authentic)
        .filter_map(|r| r.record.as_ref().ok().map(|record| (r, record)));
    for (shown, record) in authentic {
        let slot = latest
            .entry(record.hardware.id.as_str())
            .or_insert((shown, record));
        if record.finished > slot.1.finished {
            *slot = (shown, record);
        }
    }
    latest
}

/// Commits × boards, from authentic records only: an unsigned or forged
/// record can neither add a column nor hide a real result.
fn matrix(site: &Site) -> String {
    let latest: BTreeMap<&str, BTreeMap<&str, (&RecordView, &Record)>> = site
        .commits
        .iter()
        .map(|(checksum, view)| (checksum.as_str(), latest_authentic(view)))
        .collect();
    let boards: BTreeSet<&str> = latest.values().flat_map(|cells| cells.keys().copied()).collect();
    let mut commits: Vec<&CommitView> = site.commits.values().collect();
    commits.sort_by_key(|view| std::cmp::Reverse(view.info.timestamp));
    let rows: Vec<Vec<String>> = commits
        .iter()
        .map(|view| {
            let mut row = vec![format!(
                "{} {}",
                link(&commit_page(&view.info.checksum), short(&view.info.checksum)),
                esc(&meta(view, "version"))
            )];
            let cells = &latest[view.info.checksum.as_str()];
            row.extend(boards.iter().map(|board| matrix_cell(view, cells.get(board))));
            row
        })
        .collect();
    let mut head = vec!["Commit"];
    head.extend(boards.iter().copied());
    let mut body = String::from("<h1>Qualification matrix</h1>\n");
    body.push_str(
        "<p>Each cell: the latest authentic record of that board for that commit, its verdict and worst case against its budget. \
         Records that are not authentic are not counted here; each commit's page lists them, marked.</p>\n",
    );
    body.push_str(&table(
        &format!("{} commits × {} boards", rows.len(), boards.len()),
        &head,
        &rows,
    ));
    page("Qualification matrix", "", &body)
}

/// A board's latest authentic record of the commit, linked.
fn matrix_cell(view: &CommitView, latest: Option<&(&RecordView, &Record)>) -> String {
    let Some((shown, record)) = latest else {
        return "—".into();
    };
    let figure = format!("{} {}/{} µs", record.verdict, record.worst_us, record.budget_us);
    let cell = link(&record_page(&view.info.checksum, &shown.name), &figure);
    format!("<span class=\"{}\">{cell}</span>", verdict_class(&record.verdict))
}

fn commit(site: &Site, view: &CommitView) -> String {
    let info = &view.info;
    let version = meta(view, "version");
    let mut body = format!(
        "<h1>Commit {} <code>{}</code></h1>\n",
        esc(&version),
        esc(short(&info.checksum))
    );
    let parent = match &info.parent {
        Some(parent) if site.commits.contains_key(parent) => {
            format!(
                "<a href=\"{}.html\"><code>{}</code></a>",
                esc(parent),
                esc(parent)
            )
        }
        Some(parent) => format!("<code>{}</code> (not in the repo)", esc(parent)),
        None => "none".into(),
    };
    let kargs = info
        .metadata
        .get(crate::stages::commit::key::KARGS)
        .and_then(|v| v.as_array())
        .map(|words| {
            words
                .iter()
                .filter_map(|w| w.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    body.push_str(&facts(&[
        (
            "Checksum",
            format!("<code class=\"hash\">{}</code>", esc(&info.checksum)),
        ),
        ("Parent", parent),
        ("Subject", esc(&info.subject)),
        ("Date", esc(&date(info.timestamp))),
        ("Flavor", esc(&meta(view, crate::stages::commit::key::FLAVOR))),
        (
            "Kernel",
            esc(&meta(view, crate::stages::commit::key::KERNEL_RELEASE)),
        ),
        ("Architecture", esc(&meta(view, crate::stages::commit::key::ARCH))),
        (
            "Kernel arguments",
            match kargs.is_empty() {
                true => "none".into(),
                false => format!("<code>{}</code>", esc(&kargs)),
            },
        ),
        ("Signature", authenticity(&view.signature)),
    ]));
    body.push_str(&checks(view));
    body.push_str(&sizes(view));
    body.push_str(&records_table(view));
    body.push_str(&promotions_table(&view.info.checksum, &view.promotions));
    body.push_str(&changes(view, site.cve_source.as_deref()));
    page(
        &format!("Commit {version} {}", short(&info.checksum)),
        "../",
        &body,
    )
}

fn checks(view: &CommitView) -> String {
    let mut out = String::from("<h2>PREEMPT_RT checks</h2>\n");
    match &view.evidence {
        Ok(evidence) => {
            let rows: Vec<Vec<String>> = evidence
                .checks
                .iter()
                .map(|check| {
                    let status = check.status.to_string();
                    vec![
                        format!("<code>{}</code>", esc(&check.id)),
                        tagged(&status, &status),
                        esc(&check.detail),
                    ]
                })
                .collect();
            out.push_str(&table(
                "Every check, on the kernel image and on the booted kernel",
                &["Check", "Result", "Detail"],
                &rows,
            ));
        }
        Err(why) => {
            let _ = writeln!(out, "<p>{}: {}</p>", tagged("skip", "No RT evidence"), esc(why));
        }
    }
    out
}

fn sizes(view: &CommitView) -> String {
    let mut items = Vec::new();
    match &view.changes {
        Some(Ok(diff)) => {
            let d = &diff.download;
            items.push((
                "From the previous commit",
                format!(
                    "{} ({}; {} superblock)",
                    esc(&bytes(d.bytes)),
                    esc(d.by),
                    esc(&bytes(d.superblock_bytes))
                ),
            ));
        }
        Some(Err(why)) => items.push(("From the previous commit", format!("unknown: {}", esc(why)))),
        None => items.push((
            "From the previous commit",
            "no previous commit in the repo".into(),
        )),
    }
    let full = match &view.full_bytes {
        Ok(n) => esc(&bytes(*n)),
        Err(why) => format!("unknown: {}", esc(why)),
    };
    items.push(("A first pull (every object)", full));
    format!("<h2>Update size</h2>\n{}", facts(&items))
}

fn records_table(view: &CommitView) -> String {
    let rows: Vec<Vec<String>> = view
        .records
        .iter()
        .map(|r| {
            let page = link(
                &format!("../{}", record_page(&view.info.checksum, &r.name)),
                &r.name,
            );
            match &r.record {
                Ok(record) => vec![
                    page,
                    esc(&record.hardware.id),
                    esc(&record.hardware.platform()),
                    tagged(verdict_class(&record.verdict), &record.verdict),
                    esc(&format!("{} / {} µs", record.worst_us, record.budget_us)),
                    esc(&format!("{} s", record.duration_s)),
                    authenticity(&r.authenticity),
                ],
                Err(why) => vec![
                    page,
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    format!("{} {}", authenticity(&r.authenticity), esc(why)),
                ],
            }
        })
        .collect();
    format!(
        "<h2>Qualification</h2>\n{}",
        table(
            &format!("{} records", rows.len()),
            &[
                "Record",
                "Hardware",
                "Platform",
                "Verdict",
                "Worst / budget",
                "Duration",
                "Signature"
            ],
            &rows,
        )
    )
}

fn promotions_table(checksum: &str, promotions: &[PromotionView]) -> String {
    let rows: Vec<Vec<String>> = promotions
        .iter()
        .map(|p| {
            let records: Vec<String> = p
                .records
                .iter()
                .map(|name| link(&format!("../{}", record_page(checksum, name)), name))
                .collect();
            vec![
                esc(&p.to),
                esc(&p.promoted),
                records.join(", "),
                authenticity(&p.authenticity),
                esc(&p.name),
            ]
        })
        .collect();
    format!(
        "<h2>Promotions</h2>\n{}",
        table(
            &format!("{} promotions", rows.len()),
            &["To", "When", "Allowed by", "Signature", "Record"],
            &rows,
        )
    )
}

fn changes(view: &CommitView, cve_source: Option<&str>) -> String {
    let mut out = String::from("<h2>Changes from the previous commit</h2>\n");
    let diff = match &view.changes {
        None => return out + "<p>No previous commit in the repo.</p>\n",
        Some(Err(why)) => return out + &format!("<p>Unknown: {}</p>\n", esc(why)),
        Some(Ok(diff)) => diff,
    };
    out.push_str(&package_changes(diff));
    let symbols: Vec<Vec<String>> = diff
        .kernel_symbols
        .iter()
        .map(|s| {
            let value = |v: &Option<String>| esc(v.as_deref().unwrap_or("absent"));
            vec![
                format!("<code>{}</code>", esc(&s.symbol)),
                value(&s.from),
                value(&s.to),
            ]
        })
        .collect();
    out.push_str(&table(
        "Kernel configuration",
        &["Symbol", "Before", "After"],
        &symbols,
    ));
    let kargs = |list: &[String]| esc(&list.join(" "));
    out.push_str(&facts(&[
        ("Kernel arguments added", kargs(&diff.kargs.added)),
        ("Kernel arguments removed", kargs(&diff.kargs.removed)),
    ]));
    let files: Vec<Vec<String>> = diff
        .files
        .iter()
        .map(|(group, f)| {
            let count = |names: &[String], left_out: usize| (names.len() + left_out).to_string();
            vec![
                format!("<code>{}</code>", esc(group)),
                count(&f.added, f.omitted.added),
                count(&f.removed, f.omitted.removed),
                count(&f.changed, f.omitted.changed),
            ]
        })
        .collect();
    out.push_str(&table(
        "Files, by directory",
        &["Group", "Added", "Removed", "Changed"],
        &files,
    ));
    out.push_str(&cve_changes(diff, cve_source));
    out
}

fn package_changes(diff: &CommitDiff) -> String {
    let p = &diff.packages;
    let mut rows: Vec<Vec<String>> = Vec::new();
    for added in &p.added {
        rows.push(vec![
            "added".into(),
            esc(&added.name),
            String::new(),
            esc(&added.version),
        ]);
    }
    for removed in &p.removed {
        rows.push(vec![
            "removed".into(),
            esc(&removed.name),
            esc(&removed.version),
            String::new(),
        ]);
    }
    for (word, list) in [("upgraded", &p.upgraded), ("downgraded", &p.downgraded)] {
        for change in list {
            rows.push(vec![
                word.into(),
                esc(&change.name),
                esc(&change.from),
                esc(&change.to),
            ]);
        }
    }
    table("Packages", &["Change", "Package", "Before", "After"], &rows)
}

fn cve_changes(diff: &CommitDiff, source: Option<&str>) -> String {
    let (Some(cve), Some(source)) = (&diff.cve, source) else {
        return "<p>No vulnerability data was given: known vulnerabilities are not shown.</p>\n".into();
    };
    let mut rows = Vec::new();
    for (word, list) in [("fixed", &cve.fixed), ("introduced", &cve.introduced)] {
        for finding in list {
            rows.push(vec![
                word.to_string(),
                esc(&finding.id),
                esc(&finding.source),
                esc(finding.urgency.as_str()),
            ]);
        }
    }
    format!(
        "<p>Known vulnerabilities by {} (sha256 <code class=\"hash\">{}</code>).</p>\n{}",
        esc(source),
        esc(&cve.database_sha256),
        table(
            "Known vulnerabilities",
            &["Change", "Id", "Source package", "Urgency"],
            &rows
        )
    )
}

fn record_view(view: &CommitView, record_view: &RecordView) -> String {
    let mut body = format!("<h1>Qualification record {}</h1>\n", esc(&record_view.name));
    let _ = writeln!(
        body,
        "<p>Commit {} — signature: {}</p>",
        link(
            &format!("../../{}", commit_page(&view.info.checksum)),
            &view.info.checksum
        ),
        authenticity(&record_view.authenticity)
    );
    match &record_view.record {
        Ok(record) => body.push_str(&record_body(record)),
        Err(why) => {
            let _ = writeln!(body, "<p>{}</p>", esc(why));
        }
    }
    page(&format!("Record {}", record_view.name), "../../", &body)
}

fn record_body(record: &Record) -> String {
    let h = &record.hardware;
    let mut out = facts(&[
        ("Verdict", tagged(verdict_class(&record.verdict), &record.verdict)),
        (
            "Worst case",
            esc(&format!(
                "{} µs (budget {} µs)",
                record.worst_us, record.budget_us
            )),
        ),
        ("Reasons", esc(&record.reasons.join("; "))),
        (
            "Duration",
            esc(&format!(
                "{} s, {} to {}",
                record.duration_s, record.started, record.finished
            )),
        ),
        ("Hardware id", format!("<code>{}</code>", esc(&h.id))),
        (
            "Platform",
            esc(&format!(
                "{} {} (board {}, BIOS {})",
                h.sys_vendor, h.product_name, h.board_name, h.bios_version
            )),
        ),
        (
            "CPU",
            esc(&format!(
                "{}, {} cores, microcode {}, {} KiB memory",
                h.cpu_model, h.cores, h.microcode, h.memory_kib
            )),
        ),
        (
            "Kernel",
            esc(&format!(
                "{} {}",
                record.kernel.release, record.kernel.uts_version
            )),
        ),
        (
            "Host key",
            esc(&format!(
                "{} {} ({})",
                record.target.host_key.algorithm,
                record.target.host_key.fingerprint,
                record.host_key_established()
            )),
        ),
        ("Measured from", esc(&record.operator_host)),
        ("Attestation", esc(&record.attestation_summary())),
    ]);
    let histogram = plot::histogram(&record.report);
    out.push_str("<h2>Latency</h2>\n");
    let label = format!(
        "Latency histogram: samples per microsecond of latency on a log scale, {} buckets, budget {} µs; the table below holds the same numbers",
        histogram.len(),
        record.budget_us
    );
    out.push_str(&plot::svg(&histogram, record.budget_us, &label));
    let rows: Vec<Vec<String>> = histogram
        .iter()
        .take(MAX_HISTOGRAM_ROWS)
        .map(|(us, count)| vec![us.to_string(), count.to_string()])
        .collect();
    out.push_str("<details><summary>The histogram as a table</summary>\n");
    if histogram.len() > MAX_HISTOGRAM_ROWS {
        let _ = writeln!(
            out,
            "<p>The first {MAX_HISTOGRAM_ROWS} of {} buckets.</p>",
            histogram.len()
        );
    }
    out.push_str(&table(
        "Samples per latency, all cores",
        &["Latency (µs)", "Samples"],
        &rows,
    ));
    out.push_str("</details>\n");
    out.push_str(&spikes(&record.report));
    out
}

/// The spikes rtla analysed, with the threads it named: text from the
/// device, escaped.
fn spikes(report: &serde_json::Value) -> String {
    let Some(list) = report["spikes"].as_array().filter(|l| !l.is_empty()) else {
        return String::new();
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .take(50)
        .map(|spike| {
            let causes: Vec<String> = spike["causes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c["what"].as_str().unwrap_or("").to_string())
                .collect();
            vec![
                esc(&spike["cpu"].to_string()),
                esc(spike["kind"].as_str().unwrap_or("")),
                esc(&spike["latency_us"].to_string()),
                esc(&causes.join("; ")),
            ]
        })
        .collect();
    format!(
        "<h2>Spikes</h2>\n{}",
        table(
            "Latencies over the trace threshold",
            &["CPU", "Kind", "Latency (µs)", "Causes"],
            &rows
        )
    )
}
