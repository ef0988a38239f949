use super::*;
use crate::io::hashing::is_sha256_hex;

const SHA: &str = "6b2e8f8a2f5c1c4a3a4d3f0b5e9e1c2d3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c";

fn recipe_text(source: &str, fragments: &str, flavor: &str) -> String {
    format!(
        "\
name: emberrtos
version: \"2026.11.1\"
flavor: {flavor}
kernel:
  source: {source}
  base: tinyconfig
  fragments: {fragments}
  cmdline: [nohz_full=1, \"isolcpus=managed_irq,domain,1\"]
rootfs:
  base: {{ debian: bookworm, packages: [systemd-sysv] }}
  overlays: [overlay]
ostree: {{ ref: emberrtos/x86_64/rt }}
"
    )
}

/// A recipe dir with `rt.config`, `tiny.config`, `noexpert.config` and an overlay.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rt.config"),
        "CONFIG_EXPERT=y\nCONFIG_PREEMPT_RT=y\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("tiny.config"), "CONFIG_64BIT=y\n").unwrap();
    std::fs::write(dir.path().join("off.config"), "# CONFIG_PREEMPT_RT is not set\n").unwrap();
    std::fs::create_dir(dir.path().join("overlay")).unwrap();
    dir
}

fn load(dir: &tempfile::TempDir, text: &str) -> Result<Recipe, RecipeError> {
    let file = dir.path().join("recipe.yaml");
    std::fs::write(&file, text).unwrap();
    Recipe::load(&file)
}

fn err(dir: &tempfile::TempDir, text: &str) -> RecipeError {
    load(dir, text).expect_err("recipe should be refused")
}

