# Secure Boot for the test tiers (sourced): a gate key, and OVMF variables
# that trust it alone. Needs openssl, objcopy, efitools and virt-fw-vars
# (python3-virt-firmware).

# The owner GUID of the test keys in the firmware's lists.
sb_owner=9a1c2f3e-5d4b-4e6a-8f70-1b2c3d4e5f60

# sb_key DIR: a new gate key DIR/db.key (RSA, mode 600) and its self-signed
# certificate DIR/db.crt, unless they exist.
sb_key() {
    [ -f "$1/db.key" ] && [ -f "$1/db.crt" ] && return
    mkdir -p "$1"
    openssl req -new -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=EmberRTOS CI gate/" \
        -keyout "$1/db.key" -out "$1/db.crt" 2> /dev/null || fail "openssl could not make the Secure Boot test key"
    chmod 600 "$1/db.key"
}

# sb_debian_ca DIR: Debian's Secure Boot CA, which Debian's shim trusts on
# its own (its .vendor_cert section: four little-endian u32, the first the
# certificate's size and the third its offset), as DIR/debian-ca.pem.
sb_debian_ca() {
    objcopy -O binary --only-section=.vendor_cert /usr/lib/shim/shimx64.efi "$1/vendor-cert.bin"
    # shellcheck disable=SC2046 # four numbers
    set -- "$1" $(od -An -tu4 -N16 "$1/vendor-cert.bin")
    dd if="$1/vendor-cert.bin" of="$1/debian-ca.der" bs=1 skip="$4" count="$2" 2> /dev/null
    openssl x509 -inform der -in "$1/debian-ca.der" -out "$1/debian-ca.pem"
    openssl x509 -in "$1/debian-ca.pem" -noout -subject | grep -q "Debian Secure Boot CA" \
        || fail "the certificate in Debian's shim is not Debian's Secure Boot CA"
}

# sb_vars DIR OUT: OVMF variables with Secure Boot on whose PK, KEK and db
# hold only DIR/db.crt, and whose dbx revokes Debian's CA, so shim accepts
# no kernel Debian signed: the gate is the only signer.
sb_vars() {
    sb_debian_ca "$1"
    cert-to-efi-sig-list -g "$sb_owner" "$1/debian-ca.pem" "$1/dbx.esl" > /dev/null
    sign-efi-sig-list -k "$1/db.key" -c "$1/db.crt" dbx "$1/dbx.esl" "$1/dbx.auth" > /dev/null
    virt-fw-vars -i /usr/share/OVMF/OVMF_VARS_4M.fd -o "$2" \
        --set-pk "$sb_owner" "$1/db.crt" --add-kek "$sb_owner" "$1/db.crt" --add-db "$sb_owner" "$1/db.crt" \
        --set-dbx "$1/dbx.auth" --secure-boot 2> "$1/virt-fw-vars.log" \
        || { cat "$1/virt-fw-vars.log" >&2; fail "virt-fw-vars could not write $2"; }
}
