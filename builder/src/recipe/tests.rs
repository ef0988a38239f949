use super::*;
use crate::io::hashing::is_sha256_hex;
use emberrtos_contract::policy::HealthPolicy;

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

const ED25519: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb0BNNQoj3nWEsjM+9r/UoI4GBWm7F3uUbLuQGNTzYr ops@example.org";
const RSA_2048: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCw2CsNCfeyAGKe7FEnwncdCN4PjF1InWuP2FNcPDloYXPh/lPqvTCcb8tZnCFK4srberYjea1MelRPe8V7s1L/EaKxP2Txj0F5u9uD3ctWhTpUJJ1LEoF8svphBrV5Mm3gDakn3+hfXyz3k3oucJFcz+vzqC2/saNDtdZiTXql+N5LVghYNBgToOxOyr0rQ3reLN9rLFn3mtvfEKl3ZzyQ196qgNj9ASRjL9ImahLj33o3gqxieyRwAklVqOL7j4mnjdhIkSvDM8QBe8Ev7pq3KEwwaquXtFydEbtnyIxp1Asjzw4vmWCGkORypkpHe113Oyka5EWLn1PunO7bilwp rsa@x";
const RSA_1024: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDMqYUVwLb8g/ms8TY09w59rPAXiOd07XxAQOhvo2nVKVbDMAgFnn+PEdqhGOvMWveFeFdBqLEF+Km1G9uxuIz0kPRbNraTZhPsL7evIhDHa2Z1iEGcY5WkrqL+AdI24Gd3Ws0lFcSu6kHFVquVjym9huOkzdqr43TAALQnYlyXSw== small";
const ECDSA: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBE1VVEmaVJx+e3yPGW8Douc64yhIf5NPTGVn0OO6/2t81lyg4VFH+1pBOulygnYlb09aiBs5WJkayBtJnotyb1A= ec";

fn rt_recipe() -> String {
    recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt")
}

/// `base` with a `live:` section holding `body` (a YAML flow mapping's inside).
fn with_live(base: &str, body: &str) -> String {
    format!("{base}live: {{ {body} }}\n")
}

fn parse(text: &str) -> Result<Recipe, RecipeError> {
    Recipe::parse(text, Path::new("/r/recipe.yaml"))
}

fn parse_err(text: &str) -> RecipeError {
    parse(text).expect_err("recipe should be refused")
}

#[test]
fn package_names_that_would_be_apt_options_are_refused() {
    let base = rt_recipe();
    let hostile = base.replace(
        "packages: [systemd-sysv]",
        "packages: [systemd-sysv, '-oAcquire::http::Proxy=http://evil/']",
    );
    let e = parse_err(&hostile);
    assert_eq!(e.field, "rootfs.base.packages[1]");
    assert!(e.message.contains("not a Debian package"), "{e}");
    assert_eq!(e.position, Some(Position { line: 10, column: 54 }));
    assert!(
        e.to_string()
            .starts_with("/r/recipe.yaml:10:54: rootfs.base.packages[1]: "),
        "{e}"
    );
    let e = parse_err(&with_live(
        &base,
        "packages: [busybox, '-oDPkg::Pre-Invoke::=touch /x']",
    ));
    assert_eq!(e.field, "live.packages[1]");
    for bad in [
        "a",
        "Busybox",
        "a,b",
        "?name(x)",
        "~nfoo",
        "./x.deb",
        "foo/",
        "foo/Bookworm",
        "foo=1/bookworm",
        "foo=",
        "foo=x1",
        "foo:",
    ] {
        let text = base.replace("packages: [systemd-sysv]", &format!("packages: ['{bad}']"));
        assert_eq!(parse_err(&text).field, "rootfs.base.packages[0]", "{bad}");
    }
    let good = base.replace(
        "packages: [systemd-sysv]",
        "packages: [g++, libc6:amd64, 'rt-tests=2.5-1', 'linux-image-6.12=1:6.12.1-1~bpo12+1', rtla/bookworm-backports]",
    );
    match parse(&good).unwrap().rootfs.base {
        RootfsBase::Debian { packages, .. } => assert_eq!(packages.len(), 5),
        other => panic!("{other:?}"),
    }
}

