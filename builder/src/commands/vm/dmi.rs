//! The guest's SMBIOS identity (`imgbuild vm --dmi FIELD=VALUE`): each
//! value validated before it reaches QEMU's `-smbios` option.

use std::collections::BTreeMap;

use serde::Serialize;

/// A field of the guest's SMBIOS identity, as `--dmi FIELD=VALUE` names it
/// (the guest's `/sys/class/dmi/id/` file in parentheses). Ordered as the
/// `-smbios` arguments are: by structure type, then QEMU's key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DmiField {
    /// Type 0 (BIOS information) `vendor` (bios_vendor).
    BiosVendor,
    /// Type 0 `version` (bios_version).
    BiosVersion,
    /// Type 1 (system information) `manufacturer` (sys_vendor).
    SysVendor,
    /// Type 1 `product` (product_name).
    ProductName,
    /// Type 1 `version` (product_version).
    ProductVersion,
    /// Type 1 `serial` (product_serial).
    Serial,
    /// Type 2 (baseboard information) `manufacturer` (board_vendor).
    BoardVendor,
    /// Type 2 `product` (board_name).
    BoardName,
}

impl DmiField {
    /// Every field, in the order `--help` lists them.
    pub const ALL: [DmiField; 8] = [
        DmiField::SysVendor,
        DmiField::ProductName,
        DmiField::ProductVersion,
        DmiField::Serial,
        DmiField::BoardVendor,
        DmiField::BoardName,
        DmiField::BiosVendor,
        DmiField::BiosVersion,
    ];

    /// The name `--dmi` takes.
    pub fn name(self) -> &'static str {
        match self {
            DmiField::SysVendor => "sys-vendor",
            DmiField::ProductName => "product-name",
            DmiField::ProductVersion => "product-version",
            DmiField::Serial => "serial",
            DmiField::BoardVendor => "board-vendor",
            DmiField::BoardName => "board-name",
            DmiField::BiosVendor => "bios-vendor",
            DmiField::BiosVersion => "bios-version",
        }
    }

    /// The SMBIOS structure type and QEMU's key for it in `-smbios type=N,...`.
    pub fn smbios(self) -> (u8, &'static str) {
        match self {
            DmiField::BiosVendor => (0, "vendor"),
            DmiField::BiosVersion => (0, "version"),
            DmiField::SysVendor => (1, "manufacturer"),
            DmiField::ProductName => (1, "product"),
            DmiField::ProductVersion => (1, "version"),
            DmiField::Serial => (1, "serial"),
            DmiField::BoardVendor => (2, "manufacturer"),
            DmiField::BoardName => (2, "product"),
        }
    }

    fn parse(name: &str) -> Option<DmiField> {
        DmiField::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl std::fmt::Display for DmiField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The longest `--dmi` value.
pub const DMI_VALUE_MAX: usize = 64;

/// Whether `c` may appear in a `--dmi` value: `A-Za-z0-9 ._+()/-`. Never a
/// comma, which would end the value inside QEMU's `-smbios` option and start
/// an option of the user's choosing.
pub fn dmi_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || " ._+()/-".contains(c)
}

/// Why a `--dmi` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmiError {
    #[error("`{0}` is not FIELD=VALUE (e.g. product-name=Edge-1)")]
    NotAnAssignment(String),
    #[error("unknown DMI field `{0}` (one of: {list})", list = dmi_field_list())]
    UnknownField(String),
    #[error("{0}: the value is empty (1-{DMI_VALUE_MAX} characters)")]
    Empty(DmiField),
    #[error("{field}: the value is {length} characters long (at most {DMI_VALUE_MAX})")]
    TooLong { field: DmiField, length: usize },
    #[error(
        "{field}: the character {character:?} is not allowed{why}; allowed: A-Z a-z 0-9, space and . _ + ( ) / -",
        why = comma_note(.character)
    )]
    BadCharacter { field: DmiField, character: char },
    #[error("{0} is given twice")]
    Duplicate(DmiField),
}

fn comma_note(character: &char) -> &'static str {
    if *character == ',' {
        " (a comma would end the value inside QEMU's -smbios option)"
    } else {
        ""
    }
}

fn dmi_field_list() -> String {
    DmiField::ALL.map(DmiField::name).join(", ")
}

/// One `--dmi FIELD=VALUE`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmiSetting {
    field: DmiField,
    value: String,
}

impl DmiSetting {
    pub fn field(&self) -> DmiField {
        self.field
    }

    pub fn value(&self) -> &str {
        &self.value
    }
}

