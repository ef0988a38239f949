# Runs inside ci/deb-check's fresh Debian 12 minbase chroot, with the two
# .deb files in /tmp: installs them as a user would and checks what they
# ship. EXPECTED_COMMIT: the commit imgbuild --version must name.
# shellcheck shell=sh
set -eu
export DEBIAN_FRONTEND=noninteractive
fail() { echo "deb-in-chroot FAILED: $*" >&2; exit 1; }
# seconds_since START: wall seconds since START (date +%s.%N), to 0.1 s.
seconds_since() { echo "$(date +%s.%N) $1" | awk '{ printf "%.1f", $1 - $2 }'; }

# mmdebstrap's chroots install no Recommends (00mmdebstrap, which it
# removes when done); a stock Debian 12 does, as apt does by default.
: > /etc/apt/apt.conf.d/00mmdebstrap
[ "$(apt-config shell recommends APT::Install-Recommends/b)" = "recommends='true'" ] ||
    fail "apt still skips Recommends"

start=$(date +%s.%N)
apt-get install -y -q /tmp/emberrtos-jitter_*.deb > /tmp/apt-jitter.log 2>&1 ||
    { tail -20 /tmp/apt-jitter.log; fail "apt-get install emberrtos-jitter"; }
echo "chroot: emberrtos-jitter and its dependencies installed in $(seconds_since "$start") s"
jitter --help | grep -q -- '--budget' || fail "jitter --help"
[ "$(man -w jitter)" = /usr/share/man/man1/jitter.1.gz ] || fail "man -w jitter: $(man -w jitter 2>&1)"
for pkg in rt-tests rtla; do
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null)" = "install ok installed" ] ||
        fail "$pkg (a Depends or Recommends of emberrtos-jitter) is not installed"
done
if command -v imgbuild > /dev/null; then fail "emberrtos-jitter brought imgbuild along"; fi
echo "chroot: jitter --help, man -w jitter: ok, and jitter alone brings no imgbuild"

start=$(date +%s.%N)
apt-get install -y -q /tmp/imgbuild_*.deb > /tmp/apt-imgbuild.log 2>&1 ||
    { tail -20 /tmp/apt-imgbuild.log; fail "apt-get install imgbuild"; }
echo "chroot: imgbuild and its dependencies installed in $(seconds_since "$start") s" \
    "($(grep -c '^Setting up' /tmp/apt-imgbuild.log) packages set up)"

version=$(imgbuild --version)
echo "$version" | sed 's/^/chroot: --version: /'
echo "$version" | grep -qx "commit $EXPECTED_COMMIT" || fail "--version does not name commit $EXPECTED_COMMIT"
echo "$version" | grep -qx 'libostree 20[0-9][0-9]\.[0-9]*' || fail "--version does not name libostree"
imgbuild recipe --help | grep -q -- '--until' || fail "imgbuild recipe --help"
for page in imgbuild imgbuild-recipe imgbuild-cache-push; do
    [ "$(man -w "$page")" = "/usr/share/man/man1/$page.1.gz" ] || fail "man -w $page: $(man -w "$page" 2>&1)"
done
man imgbuild-recipe 2> /tmp/man.err | grep -q -- '--work-dir' || fail "man imgbuild-recipe: $(cat /tmp/man.err)"
# bash-completion loads a command's completion on first use, from the file
# named after it.
registered=$(bash -c '. /usr/share/bash-completion/bash_completion; _completion_loader imgbuild; complete -p imgbuild')
case $registered in
    *"-F _imgbuild"*) echo "chroot: bash: $registered" ;;
    *) fail "bash-completion does not load imgbuild's completion: $registered" ;;
esac
for file in /usr/share/zsh/vendor-completions/_imgbuild /usr/share/fish/vendor_completions.d/imgbuild.fish \
    /usr/share/zsh/vendor-completions/_jitter /usr/share/fish/vendor_completions.d/jitter.fish \
    /usr/libexec/imgbuild/emberrtos-device /usr/libexec/imgbuild/jitter-docs /usr/bin/jitter; do
    [ -s "$file" ] || fail "$file is not installed"
done
echo "chroot: imgbuild --version, recipe --help, man pages, completions: ok"

# The programs arm64 images carry, where imgbuild looks for them: ELF
# files whose e_machine (2 bytes at offset 18, little-endian) is AArch64's,
# 183.
for program in emberrtos-device jitter; do
    file=/usr/libexec/imgbuild/aarch64-unknown-linux-gnu/$program
    [ -x "$file" ] || fail "$file is not installed"
    [ "$(od -An -c -N4 "$file" | tr -d ' ')" = '177ELF' ] || fail "$file is not an ELF file"
    machine=$(od -An -tu2 -j18 -N2 "$file" | tr -d ' ')
    [ "$machine" = 183 ] || fail "$file is for ELF machine $machine, not AArch64 (183)"
done
echo "chroot: emberrtos-device and jitter for aarch64 are installed, AArch64 ELF programs"

# One real command on the tools the package pulled in: a configuration
# medium (gpg for the key, ssh-keygen for the login key, mtools for the FAT
# image), then the same with a bad field, which must name it and write
# nothing.
medium=/tmp/medium
mkdir -p "$medium/keys"
export GNUPGHOME=/tmp/gnupg
mkdir -m 700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key 'deb-check <deb-check@example.invalid>' default default never
gpg --armor --export > "$medium/keys/publisher.asc"
ssh-keygen -q -t ed25519 -N '' -C ops@cell-07 -f /tmp/login
write_provision() {
    printf 'flavor: rt\nhostname: %s\nssh-authorized-keys: ["%s"]\nupdate-remote: {url: https://updates.example.org/emberrtos/, gpg-key: keys/publisher.asc}\n' \
        "$1" "$(cat /tmp/login.pub)" > "$medium/provision.yaml"
}
write_provision cell-07
imgbuild config-medium "$medium/provision.yaml" --out /tmp/medium.img > /dev/null || fail "imgbuild config-medium"
mdir -b -i /tmp/medium.img ::/emberrtos | grep -q provision.yaml || fail "the medium has no emberrtos/provision.yaml"
write_provision "'cell;07'"
if imgbuild config-medium "$medium/provision.yaml" --out /tmp/bad.img 2> /tmp/bad.err; then
    fail "config-medium took hostname 'cell;07'"
fi
grep -q hostname /tmp/bad.err || fail "the refusal does not name hostname: $(cat /tmp/bad.err)"
[ ! -e /tmp/bad.img ] || fail "a refused config-medium left /tmp/bad.img"
# The gpg-agent must be gone before mmdebstrap empties /tmp: an agent that
# sees its socket removed exits and removes its other sockets under rm's feet.
gpgconf --kill all
for _ in $(seq 1 50); do
    [ -z "$(find "$GNUPGHOME" -maxdepth 1 -name 'S.*' 2>/dev/null)" ] && break
    sleep 0.1
done
rm -rf "$GNUPGHOME"
echo "chroot: imgbuild config-medium writes a medium with gpg, ssh-keygen and mtools; a bad hostname is refused by name"