#[test]
fn valid_recipe_resolves_paths_against_its_directory() {
    let dir = workspace();
    let text = recipe_text(
        "{ debian: linux-source-6.12 }",
        "[tiny.config, ./sub/../rt.config]",
        "rt",
    );
    let recipe = load(&dir, &text).unwrap();
    assert_eq!(recipe.flavor, Flavor::Rt);
    assert_eq!(
        recipe.kernel.source,
        Source::Debian {
            package: "linux-source-6.12".into()
        }
    );
    assert_eq!(recipe.kernel.base, ConfigBase::Target("tinyconfig".into()));
    assert_eq!(
        recipe.kernel.fragments[1],
        normalize(&dir.path().join("rt.config"))
    );
    assert_eq!(recipe.rootfs.overlays[0], normalize(&dir.path().join("overlay")));
    assert_eq!(recipe.kernel.cmdline[1], "isolcpus=managed_irq,domain,1");
    assert!(is_sha256_hex(recipe.image_sha256()), "{}", recipe.sha256);
    assert_eq!(recipe.ostree.ref_name, "emberrtos/x86_64/rt");
    match &recipe.rootfs.base {
        RootfsBase::Debian { suite, variant, .. } => {
            assert_eq!(suite, "bookworm");
            assert_eq!(variant, "minbase");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_key_is_an_error_with_position() {
    let dir = workspace();
    let text = recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt")
        .replace("  base: tinyconfig", "  base: tinyconfig\n  colour: blue");
    let e = err(&dir, &text);
    assert_eq!(e.field, "kernel");
    assert!(e.message.contains("unknown field `colour`"), "{e}");
    assert_eq!(e.position.map(|p| p.line), Some(7));
    assert!(e.to_string().contains("recipe.yaml:7:"), "{e}");
}

#[test]
fn missing_fragment_names_field_line_and_column() {
    let dir = workspace();
    let e = err(
        &dir,
        &recipe_text(
            "{ debian: linux-source-6.12 }",
            "[rt.config, missing.config]",
            "rt",
        ),
    );
    assert_eq!(e.field, "kernel.fragments[1]");
    assert_eq!(e.position, Some(Position { line: 7, column: 26 }));
    assert!(
        e.message.contains("file not found") && e.message.contains("missing.config"),
        "{e}"
    );
}

#[test]
fn bad_sha256_is_refused() {
    let dir = workspace();
    let e = err(
        &dir,
        &recipe_text(
            "{ url: 'https://cdn.kernel.org/x.tar.xz', sha256: abc123 }",
            "[rt.config]",
            "rt",
        ),
    );
    assert_eq!(e.field, "kernel.source.sha256");
    assert!(e.message.contains("64 hex digits"), "{e}");
    assert_eq!(e.position.map(|p| p.line), Some(5));
    let e = err(
        &dir,
        &recipe_text(
            &format!("{{ url: 'https://x/y', sha256: {}z }}", &SHA[..63]),
            "[rt.config]",
            "rt",
        ),
    );
    assert_eq!(e.field, "kernel.source.sha256");
}

#[test]
fn url_without_sha256_is_refused() {
    let dir = workspace();
    let e = err(
        &dir,
        &recipe_text("{ url: 'https://cdn.kernel.org/x.tar.xz' }", "[rt.config]", "rt"),
    );
    assert_eq!(e.field, "kernel.source.url");
    assert!(e.message.contains("sha256"), "{e}");
    let ok = load(
        &dir,
        &recipe_text(
            &format!(
                "{{ url: 'https://cdn.kernel.org/x.tar.xz', sha256: {} }}",
                SHA.to_uppercase()
            ),
            "[rt.config]",
            "rt",
        ),
    )
    .unwrap();
    assert_eq!(
        ok.kernel.source,
        Source::Url {
            url: "https://cdn.kernel.org/x.tar.xz".into(),
            sha256: SHA.into()
        }
    );
}

#[test]
fn rt_flavor_needs_preempt_rt_from_its_fragments() {
    let dir = workspace();
    let e = err(
        &dir,
        &recipe_text("{ debian: linux-source-6.12 }", "[tiny.config]", "rt"),
    );
    assert_eq!(e.field, "kernel.fragments");
    assert!(e.message.contains("CONFIG_PREEMPT_RT=y is not requested"), "{e}");
    // A later fragment that turns it off wins.
    let e = err(
        &dir,
        &recipe_text("{ debian: linux-source-6.12 }", "[rt.config, off.config]", "rt"),
    );
    assert!(e.message.contains("off.config:1"), "{e}");
    // The standard flavor does not need it.
    load(
        &dir,
        &recipe_text("{ debian: linux-source-6.12 }", "[tiny.config]", "standard"),
    )
    .unwrap();
}

#[test]
fn source_needs_exactly_one_kind() {
    let dir = workspace();
    let e = err(
        &dir,
        &recipe_text("{ debian: linux-source-6.12, path: x.tar }", "[rt.config]", "rt"),
    );
    assert_eq!(e.field, "kernel.source");
    assert!(e.message.contains("path and debian"), "{e}");
    let e = err(&dir, &recipe_text("{ sha256: abc }", "[rt.config]", "rt"));
    assert!(e.message.contains("found none"), "{e}");
    let e = err(
        &dir,
        &recipe_text("{ debian: linux-image-amd64 }", "[rt.config]", "rt"),
    );
    assert_eq!(e.field, "kernel.source.debian");
    let e = err(
        &dir,
        &recipe_text("{ path: nothere.tar.xz }", "[rt.config]", "rt"),
    );
    assert_eq!(e.field, "kernel.source.path");
    assert!(e.message.contains("file not found"));
}

#[test]
fn allow_dropped_never_covers_preempt_rt() {
    let dir = workspace();
    let text = recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt").replace(
        "  base: tinyconfig",
        "  base: tinyconfig\n  allow-dropped: [E1000E, PREEMPT_RT]",
    );
    let e = err(&dir, &text);
    assert_eq!(e.field, "kernel.allow-dropped[1]");
    let ok = load(&dir, &text.replace(", PREEMPT_RT", "")).unwrap();
    assert_eq!(ok.kernel.allow_dropped, vec!["CONFIG_E1000E".to_string()]);
}

#[test]
fn other_field_errors() {
    let dir = workspace();
    let base = recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt");
    let cases = [
        (
            base.replace("flavor: rt", "flavor: fast"),
            "flavor",
            "unknown variant",
        ),
        (
            base.replace("name: emberrtos", "name: Ember OS"),
            "name",
            "lowercase",
        ),
        (
            base.replace("emberrtos/x86_64/rt", "../escape"),
            "ostree.ref",
            "valid ostree ref",
        ),
        (
            base.replace("nohz_full=1", "'quiet splash'"),
            "kernel.cmdline[0]",
            "one word",
        ),
        (
            base.replace("[overlay]", "[nope]"),
            "rootfs.overlays[0]",
            "directory not found",
        ),
        (
            base.replace("packages: [systemd-sysv]", "variant: tiny"),
            "rootfs.base.variant",
            "unknown mmdebstrap variant",
        ),
        (
            base.replace("base: tinyconfig", "base: configs/full.config"),
            "kernel.base",
            "file not found",
        ),
        (
            base.replace("version: \"2026.11.1\"\n", ""),
            "",
            "missing field `version`",
        ),
        (
            format!("{base}live: {{ ssh-authorized-keys: ['not a key'] }}\n"),
            "live.ssh-authorized-keys[0]",
            "SSH public key",
        ),
    ];
    for (text, field, needle) in cases {
        let e = err(&dir, &text);
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(needle), "{e}");
        assert!(e.position.is_some(), "{e}");
    }
}

#[test]
fn syntax_errors_have_positions() {
    let dir = workspace();
    let e = err(&dir, "name: [unclosed\n");
    assert!(e.position.is_some(), "{e}");
}

#[test]
fn repo_recipes_round_trip() {
    let recipes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes");
    let mut seen = 0;
    for entry in std::fs::read_dir(&recipes).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        seen += 1;
        let recipe = Recipe::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let again = Recipe::parse(&recipe.to_yaml(), &path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.raw, recipe.raw, "{}", path.display());
        assert_eq!(again.kernel, recipe.kernel);
    }
    assert!(seen >= 2, "expected recipes in {}", recipes.display());
}
