//! HTML for the release site: escaping, and the page every page is made
//! of. Nothing reaches a page unescaped but the markup written here; and a
//! Content-Security-Policy forbids every script, so that even a string
//! this code failed to escape could not run one.

use std::fmt::Write;

use base64::Engine;
use sha2::{Digest, Sha256};

/// `text` made safe for HTML text and for attribute values in double or
/// single quotes.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters (a terminal's escapes, NUL) are not text.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            // Bidirectional overrides would reorder what a reader sees.
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                out.push('\u{fffd}')
            }
            c => out.push(c),
        }
    }
    out
}

/// The site's one stylesheet, inline: the policy allows it by its hash.
const STYLE: &str = "\
:root{color-scheme:light dark;--line:#8884;--pass:#1a7f37;--fail:#cf222e;--warn:#9a6700}
body{font:16px/1.45 system-ui,sans-serif;margin:0 auto;max-width:72rem;padding:0 1rem 3rem}
header{border-bottom:1px solid var(--line);margin-bottom:1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2rem}
.scroll{overflow-x:auto}
table{border-collapse:collapse;margin:.5rem 0;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:.25rem 0}
th,td{border:1px solid var(--line);padding:.3rem .5rem;text-align:left;vertical-align:top}
code,.hash{font-family:ui-monospace,monospace;font-size:.9em;word-break:break-all}
.PASS,.pass,.authentic{color:var(--pass);font-weight:600}
.FAIL,.fail,.INVALID,.not-authentic{color:var(--fail);font-weight:600}
.skip,.unsigned{color:var(--warn);font-weight:600}
svg{max-width:100%;height:auto}
svg .bar{fill:#0969da}svg .budget{stroke:#cf222e;stroke-width:2}svg .axis{stroke:currentColor}
svg text{fill:currentColor;font-size:12px}
nav a{margin-right:1rem}
";

/// The policy: no script, no plugin, no frame, no form, no remote fetch;
/// the inline stylesheet by its hash.
pub fn content_security_policy() -> String {
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(STYLE.as_bytes()));
    format!(
        "default-src 'none'; style-src 'sha256-{hash}'; img-src 'none'; base-uri 'none'; form-action 'none'"
    )
}

/// One page: `title` (text), `up` the relative path to the site's root
/// (`""` or `"../"`), and `body`, already HTML.
pub fn page(title: &str, up: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"referrer\" content=\"no-referrer\">\n\
         <title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <header><nav aria-label=\"site\"><a href=\"{up}index.html\">Releases</a>\
         <a href=\"{up}matrix.html\">Qualification matrix</a></nav></header>\n\
         <main>\n{body}</main>\n</body>\n</html>\n",
        csp = content_security_policy(),
        title = esc(title),
    );
    out
}

/// A table: `caption` (text), `head` (texts), rows of cells already HTML,
/// in a box that scrolls sideways on a narrow screen; without rows, a line
/// that says so.
pub fn table(caption: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    if rows.is_empty() {
        return format!("<p>{}: none.</p>\n", esc(caption));
    }
    let mut out = String::from("<div class=\"scroll\"><table>\n");
    let _ = writeln!(out, "<caption>{}</caption>", esc(caption));
    out.push_str("<thead><tr>");
    for cell in head {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(cell));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// A definition list of (term, HTML value) pairs.
pub fn facts(items: &[(&str, String)]) -> String {
    let mut out = String::from("<dl>\n");
    for (term, value) in items {
        let _ = writeln!(out, "<dt>{}</dt><dd>{value}</dd>", esc(term));
    }
    out.push_str("</dl>\n");
    out
}

/// A link to `href` (a path this site made) with text `text`.
pub fn link(href: &str, text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(href), esc(text))
}

/// `text` in a span of class `class` (one of the site's own words).
pub fn tagged(class: &str, text: &str) -> String {
    format!("<span class=\"{}\">{}</span>", esc(class), esc(text))
}

/// A byte count as people read it: `1.4 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'onload='"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;onload=&#39;"
        );
        assert_eq!(esc("a\u{1b}[2Jb\0"), "a\u{fffd}[2Jb\u{fffd}");
        assert_eq!(esc("txt\u{202e}gpj"), "txt\u{fffd}gpj");
    }

    #[test]
    fn the_page_forbids_script_and_allows_its_own_style_only() {
        let html = page("<t>", "../", "<p>x</p>");
        let csp = content_security_policy();
        assert!(csp.starts_with("default-src 'none'; style-src 'sha256-"), "{csp}");
        assert!(!csp.contains("unsafe") && !csp.contains("script-src"), "{csp}");
        assert!(html.contains(&format!("content=\"{csp}\"")));
        assert!(html.contains("<title>&lt;t&gt;</title>"));
        assert!(!html.contains("<script"));
    }

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