/// Parses one `--dmi FIELD=VALUE` (pure; clap's value parser): a known
/// field and a value of 1-64 characters from `A-Za-z0-9 ._+()/-`.
pub fn parse_dmi_setting(text: &str) -> Result<DmiSetting, DmiError> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| DmiError::NotAnAssignment(text.to_string()))?;
    let field = DmiField::parse(name).ok_or_else(|| DmiError::UnknownField(name.to_string()))?;
    if value.is_empty() {
        return Err(DmiError::Empty(field));
    }
    if let Some(character) = value.chars().find(|c| !dmi_value_char(*c)) {
        return Err(DmiError::BadCharacter { field, character });
    }
    // Only ASCII is left, so bytes are characters.
    if value.len() > DMI_VALUE_MAX {
        return Err(DmiError::TooLong {
            field,
            length: value.len(),
        });
    }
    Ok(DmiSetting {
        field,
        value: value.to_string(),
    })
}

/// The guest's SMBIOS identity: each field at most once, every value
/// validated by [`parse_dmi_setting`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dmi(BTreeMap<DmiField, String>);

impl Dmi {
    /// The identity of the `--dmi` options; a field given twice is refused.
    pub fn new(settings: impl IntoIterator<Item = DmiSetting>) -> Result<Dmi, DmiError> {
        let mut fields = BTreeMap::new();
        for DmiSetting { field, value } in settings {
            if fields.insert(field, value).is_some() {
                return Err(DmiError::Duplicate(field));
            }
        }
        Ok(Dmi(fields))
    }

    /// Parses `--dmi` values (pure).
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Dmi, DmiError> {
        let settings = texts
            .into_iter()
            .map(parse_dmi_setting)
            .collect::<Result<Vec<_>, _>>()?;
        Dmi::new(settings)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, field: DmiField) -> Option<&str> {
        self.0.get(&field).map(String::as_str)
    }
}

impl Serialize for Dmi {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(field, value)| (field.name(), value)))
    }
}

