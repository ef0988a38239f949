use super::*;

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb0BNNQoj3nWEsjM+9r/UoI4GBWm7F3uUbLuQGNTzYr ops@example.org";

fn text() -> String {
    format!(
        "\
flavor: rt
hostname: cell-07
ssh-authorized-keys: [\"{KEY}\"]
update-remote: {{url: https://updates.example.org/emberrtos/, gpg-key: publisher.asc}}
"
    )
}

fn err(text: &str) -> ProvisionError {
    parse(text, "provision.yaml").expect_err("must be refused")
}

#[test]
fn valid_file() {
    let p = parse(&text(), "provision.yaml").unwrap();
    assert_eq!(p.flavor, Flavor::Rt);
    assert_eq!(p.hostname, "cell-07");
    assert_eq!(p.authorized_keys(), format!("{KEY}\n"));
    let remote = p.update_remote.as_ref().unwrap();
    assert_eq!(remote.url, "https://updates.example.org/emberrtos/");
    assert_eq!(remote.gpg_key.as_deref(), Some("publisher.asc"));
    assert_eq!(p.gpg_key_on_medium().as_deref(), Some("emberrtos/publisher.asc"));
    assert_eq!(p.error("update-remote.gpg-key", "x").line(), Some(4));
}

#[test]
fn update_remote_and_its_key_are_optional() {
    let no_remote = format!("flavor: standard\nhostname: a\nssh-authorized-keys:\n  - {KEY}\n");
    let p = parse(&no_remote, "p.yaml").unwrap();
    assert_eq!(p.flavor, Flavor::Standard);
    assert!(p.update_remote.is_none() && p.gpg_key_on_medium().is_none());
    let no_key = format!("{no_remote}update-remote: {{url: 'http://10.0.2.2:8000/repo'}}\n");
    let p = parse(&no_key, "p.yaml").unwrap();
    assert!(p.update_remote.unwrap().gpg_key.is_none());
}

#[test]
fn each_bad_field_is_named_with_its_line_and_column() {
    let base = text();
    let cases: Vec<(String, &str, usize, &str)> = vec![
        (format!("{base}colour: blue\n"), "", 5, "unknown field `colour`"),
        (
            base.replace("gpg-key: publisher.asc", "gpg-key: k.asc, mirror: x"),
            "update-remote",
            4,
            "unknown field `mirror`",
        ),
        (
            base.replace("flavor: rt", "flavor: rt2"),
            "flavor",
            1,
            "unknown variant `rt2`",
        ),
        (
            base.replace("cell-07", "'cell;07'"),
            "hostname",
            2,
            "not a hostname",
        ),
        (
            base.replace("cell-07", "cell_07"),
            "hostname",
            2,
            "not a hostname",
        ),
        (
            base.replace(&format!("\"{KEY}\""), &format!("\"{KEY}\\nssh-ed25519 AAAA x\"")),
            "ssh-authorized-keys[0]",
            3,
            "one line",
        ),
        (
            base.replace(&format!("\"{KEY}\""), &format!("'command=\"sh\" {KEY}'")),
            "ssh-authorized-keys[0]",
            3,
            "options are not allowed",
        ),
        (
            base.replace(
                &format!("\"{KEY}\""),
                &format!("\"{KEY}\", 'ssh-ed25519 AAAAnotakey'"),
            ),
            "ssh-authorized-keys[1]",
            3,
            "not an OpenSSH public key",
        ),
        (
            base.replace(&format!("[\"{KEY}\"]"), "[]"),
            "ssh-authorized-keys",
            3,
            "at least one key",
        ),
        (
            base.replace("publisher.asc", "../publisher.asc"),
            "update-remote.gpg-key",
            4,
            "`..`",
        ),
        (
            base.replace("publisher.asc", "/etc/shadow"),
            "update-remote.gpg-key",
            4,
            "absolute",
        ),
        (
            base.replace("https://updates.example.org/emberrtos/", "ftp://x/"),
            "update-remote.url",
            4,
            "http",
        ),
        (
            base.replace("hostname: cell-07\n", ""),
            "",
            1,
            "missing field `hostname`",
        ),
        (
            format!("{base}flavor: standard\n"),
            "",
            1,
            "duplicate field `flavor`",
        ),
    ];
    for (text, field, line, message) in cases {
        let e = err(&text);
        assert_eq!(e.field, field, "{e}\n---\n{text}");
        assert_eq!(e.line(), Some(line), "{e}\n---\n{text}");
        assert!(e.column().is_some(), "{e}");
        assert!(e.message.contains(message), "{e}\n---\n{text}");
        assert!(
            e.to_string().starts_with(&format!("provision.yaml:{line}:")),
            "{e}"
        );
    }
}

#[test]
fn field_column_points_at_the_value() {
    let e = err(&text().replace("cell-07", "cell;07"));
    assert_eq!((e.line(), e.column()), (Some(2), Some(11)));
    assert_eq!(
        e.to_string(),
        "provision.yaml:2:11: hostname: \"cell;07\" is not a hostname: use labels of letters, digits and `-` (not at either end), at most 63 characters each, separated by `.`"
    );
}

#[test]
fn not_a_mapping_and_garbage_are_errors_not_panics() {
    for text in ["", "- a\n- b\n", "flavor: [rt", "\u{0}", "? [a]\n: b\n"] {
        let _ = err(text);
    }
}

/// A distinct, valid ed25519 key line with `comment`.
fn nth_key(n: u8, comment: &str) -> String {
    use ssh_key::public::{Ed25519PublicKey, KeyData};
    ssh_key::PublicKey::new(KeyData::Ed25519(Ed25519PublicKey([n; 32])), comment)
        .to_openssh()
        .unwrap()
}

fn with_keys(keys: &[String]) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("'{k}'")).collect();
    format!(
        "flavor: standard\nhostname: a\nssh-authorized-keys: [{}]\n",
        list.join(", ")
    )
}

#[test]
fn billion_laughs_is_refused_before_deserializing_naming_the_limit() {
    let laughs: String = (1..10)
        .map(|level| {
            format!(
                "&h{level} [{}], ",
                vec![format!("*h{}", level - 1); 10].join(", ")
            )
        })
        .collect();
    let text = text()
        .replace("hostname: cell-07", "hostname: &h0 cell-07")
        .replace(
            "ssh-authorized-keys: [",
            &format!("ssh-authorized-keys: [{laughs}"),
        );
    assert!(text.len() < 4096, "{}", text.len());
    let e = err(&text);
    assert_eq!(e.field, "");
    assert!(e.line().is_some() && e.column().is_some(), "{e}");
    assert!(
        e.message
            .contains("aliases expand the document beyond the limit of 1048576"),
        "{e}"
    );
}

#[test]
fn ten_thousand_nested_lists_are_refused_by_the_depth_limit() {
    let text = format!(
        "{}hostname: {}{}\n",
        text().replace("hostname: cell-07\n", ""),
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let e = err(&text);
    assert_eq!((e.field.as_str(), e.line()), ("", Some(4)), "{e}");
    assert!(e.message.contains("deeper than the limit of 64 levels"), "{e}");
}

#[test]
fn a_benign_alias_still_parses_and_a_repeated_key_is_written_once() {
    let text = format!(
        "flavor: rt\nhostname: cell-07\nssh-authorized-keys: [&ops \"{KEY}\", *ops, \"{}\"]\n",
        KEY.replace("ops@example.org", "same key, other comment")
    );
    let p = parse(&text, "provision.yaml").unwrap();
    assert_eq!(p.ssh_authorized_keys(), [KEY]);
    assert_eq!(p.authorized_keys(), format!("{KEY}\n"));
}

#[test]
fn more_than_64_keys_are_refused_on_the_field() {
    let keys: Vec<String> = (0..=64).map(|n| nth_key(n, "k")).collect();
    let e = err(&with_keys(&keys));
    assert_eq!((e.field.as_str(), e.line()), ("ssh-authorized-keys", Some(3)));
    assert!(e.message.contains("lists 65 keys: at most 64"), "{e}");
    // The cap counts entries as written: 65 copies of one key are refused too.
    let e = err(&with_keys(&vec![KEY.to_string(); 65]));
    assert!(e.message.contains("at most 64"), "{e}");
    let p = parse(&with_keys(&keys[..64]), "p.yaml").unwrap();
    assert_eq!(p.authorized_keys().lines().count(), 64);
}

#[test]
fn an_authorized_keys_file_over_its_byte_cap_is_refused() {
    let comment = "c".repeat(MAX_AUTHORIZED_KEYS_BYTES / 60);
    let keys: Vec<String> = (0..64).map(|n| nth_key(n, &comment)).collect();
    let e = err(&with_keys(&keys));
    assert_eq!(e.field, "ssh-authorized-keys");
    assert!(
        e.message
            .contains(&format!("at most {MAX_AUTHORIZED_KEYS_BYTES} are allowed")),
        "{e}"
    );
}

/// A 23 KB medium once became a 33 MB `authorized_keys`: one long key,
/// aliased thousands of times.
#[test]
fn a_key_list_amplified_by_aliases_is_refused() {
    let long = nth_key(1, &"c".repeat(6000));
    let aliases = vec!["*k"; 4000].join(",");
    let text = format!("flavor: standard\nhostname: a\nssh-authorized-keys: [&k '{long}',{aliases}]\n");
    assert!(text.len() < 24 * 1024, "{}", text.len());
    let e = err(&text);
    assert!(e.message.contains("aliases expand"), "{e}");
}

#[test]
fn a_gpg_key_name_fat_or_iso9660_would_change_is_refused() {
    for (name, message) in [
        ("provision.yaml.", "where the medium keeps `provision.yaml`"),
        ("PROVISION.YAML", "where the medium keeps `provision.yaml`"),
        ("Provision.yaml./k.asc", "where the medium keeps `provision.yaml`"),
        ("publisher.asc.", "ends in `.`"),
        ("Publisher.asc", "lowercase"),
    ] {
        let e = err(&text().replace("gpg-key: publisher.asc", &format!("gpg-key: '{name}'")));
        assert_eq!((e.field.as_str(), e.line()), ("update-remote.gpg-key", Some(4)));
        assert!(e.message.contains(message), "{name:?}: {e}");
    }
}
