# awk -f ci/lib/deb-relations.awk CARGO_TOML...
# Prints the Debian packages that the depends, recommends and suggests
# arrays of each file's [package.metadata.deb] name, one per line: of each
# relation its first alternative, without version constraint, architecture
# qualifier or list, or build profile; cargo-deb's `$auto` is skipped.
# Exits 1, naming the file and line, on anything it cannot read as that:
# a field that is not an array, an unclosed array, or a name that is not a
# Debian package name.

function complain(what) {
    printf "%s:%d: %s\n", FILENAME, FNR, what > "/dev/stderr"
    bad = 1
}

# relation_package RELATION: the package it installs, "" for `$auto`.
function relation_package(relation,   name) {
    name = relation
    sub(/\|.*/, "", name)
    sub(/[(\[<].*/, "", name)
    sub(/:[a-z0-9-]+[ \t]*$/, "", name)
    gsub(/[ \t]/, "", name)
    if (name == "$auto") return ""
    if (name ~ /^[a-z0-9][a-z0-9+.-]+$/) return name
    complain("not a Debian package name: \"" relation "\"")
    return ""
}

# take_strings TEXT: prints the package of each relation in TEXT's quoted
# strings (a string may hold several, comma-separated, as cargo-deb allows).
function take_strings(text,   string, count, relations, i, package) {
    while (match(text, /"[^"]*"/)) {
        string = substr(text, RSTART + 1, RLENGTH - 2)
        text = substr(text, RSTART + RLENGTH)
        count = split(string, relations, ",")
        for (i = 1; i <= count; i++) {
            package = relation_package(relations[i])
            if (package != "") print package
        }
    }
}

# unquoted TEXT: TEXT without its quoted strings and its comment.
function unquoted(text) {
    gsub(/"[^"]*"/, "", text)
    sub(/#.*/, "", text)
    return text
}

FNR == 1 { if (in_list) complain("unclosed array"); in_deb = 0; in_list = 0 }
{ sub(/\r$/, "") }
in_list {
    take_strings($0)
    if (unquoted($0) ~ /\]/) in_list = 0
    next
}
/^[ \t]*\[/ { in_deb = (unquoted($0) ~ /^[ \t]*\[package\.metadata\.deb\][ \t]*$/); next }
in_deb && /^[ \t]*(depends|recommends|suggests)[ \t]*=/ {
    value = $0
    sub(/^[^=]*=[ \t]*/, "", value)
    if (value !~ /^\[/) { complain("write this field as an array of relations, one per line"); next }
    take_strings(value)
    if (unquoted(value) !~ /\]/) in_list = 1
}
END {
    if (in_list) complain("unclosed array")
    exit bad
}
