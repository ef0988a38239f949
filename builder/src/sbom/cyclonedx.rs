//! The commit's SBOM as CycloneDX 1.5 JSON, made from the SPDX document so
//! both name the same packages with the same versions, purls and hashes
//! (pure).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::document::{Document, NOASSERTION, Package};
use super::{KERNEL_ID, OS_ID};

/// Where the CycloneDX document is in a commit, beside the SPDX one.
pub const PATH_IN_TREE: &str = "usr/share/emberrtos/sbom.cdx.json";

/// The CycloneDX document: the OS package is the metadata's component,
/// every other package a component, `DEPENDS_ON` the dependencies.
pub fn from_spdx(document: &Document) -> Value {
    let os = document.packages.iter().find(|p| p.spdx_id == OS_ID);
    let components: Vec<Value> = document
        .packages
        .iter()
        .filter(|p| p.spdx_id != OS_ID)
        .map(component)
        .collect();
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": serial_number(&document.document_namespace),
        "version": 1,
        "metadata": {
            "timestamp": document.creation_info.created,
            "tools": {"components": [{
                "type": "application",
                "name": "imgbuild",
                "version": env!("CARGO_PKG_VERSION"),
            }]},
            "component": os.map(component),
        },
        "components": components,
        "dependencies": dependencies(document),
    })
}

/// The document as written: pretty JSON ending in a newline.
pub fn render(bom: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(bom).expect("a JSON value renders");
    bytes.push(b'\n');
    bytes
}

fn component(package: &Package) -> Value {
    let mut component = json!({
        "type": component_type(package),
        "bom-ref": package.spdx_id,
        "name": package.name,
    });
    let fields = component.as_object_mut().expect("an object");
    if let Some(version) = &package.version_info {
        fields.insert("version".into(), json!(version));
    }
    if let Some(supplier) = package.supplier.strip_prefix("Organization: ") {
        fields.insert("supplier".into(), json!({"name": supplier}));
    }
    if let Some(purl) = package.purl() {
        fields.insert("purl".into(), json!(purl));
    }
    let hashes: Vec<Value> = package
        .checksums
        .iter()
        .filter(|c| c.algorithm == "SHA256")
        .map(|c| json!({"alg": "SHA-256", "content": c.checksum_value}))
        .collect();
    if !hashes.is_empty() {
        fields.insert("hashes".into(), json!(hashes));
    }
    if package.license_declared != NOASSERTION {
        fields.insert(
            "licenses".into(),
            json!([{"expression": package.license_declared}]),
        );
    }
    if package.download_location.starts_with("https://") {
        let reference = json!([{"type": "distribution", "url": package.download_location}]);
        fields.insert("externalReferences".into(), reference);
    }
    component
}

fn component_type(package: &Package) -> &'static str {
    match (
        package.spdx_id.as_str(),
        package.primary_package_purpose.as_deref(),
    ) {
        (OS_ID | KERNEL_ID, _) => "operating-system",
        (id, _) if id.starts_with("SPDXRef-overlay-") => "file",
        (_, Some("APPLICATION")) => "application",
        _ => "library",
    }
}

/// `DEPENDS_ON` as CycloneDX dependencies, one entry per dependent.
fn dependencies(document: &Document) -> Vec<Value> {
    let mut by_ref: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for relationship in document
        .relationships
        .iter()
        .filter(|r| r.relationship_type == "DEPENDS_ON")
    {
        by_ref
            .entry(&relationship.spdx_element_id)
            .or_default()
            .push(&relationship.related_spdx_element);
    }
    by_ref
        .into_iter()
        .map(|(reference, on)| json!({"ref": reference, "dependsOn": on}))
        .collect()
}

/// An RFC 4122 URN (version 5 layout) from the SPDX namespace, which is
/// unique per document and reproducible.
fn serial_number(namespace: &str) -> String {
    let digest = crate::io::hashing::sha256_hex(namespace);
    let hex = digest.as_bytes();
    let part = |range: std::ops::Range<usize>| std::str::from_utf8(&hex[range]).expect("hex is ASCII");
    format!(
        "urn:uuid:{}-{}-5{}-8{}-{}",
        part(0..8),
        part(8..12),
        part(13..16),
        part(17..20),
        part(20..32)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_are_rfc_4122_urns() {
        let serial = serial_number("https://emberrtos.example/spdx/x");
        let uuid = serial.strip_prefix("urn:uuid:").unwrap();
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert!(
            uuid.bytes()
                .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(&uuid[14..15], "5");
        assert_eq!(
            serial,
            serial_number("https://emberrtos.example/spdx/x"),
            "reproducible"
        );
        assert_ne!(serial, serial_number("https://emberrtos.example/spdx/y"));
    }
}