#[test]
fn kernel_arguments_that_break_grub_cfg_are_refused() {
    let base = rt_recipe();
    for bad in [
        "quiet;reboot",
        "a\\\"b",
        "x=$root",
        "a'b",
        "x=`id`",
        "x={a}",
        "x=a|b",
        "x=#",
        "=v",
        "-x",
        "a\\tb",
        "",
    ] {
        let text = base.replace("nohz_full=1", &format!("\"{bad}\""));
        let e = parse_err(&text);
        assert_eq!(e.field, "kernel.cmdline[0]", "{bad}: {e}");
        assert!(e.position.is_some());
    }
    let good = base.replace(
        "nohz_full=1",
        "console=ttyS0,115200, processor.max_cstate=1, root=UUID=ab-12, nosoftlockup, _x=a:b/c@d%e+f",
    );
    assert_eq!(parse(&good).unwrap().kernel.cmdline.len(), 7);
}

#[test]
fn name_and_version_have_a_strict_charset() {
    let base = rt_recipe();
    for bad in ["1;reboot", "a\\\"b", "1 2", "-1", "1'2", "1$x", "1/2", ""] {
        let e = parse_err(&base.replace("\"2026.11.1\"", &format!("\"{bad}\"")));
        assert_eq!(e.field, "version", "{bad}: {e}");
    }
    for good in ["2026.11.1", "2.1-rc1", "v9", "1.0~beta+git_2"] {
        parse(&base.replace("2026.11.1", good)).unwrap();
    }
    let e = parse_err(&base.replace("name: emberrtos", "name: \"a'b\""));
    assert_eq!(e.field, "name");
    let e = parse_err(&base.replace("name: emberrtos", &format!("name: {}", "a".repeat(65))));
    assert_eq!(e.field, "name");
}

#[test]
fn ssh_keys_are_parsed_and_normalised() {
    let base = rt_recipe();
    let keys = format!(
        "ssh-authorized-keys: ['  {ED25519}  ', '{RSA_2048}', '{ECDSA}', 'ssh-ed25519 {}']",
        ED25519.split(' ').nth(1).unwrap()
    );
    let recipe = parse(&with_live(&base, &keys)).unwrap();
    assert_eq!(recipe.live.ssh_authorized_keys[0], ED25519);
    assert_eq!(recipe.live.ssh_authorized_keys[1], RSA_2048);
    assert_eq!(recipe.live.ssh_authorized_keys[2], ECDSA);
    let file = recipe.live.authorized_keys();
    assert_eq!(file.lines().count(), 4);
    assert!(file.ends_with('\n') && file.starts_with(ED25519));
    assert_eq!(Live::default().authorized_keys(), "");
}

#[test]
fn ssh_keys_cannot_smuggle_lines_or_options() {
    let base = rt_recipe();
    let blob = ED25519.split(' ').nth(1).unwrap();
    let cases = [
        // A newline in the comment starts a second authorized_keys line.
        format!("\"{ED25519}\\ncommand=\\\"rm -rf /\\\" {ED25519}\""),
        format!("\"{ED25519}\\r\""),
        format!("'command=\"id\" {ED25519}'"),
        format!("'no-pty {ED25519}'"),
        format!("'ssh-dss {blob}'"),
        format!("'ssh-foo {blob}'"),
        // The type word must match the key inside the blob.
        format!("'ssh-rsa {blob}'"),
        format!("'{RSA_1024}'"),
        "'ssh-ed25519 AAAA'".to_string(),
        "'not a key'".to_string(),
    ];
    for key in cases {
        let e = parse_err(&with_live(&base, &format!("ssh-authorized-keys: [{key}]")));
        assert_eq!(e.field, "live.ssh-authorized-keys[0]", "{key}: {e}");
        assert!(e.position.is_some());
    }
}