/// The `-smbios` options of an identity (pure): one `type=N,key=value,...`
/// per SMBIOS structure, by type, keys in a fixed order. Type 0 (BIOS
/// information) is optional in QEMU: without it the firmware (SeaBIOS or
/// OVMF) publishes its own, so `bios-*` must reach QEMU to be seen at all;
/// under UEFI it also keeps the "UEFI is supported" bit OVMF's own sets.
pub fn smbios_options(dmi: &Dmi, uefi: bool) -> Vec<String> {
    let mut options: Vec<(u8, String)> = Vec::new();
    for (field, value) in &dmi.0 {
        let (kind, key) = field.smbios();
        // No escaping needed: parse_dmi_setting lets no comma through.
        let pair = format!(",{key}={value}");
        match options.last_mut() {
            Some((last, option)) if *last == kind => option.push_str(&pair),
            _ => options.push((kind, format!("type={kind}{pair}"))),
        }
    }
    options
        .into_iter()
        .map(|(kind, mut option)| {
            if kind == 0 && uefi {
                option.push_str(",uefi=on");
            }
            option
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmi_settings_that_parse() {
        let setting = parse_dmi_setting("sys-vendor=Acme Corp (EU) 1.0_a+b/c-d").unwrap();
        assert_eq!(setting.field(), DmiField::SysVendor);
        assert_eq!(setting.value(), "Acme Corp (EU) 1.0_a+b/c-d");
        for field in DmiField::ALL {
            let parsed = parse_dmi_setting(&format!("{field}=X")).unwrap();
            assert_eq!(parsed.field(), field);
        }
        // Only the first `=` separates; the rest is the value (and refused).
        assert_eq!(
            parse_dmi_setting("serial=a=b"),
            Err(DmiError::BadCharacter {
                field: DmiField::Serial,
                character: '='
            })
        );
        let longest = "x".repeat(DMI_VALUE_MAX);
        assert_eq!(
            parse_dmi_setting(&format!("serial={longest}")).unwrap().value(),
            longest
        );
        assert_eq!(parse_dmi_setting("serial=1").unwrap().value(), "1");
    }

    #[test]
    fn dmi_refusals_name_the_field_and_the_character() {
        let comma = parse_dmi_setting("product-name=a,b").unwrap_err();
        assert_eq!(
            comma,
            DmiError::BadCharacter {
                field: DmiField::ProductName,
                character: ','
            }
        );
        let text = comma.to_string();
        assert!(
            text.starts_with("product-name: the character ',' is not allowed"),
            "{text}"
        );
        assert!(text.contains("a comma would end the value"), "{text}");
        for (input, character) in [
            ("serial=a\nb", '\n'),
            ("serial=a=b", '='),
            ("serial=a;b", ';'),
            ("serial=$(id)", '$'),
            ("serial=caf\u{e9}", '\u{e9}'),
            ("serial=a\0b", '\0'),
            ("serial=a\tb", '\t'),
        ] {
            let error = parse_dmi_setting(input).unwrap_err();
            assert_eq!(
                error,
                DmiError::BadCharacter {
                    field: DmiField::Serial,
                    character
                },
                "{input:?}"
            );
            assert!(error.to_string().contains(&format!("{character:?}")), "{error}");
            assert!(!error.to_string().contains("comma would"), "{error}");
        }
        let newline = parse_dmi_setting("serial=a\nb").unwrap_err().to_string();
        assert!(newline.contains("'\\n'"), "shown escaped: {newline}");

        assert_eq!(
            parse_dmi_setting("bios-version="),
            Err(DmiError::Empty(DmiField::BiosVersion))
        );
        let long = parse_dmi_setting(&format!("board-name={}", "y".repeat(65))).unwrap_err();
        assert_eq!(
            long,
            DmiError::TooLong {
                field: DmiField::BoardName,
                length: 65
            }
        );
        assert!(long.to_string().contains("board-name"), "{long}");

        let unknown = parse_dmi_setting("chassis-type=3").unwrap_err();
        assert_eq!(unknown, DmiError::UnknownField("chassis-type".into()));
        let text = unknown.to_string();
        assert!(text.contains("`chassis-type`"), "{text}");
        assert!(text.contains("sys-vendor, product-name"), "{text}");
        // Names are exact: no sysfs spelling, no case folding, no blanks.
        for name in ["sys_vendor", "Serial", " serial", ""] {
            assert_eq!(
                parse_dmi_setting(&format!("{name}=x")),
                Err(DmiError::UnknownField(name.into()))
            );
        }
        assert_eq!(
            parse_dmi_setting("serial"),
            Err(DmiError::NotAnAssignment("serial".into()))
        );

        let twice = Dmi::parse(["serial=A", "product-name=P", "serial=B"]).unwrap_err();
        assert_eq!(twice, DmiError::Duplicate(DmiField::Serial));
        assert_eq!(twice.to_string(), "serial is given twice");
        // The same value twice is still a mistake in the command line.
        assert!(Dmi::parse(["serial=A", "serial=A"]).is_err());
    }

    #[test]
    fn dmi_becomes_one_smbios_option_per_structure_in_a_stable_order() {
        assert!(smbios_options(&Dmi::default(), false).is_empty());

        let given = [
            "board-name=EB-1",
            "serial=SN-0042",
            "bios-version=1.2.3",
            "sys-vendor=Acme Corp",
            "product-version=rev (B)",
            "bios-vendor=Acme",
            "product-name=Edge/1",
            "board-vendor=Acme Boards",
        ];
        let dmi = Dmi::parse(given).unwrap();
        let expected = [
            "type=0,vendor=Acme,version=1.2.3",
            "type=1,manufacturer=Acme Corp,product=Edge/1,version=rev (B),serial=SN-0042",
            "type=2,manufacturer=Acme Boards,product=EB-1",
        ];
        assert_eq!(smbios_options(&dmi, false), expected);
        // The order given does not matter.
        let mut reversed = given;
        reversed.reverse();
        assert_eq!(smbios_options(&Dmi::parse(reversed).unwrap(), false), expected);
        // UEFI keeps type 0's "UEFI is supported" bit.
        assert_eq!(
            smbios_options(&dmi, true)[0],
            "type=0,vendor=Acme,version=1.2.3,uefi=on"
        );

        // Only the structures that are touched.
        let product = Dmi::parse(["product-name=B"]).unwrap();
        assert_eq!(smbios_options(&product, true), ["type=1,product=B"]);
        let board = Dmi::parse(["board-name=B"]).unwrap();
        assert_eq!(smbios_options(&board, false), ["type=2,product=B"]);
    }

    #[test]
    fn dmi_report_is_a_map_by_field() {
        let dmi = Dmi::parse(["serial=S", "sys-vendor=V"]).unwrap();
        assert_eq!(dmi.get(DmiField::Serial), Some("S"));
        assert_eq!(dmi.get(DmiField::BoardName), None);
        assert_eq!(
            serde_json::to_value(&dmi).unwrap(),
            serde_json::json!({"sys-vendor": "V", "serial": "S"})
        );
    }
}