#[test]
fn mirror_must_be_an_http_url() {
    let base = rt_recipe();
    let with_mirror = |m: &str| base.replace("packages: [systemd-sysv]", &format!("mirror: '{m}'"));
    for bad in [
        "[trusted=yes] http://evil/debian",
        "http://evil/debian bookworm main",
        "ftp://ftp.debian.org/debian",
        "file:///srv/mirror",
        "http://user:pw@mirror/debian",
        "http://mirror/debian?x=1",
        "mirror/debian",
        "",
    ] {
        let e = parse_err(&with_mirror(bad));
        assert_eq!(e.field, "rootfs.base.mirror", "{bad}: {e}");
    }
    match parse(&with_mirror("https://deb.debian.org/debian/"))
        .unwrap()
        .rootfs
        .base
    {
        RootfsBase::Debian { mirror, .. } => {
            assert_eq!(mirror.as_deref(), Some("https://deb.debian.org/debian/"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn kernel_base_never_becomes_a_make_option() {
    let base = rt_recipe();
    let recipe = parse(&base.replace("base: tinyconfig", "base: -Iconfig")).unwrap();
    assert_eq!(recipe.kernel.base, ConfigBase::File("/r/-Iconfig".into()));
    let recipe = parse(&base.replace("base: tinyconfig", "base: x86_64_defconfig")).unwrap();
    assert_eq!(recipe.kernel.base, ConfigBase::Target("x86_64_defconfig".into()));
    for file in ["my.config", "configs/config", "config"] {
        let recipe = parse(&base.replace("base: tinyconfig", &format!("base: {file}"))).unwrap();
        assert!(matches!(recipe.kernel.base, ConfigBase::File(_)), "{file}");
    }
    // `load` then refuses the missing file.
    let dir = workspace();
    let e = err(&dir, &base.replace("base: tinyconfig", "base: -Iconfig"));
    assert_eq!(e.field, "kernel.base");
    assert!(e.message.contains("file not found"), "{e}");
}

#[test]
fn outputs_that_collide_with_inputs_are_refused() {
    let base = rt_recipe();
    let cases = [
        (
            with_live(&base, "iso: recipe.yaml"),
            "live.iso",
            "the recipe itself",
        ),
        (
            with_live(&base, "iso: ./sub/../recipe.yaml"),
            "live.iso",
            "the recipe itself",
        ),
        (
            with_live(&base, "iso: overlay/etc/x.iso"),
            "live.iso",
            "rootfs.overlays[0]",
        ),
        (
            with_live(&base, "iso: rt.config"),
            "live.iso",
            "kernel.fragments[0]",
        ),
        (
            with_live(&base, "rootfs: live, iso: live/x.iso"),
            "live.iso",
            "live.rootfs",
        ),
        (
            base.replace("{ ref: emberrtos/x86_64/rt }", "{ ref: a/b, repo: . }"),
            "ostree.repo",
            "the recipe itself",
        ),
        (
            base.replace("{ ref: emberrtos/x86_64/rt }", "{ ref: a/b, repo: overlay }"),
            "ostree.repo",
            "rootfs.overlays[0]",
        ),
        (
            base.replace("{ ref: emberrtos/x86_64/rt }", "{ ref: a/b, repo: out }")
                .replace("[overlay]", "[out/overlay]"),
            "ostree.repo",
            "rootfs.overlays[0]",
        ),
        (
            base.replace(
                "{ ref: emberrtos/x86_64/rt }",
                "{ ref: a/b, repo: out, gpg-key: K, gpg-homedir: out/gpg }",
            ),
            "ostree.repo",
            "ostree.gpg-homedir",
        ),
        (
            with_live(
                &base.replace("{ ref: emberrtos/x86_64/rt }", "{ ref: a/b, repo: out }"),
                "iso: out/live.iso",
            ),
            "live.iso",
            "ostree.repo",
        ),
    ];
    for (text, field, other) in cases {
        let e = parse_err(&text);
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(&format!("`{other}`")), "{e}");
        assert!(e.position.is_some(), "{e}");
    }
    parse(&with_live(&base, "iso: out/live.iso, rootfs: live")).unwrap();
}

#[test]
fn outputs_reaching_inputs_through_symlinks_are_refused() {
    let dir = workspace();
    std::os::unix::fs::symlink(".", dir.path().join("alias")).unwrap();
    let e = err(&dir, &with_live(&rt_recipe(), "iso: alias/recipe.yaml"));
    assert_eq!(e.field, "live.iso");
    assert!(e.message.contains("the recipe itself"), "{e}");
    load(&dir, &with_live(&rt_recipe(), "iso: alias/out.iso")).unwrap();
}

#[test]
fn image_hash_ignores_outputs_and_signing_but_not_content() {
    let base = rt_recipe();
    let hash = |text: &str| parse(text).unwrap().sha256;
    let plain = hash(&base);
    let placed = base.replace(
        "{ ref: emberrtos/x86_64/rt }",
        "{ ref: emberrtos/x86_64/rt, repo: /srv/repo, gpg-key: ABCD, gpg-homedir: /srv/gpg }",
    );
    assert_eq!(
        hash(&with_live(&base, "iso: a.iso")),
        hash(&with_live(&base, "iso: /b/c.iso"))
    );
    assert_eq!(plain, hash(&placed));
    assert_eq!(
        plain,
        hash(&format!(
            "# a comment\n{}",
            base.replace("[overlay]", "[ ./overlay ]")
        ))
    );
    // The same recipe in another directory.
    assert_eq!(
        plain,
        Recipe::parse(&base, Path::new("/elsewhere/x.yaml"))
            .unwrap()
            .sha256
    );
    // What defines the image does count.
    let other_package = base.replace("[systemd-sysv]", "[systemd-sysv, kmod]");
    assert_ne!(plain, hash(&other_package));
    assert_ne!(plain, hash(&base.replace("nohz_full=1", "nohz_full=2")));
    assert_ne!(plain, hash(&base.replace("2026.11.1", "2026.11.2")));
    assert_ne!(plain, hash(&base.replace("[overlay]", "[overlay2]")));
}

#[test]
fn work_dir_must_not_collide_with_inputs() {
    let dir = workspace();
    let recipe = load(&dir, &rt_recipe()).unwrap();
    for bad in [".", "overlay", "overlay/build"] {
        let e = recipe.check_work_dir(&dir.path().join(bad)).unwrap_err();
        assert_eq!(e.field, "the work dir", "{bad}: {e}");
    }
    recipe.check_work_dir(&dir.path().join("build")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    recipe.check_work_dir(elsewhere.path()).unwrap();
    // The recipe's own outputs are checked against the work dir too.
    let inside = with_live(&rt_recipe(), "iso: build");
    let e = load(&dir, &inside)
        .unwrap()
        .check_work_dir(&dir.path().join("build"))
        .unwrap_err();
    assert_eq!(e.field, "live.iso", "{e}");
    let in_work_dir = with_live(&rt_recipe(), "iso: build/live.iso");
    let recipe = load(&dir, &in_work_dir).unwrap();
    recipe.check_work_dir(&dir.path().join("build")).unwrap();
    assert!(
        recipe
            .check_work_dir(&dir.path().join("build/live.iso/x"))
            .is_err()
    );
}

fn with_disk(text: &str, disk: &str) -> String {
    format!("{text}disk:\n{disk}")
}

#[test]
fn disk_section_is_validated_field_by_field() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("publisher.asc"),
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n",
    )
    .unwrap();
    let good = with_disk(
        &rt_recipe(),
        "  size: 4G\n  formats: [raw, qcow2]\n  embed: [emberrtos/x86_64/rt]\n  embed-if-present: [emberrtos/x86_64/standard]\n  remote: { url: 'https://updates.example.org/emberrtos/', gpg-key: publisher.asc }\n",
    );
    let disk = load(&dir, &good).unwrap().disk.unwrap();
    assert_eq!(disk.size, Some(4 << 30));
    assert_eq!(disk.formats, [DiskFormat::Raw, DiskFormat::Qcow2]);
    assert_eq!(disk.embed, ["emberrtos/x86_64/rt"]);
    assert_eq!(disk.embed_if_present, ["emberrtos/x86_64/standard"]);
    let remote = disk.remote.unwrap();
    assert_eq!(remote.gpg_key, normalize(&dir.path().join("publisher.asc")));
    // Defaults: raw, sized from the tree, no remote.
    let minimal = load(&dir, &with_disk(&rt_recipe(), "  embed: []\n")).unwrap();
    let disk = minimal.disk.unwrap();
    assert_eq!(
        (disk.formats, disk.size, disk.remote),
        (vec![DiskFormat::Raw], None, None)
    );
    assert!(load(&dir, &rt_recipe()).unwrap().disk.is_none());

    let cases = [
        ("  size: lots\n", "disk.size"),
        ("  formats: [raw, vmdk]\n", "disk.formats[1]"),
        ("  formats: [qcow2, qcow2]\n", "disk.formats[1]"),
        ("  embed: [ok/ref, '../x']\n", "disk.embed[1]"),
        ("  embed-if-present: ['a/../x']\n", "disk.embed-if-present[0]"),
        ("  colour: blue\n", "disk"),
        (
            "  remote: { url: 'ftp://x/', gpg-key: publisher.asc }\n",
            "disk.remote.url",
        ),
        (
            "  remote: { url: 'https://x/', gpg-key: missing.asc }\n",
            "disk.remote.gpg-key",
        ),
        ("  remote: { url: 'https://x/' }\n", "disk.remote"),
    ];
    for (section, field) in cases {
        let text = with_disk(&rt_recipe(), section);
        let e = err(&dir, &text);
        assert!(
            e.field == field || e.field.starts_with(field),
            "{section:?}: field {:?}: {e}",
            e.field
        );
        let line = text.lines().count();
        assert_eq!(e.position.map(|p| p.line), Some(line), "{section:?}: {e}");
    }
}

fn standard_recipe() -> String {
    recipe_text("{ debian: linux-source-6.12 }", "[tiny.config]", "standard")
}

#[test]
fn health_policy_defaults_to_the_policys_own() {
    assert_eq!(parse(&rt_recipe()).unwrap().health, HealthPolicy::default());
    assert_eq!(parse(&standard_recipe()).unwrap().health, HealthPolicy::default());
    let empty = format!("{}device: {{ health: {{}} }}\nrt: {{}}\n", rt_recipe());
    assert_eq!(parse(&empty).unwrap().health, HealthPolicy::default());
}

#[test]
fn health_policy_takes_each_field_from_device_and_rt() {
    use emberrtos_contract::policy::OnInvalid;
    let default = HealthPolicy::default();
    let cases = [
        (
            "device: { boot-tries: 2 }\n",
            HealthPolicy {
                boot_tries: 2,
                ..default
            },
        ),
        (
            "device: { health: { latency-seconds: 10 } }\n",
            HealthPolicy {
                latency_seconds: 10,
                ..default
            },
        ),
        (
            "device: { health: { on-invalid: fail } }\n",
            HealthPolicy {
                on_invalid: OnInvalid::Fail,
                ..default
            },
        ),
        (
            "rt: { budget-us: 150 }\n",
            HealthPolicy {
                budget_us: 150,
                ..default
            },
        ),
        (
            "device:\n  boot-tries: 9\n  health:\n    latency-seconds: 3600\n    on-invalid: warn\nrt:\n  budget-us: 1000000\n",
            HealthPolicy {
                boot_tries: 9,
                latency_seconds: 3600,
                on_invalid: OnInvalid::Warn,
                budget_us: 1_000_000,
            },
        ),
    ];
    for (sections, expected) in cases {
        let recipe = parse(&format!("{}{sections}", rt_recipe())).unwrap();
        assert_eq!(recipe.health, expected, "{sections}");
        // The schema form writes them back.
        let again = parse(&recipe.to_yaml()).unwrap();
        assert_eq!(again.health, expected, "{sections}");
    }
    // A standard recipe has trial boots too, only no budget.
    let standard = parse(&format!("{}device: {{ boot-tries: 1 }}\n", standard_recipe())).unwrap();
    assert_eq!(standard.health.boot_tries, 1);
}

#[test]
fn health_values_out_of_range_name_their_field_and_the_range() {
    let cases = [
        ("device: { boot-tries: 0 }", "device.boot-tries", "1..=9"),
        ("device: { boot-tries: 10 }", "device.boot-tries", "1..=9"),
        ("device: { boot-tries: -1 }", "device.boot-tries", "1..=9"),
        (
            "device: { health: { latency-seconds: 0 } }",
            "device.health.latency-seconds",
            "1..=3600",
        ),
        (
            "device: { health: { latency-seconds: 3601 } }",
            "device.health.latency-seconds",
            "1..=3600",
        ),
        ("rt: { budget-us: 0 }", "rt.budget-us", "1..=1000000"),
        ("rt: { budget-us: 1000001 }", "rt.budget-us", "1..=1000000"),
        (
            "device: { health: { on-invalid: ignore } }",
            "device.health.on-invalid",
            "unknown variant `ignore`",
        ),
    ];
    for (section, field, needle) in cases {
        let text = format!("{}{section}\n", rt_recipe());
        let e = parse_err(&text);
        assert_eq!(e.field, field, "{section}: {e}");
        assert!(e.message.contains(needle), "{section}: {e}");
        assert_eq!(
            e.position.map(|p| p.line),
            Some(text.lines().count()),
            "{section}: {e}"
        );
    }
}

#[test]
fn rt_section_is_refused_in_a_standard_recipe() {
    let text = format!("{}rt:\n  budget-us: 100\n", standard_recipe());
    let e = parse_err(&text);
    assert_eq!(e.field, "rt", "{e}");
    assert!(e.message.contains("`flavor: rt`"), "{e}");
    assert_eq!(e.position.map(|p| p.line), Some(text.lines().count()), "{e}");
}

#[test]
fn unknown_keys_in_device_are_refused() {
    for (section, field) in [
        ("device:\n  boot-tries: 2\n  colour: blue\n", "device"),
        ("device:\n  health:\n    colour: blue\n", "device.health"),
        ("rt:\n  colour: blue\n", "rt"),
    ] {
        let e = parse_err(&format!("{}{section}", rt_recipe()));
        assert_eq!(e.field, field, "{section}: {e}");
        assert!(e.message.contains("unknown field `colour`"), "{section}: {e}");
        assert!(e.position.is_some(), "{e}");
    }
}

#[test]
fn health_policy_defines_the_image() {
    let base = rt_recipe();
    let hash = |text: &str| parse(text).unwrap().sha256;
    let plain = hash(&base);
    // Written out as the defaults: the same image.
    assert_eq!(
        plain,
        hash(&format!(
            "{base}device: {{ boot-tries: 3, health: {{ latency-seconds: 60, on-invalid: warn }} }}\nrt: {{ budget-us: 100 }}\n"
        ))
    );
    for section in [
        "device: { boot-tries: 2 }",
        "device: { health: { latency-seconds: 10 } }",
        "device: { health: { on-invalid: fail } }",
        "rt: { budget-us: 150 }",
    ] {
        assert_ne!(plain, hash(&format!("{base}{section}\n")), "{section}");
    }
}

fn with_build(section: &str) -> String {
    recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt")
        .replace("  cmdline:", &format!("  build:\n{section}  cmdline:"))
}

#[test]
fn kernel_build_is_how_not_what() {
    let dir = workspace();
    let plain = load(
        &dir,
        &recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt"),
    )
    .unwrap();
    let text = with_build(
        "    distcc: { hosts: \"build1.example.org/8,lzo build2.example.org/8,lzo\" }\n    ccache: true\n    jobs: 24\n",
    );
    let farm = load(&dir, &text).unwrap();
    assert_eq!(
        farm.kernel.build.distcc,
        Some(Some("build1.example.org/8,lzo build2.example.org/8,lzo".into()))
    );
    assert_eq!(farm.kernel.build.ccache, Some(None));
    assert_eq!(farm.kernel.build.jobs, Some(24));
    assert_eq!(farm.sha256, plain.sha256, "kernel.build changes no image");
    let env_hosts = load(&dir, &with_build("    distcc: {}\n    ccache: cc\n")).unwrap();
    assert_eq!(env_hosts.kernel.build.distcc, Some(None));
    assert_eq!(env_hosts.kernel.build.ccache, Some(Some(dir.path().join("cc"))));
}

#[test]
fn bad_kernel_build_settings_name_their_field() {
    let dir = workspace();
    for (section, field) in [
        (
            "    distcc: { hosts: \"a;reboot\" }\n",
            "kernel.build.distcc.hosts",
        ),
        ("    distcc: { hosts: \"  \" }\n", "kernel.build.distcc.hosts"),
        ("    jobs: 0\n", "kernel.build.jobs"),
    ] {
        let e = err(&dir, &with_build(section));
        assert_eq!(e.field, field, "{section}: {e}");
    }
    let e = err(&dir, &with_build("    distcc: { hosts: a, port: 1 }\n"));
    assert!(e.to_string().contains("port"), "{e}");
}

#[test]
fn the_kernel_date_is_optional_part_of_the_image_and_a_unix_time() {
    let dir = workspace();
    let text = recipe_text("{ debian: linux-source-6.12 }", "[rt.config]", "rt");
    let plain = load(&dir, &text).unwrap();
    assert_eq!(plain.kernel.source_date_epoch, None);
    let dated = |line: &str| text.replace("  cmdline:", &format!("  source-date-epoch: {line}\n  cmdline:"));
    let pinned = load(&dir, &dated("1764460800")).unwrap();
    assert_eq!(pinned.kernel.source_date_epoch, Some(1_764_460_800));
    assert_ne!(
        pinned.sha256, plain.sha256,
        "the kernel's date is part of the image"
    );
    for bad in ["0", "4294967296"] {
        let e = err(&dir, &dated(bad));
        assert_eq!(e.field, "kernel.source-date-epoch", "{bad}: {e}");
    }
}

#[test]
fn billion_laughs_recipe_is_refused_before_deserializing_naming_the_limit() {
    let laughs: String = (1..10)
        .map(|level| {
            format!(
                "&l{level} [{}], ",
                vec![format!("*l{}", level - 1); 10].join(", ")
            )
        })
        .collect();
    let text = rt_recipe().replace(
        "cmdline: [nohz_full=1,",
        &format!("cmdline: [&l0 nohz_full=1, {laughs}"),
    );
    assert!(text.len() < 4096, "{}", text.len());
    let e = parse_err(&text);
    assert_eq!(
        (e.field.as_str(), e.position.map(|p| p.line)),
        ("", Some(8)),
        "{e}"
    );
    assert!(
        e.message
            .contains("aliases expand the document beyond the limit of 1048576"),
        "{e}"
    );
}

#[test]
fn ten_thousand_nested_lists_are_refused_by_the_depth_limit() {
    let text = rt_recipe().replace(
        "  base: tinyconfig\n",
        &format!("  base: {}{}\n", "[".repeat(10_000), "]".repeat(10_000)),
    );
    let e = parse_err(&text);
    assert_eq!(
        (e.field.as_str(), e.position.map(|p| p.line)),
        ("", Some(6)),
        "{e}"
    );
    assert!(e.message.contains("deeper than the limit of 64 levels"), "{e}");
}

#[test]
fn a_recipe_with_a_benign_alias_still_parses() {
    let text = rt_recipe()
        .replace("name: emberrtos", "name: &name emberrtos")
        .replace("version: \"2026.11.1\"", "version: *name");
    let recipe = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (recipe.name.as_str(), recipe.version.as_str()),
        ("emberrtos", "emberrtos")
    );
}

#[test]
fn arch_is_x86_64_unless_the_recipe_says_arm64() {
    let dir = workspace();
    let base = recipe_text("{ debian: linux-source-6.12 }", "[tiny.config, rt.config]", "rt");
    let recipe = load(&dir, &base).unwrap();
    assert_eq!(recipe.arch, rtcheck::Arch::X86_64);
    let arm = base
        .replace("flavor: rt\n", "flavor: rt\narch: arm64\n")
        .replace("emberrtos/x86_64/rt", "emberrtos/aarch64/rt");
    let arm_recipe = load(&dir, &arm).unwrap();
    assert_eq!(arm_recipe.arch, rtcheck::Arch::Arm64);
    assert_ne!(
        arm_recipe.image_sha256(),
        recipe.image_sha256(),
        "arch defines the image"
    );
    // Saying the default keeps the image hash of a recipe that does not.
    let explicit = base.replace("flavor: rt\n", "flavor: rt\narch: x86_64\n");
    assert_eq!(
        load(&dir, &explicit).unwrap().image_sha256(),
        recipe.image_sha256()
    );

    let e = err(&dir, &base.replace("flavor: rt\n", "flavor: rt\narch: aarch64\n"));
    assert!(e.to_string().contains("arch"), "{e}");
    assert!(e.to_string().contains("arm64"), "{e}");
}

#[test]
fn a_ref_that_names_another_machine_is_refused() {
    let dir = workspace();
    let base = recipe_text("{ debian: linux-source-6.12 }", "[tiny.config, rt.config]", "rt");
    let e = err(&dir, &base.replace("flavor: rt\n", "flavor: rt\narch: arm64\n"));
    assert_eq!(e.field, "ostree.ref", "{e}");
    assert!(
        e.message
            .contains("names the x86_64 machine, but the recipe's arch is arm64"),
        "{e}"
    );
    let e = err(&dir, &base.replace("emberrtos/x86_64/rt", "emberrtos/aarch64/rt"));
    assert!(
        e.message
            .contains("names the arm64 machine, but the recipe's arch is x86_64"),
        "{e}"
    );
    // A ref that names no machine is the recipe's to choose.
    load(&dir, &base.replace("emberrtos/x86_64/rt", "emberrtos/rt")).unwrap();
}
