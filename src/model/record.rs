//! The operator's record annotation (`reloader.rs/source-hashes`): its text format, and the
//! form a workload summary keeps it in.
//!
//! The record names every source a workload uses with the hash it was last brought up to date
//! with: as JSON text ~70 bytes an entry, the largest single item of a summary (see
//! docs/performance.md, "Heap profile"). Kept as bytes, an entry is its kind, its name and the
//! hash's bytes: about 40.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::model::source::{SourceKind, SourceRef};

/// Parses the record annotation: a JSON object of `kind/name` → hash. Unknown or malformed
/// entries are dropped (the next write rewrites the record whole).
pub fn parse_record(value: &str) -> BTreeMap<SourceRef, String> {
    let Ok(map) = serde_json::from_str::<BTreeMap<String, String>>(value) else {
        return BTreeMap::new();
    };
    map.into_iter()
        .filter_map(|(k, hash)| {
            let (tag, name) = k.split_once('/')?;
            Some((SourceRef::new(SourceKind::from_tag(tag)?, name), hash))
        })
        .collect()
}

/// Renders the record annotation (keys sorted, so equal records render equally).
pub fn format_record(record: &BTreeMap<SourceRef, String>) -> String {
    let map: BTreeMap<String, &String> = record.iter().map(|(k, v)| (k.to_string(), v)).collect();
    serde_json::to_string(&map).expect("a string map always serialises")
}

/// A workload's record annotation as its summary keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeptRecord {
    /// No record annotation.
    #[default]
    Absent,
    /// A record exactly as [`format_record`] renders it, every hash lowercase hex: per entry
    /// the kind (one byte), the name's length (one byte) and bytes, the hash's length in bytes
    /// (one byte) and its bytes. Rendering it again gives back the annotation's text.
    Packed(Box<[u8]>),
    /// Any other text (written by hand, or by another version), as written.
    Text(Box<str>),
}

fn kind_byte(kind: SourceKind) -> u8 {
    match kind {
        SourceKind::ConfigMap => 0,
        SourceKind::Secret => 1,
        SourceKind::SecretProviderClass => 2,
    }
}

fn kind_of(byte: u8) -> Option<SourceKind> {
    match byte {
        0 => Some(SourceKind::ConfigMap),
        1 => Some(SourceKind::Secret),
        2 => Some(SourceKind::SecretProviderClass),
        _ => None,
    }
}

/// The bytes of lowercase hex text (even length, at most 255 bytes), else `None`.
fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if text.is_empty() || !text.len().is_multiple_of(2) || text.len() > 2 * 255 {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

fn hex_text(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])
        .map(char::from)
        .collect()
}

/// `record` packed, when every name and hash fits (see [`KeptRecord::Packed`]).
fn pack(record: &BTreeMap<SourceRef, String>) -> Option<Box<[u8]>> {
    let mut out = Vec::new();
    for (source, hash) in record {
        let name = source.name.as_bytes();
        let hash = hex_bytes(hash)?;
        out.push(kind_byte(source.kind));
        out.push(u8::try_from(name.len()).ok()?);
        out.extend_from_slice(name);
        out.push(u8::try_from(hash.len()).ok()?);
        out.extend_from_slice(&hash);
    }
    Some(out.into_boxed_slice())
}

/// The entries of packed bytes (which [`pack`] wrote: never malformed).
fn unpack(mut bytes: &[u8]) -> BTreeMap<SourceRef, String> {
    let mut out = BTreeMap::new();
    // Takes `n` bytes off the front.
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = bytes.split_at_checked(n)?;
        *bytes = rest;
        Some(head)
    }
    let mut next = || -> Option<(SourceRef, String)> {
        let kind = kind_of(*take(&mut bytes, 1)?.first()?)?;
        let len = usize::from(*take(&mut bytes, 1)?.first()?);
        let name = std::str::from_utf8(take(&mut bytes, len)?).ok()?.to_string();
        let len = usize::from(*take(&mut bytes, 1)?.first()?);
        let hash = hex_text(take(&mut bytes, len)?);
        Some((SourceRef::new(kind, name), hash))
    };
    while let Some((source, hash)) = next() {
        out.insert(source, hash);
    }
    out
}

impl KeptRecord {
    /// Keeps the annotation's text: packed when that loses nothing, else as it is.
    pub fn new(text: &str) -> Self {
        let record = parse_record(text);
        match pack(&record) {
            Some(packed) if format_record(&record) == text => KeptRecord::Packed(packed),
            _ => KeptRecord::Text(text.into()),
        }
    }

    /// The record: source → hash (empty when absent or unreadable).
    pub fn entries(&self) -> BTreeMap<SourceRef, String> {
        match self {
            KeptRecord::Absent => BTreeMap::new(),
            KeptRecord::Packed(bytes) => unpack(bytes),
            KeptRecord::Text(text) => parse_record(text),
        }
    }

    /// The annotation's text as the workload carries it; `None` when absent.
    pub fn text(&self) -> Option<Cow<'_, str>> {
        match self {
            KeptRecord::Absent => None,
            KeptRecord::Packed(_) => Some(Cow::Owned(format_record(&self.entries()))),
            KeptRecord::Text(text) => Some(Cow::Borrowed(text)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }
    fn secret(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::Secret, name)
    }

    #[test]
    fn record_round_trips_and_tolerates_garbage() {
        let record: BTreeMap<_, _> =
            [(cm("b"), "2".to_string()), (secret("a"), "1".to_string())].into_iter().collect();
        let text = format_record(&record);
        assert_eq!(text, r#"{"configmap/b":"2","secret/a":"1"}"#);
        assert_eq!(parse_record(&text), record);
        assert!(parse_record("not json").is_empty());
        assert_eq!(parse_record(r#"{"configmap/x":"1","bogus/y":"2","noslash":"3"}"#).len(), 1);
    }

    #[test]
    fn the_operators_records_are_packed_and_give_back_their_text() {
        let sha1 = "0123456789abcdef0123456789abcdef01234567";
        let sha256 = "ab".repeat(32);
        let spc = SourceRef::new(SourceKind::SecretProviderClass, "vault");
        let record: BTreeMap<_, _> = [
            (cm("app-config"), sha1.to_string()),
            (secret("db"), sha256.clone()),
            (spc, sha1.to_string()),
        ]
        .into();
        let text = format_record(&record);
        let kept = KeptRecord::new(&text);
        let KeptRecord::Packed(bytes) = &kept else { panic!("{kept:?}") };
        assert!(bytes.len() < text.len() / 2, "{} of {}", bytes.len(), text.len());
        assert_eq!(kept.entries(), record);
        assert_eq!(kept.text().as_deref(), Some(text.as_str()));
        assert_eq!(KeptRecord::new("{}"), KeptRecord::Packed(Box::default()));
        assert_eq!(KeptRecord::new("{}").text().as_deref(), Some("{}"));
        assert_eq!(KeptRecord::Absent.text(), None);
        assert!(KeptRecord::Absent.entries().is_empty());
    }

    #[test]
    fn any_other_text_is_kept_as_written() {
        let long_name = "n".repeat(300);
        for text in [
            // Not hex, upper case, spaced out, an entry dropped on parsing, not JSON, too long.
            r#"{"configmap/a":"h1"}"#.to_string(),
            r#"{"configmap/a":"ABCD"}"#.to_string(),
            r#"{ "configmap/a": "abcd" }"#.to_string(),
            r#"{"bogus/a":"abcd","configmap/a":"abcd"}"#.to_string(),
            "{garbled".to_string(),
            format!(r#"{{"configmap/{long_name}":"abcd"}}"#),
        ] {
            let kept = KeptRecord::new(&text);
            assert_eq!(kept, KeptRecord::Text(text.clone().into()));
            assert_eq!(kept.text().as_deref(), Some(text.as_str()));
            assert_eq!(kept.entries(), parse_record(&text));
        }
    }

    proptest::proptest! {
        /// The record annotation is written by anyone who can edit a workload: any text parses
        /// to some record, never a panic, and is given back as written.
        #[test]
        fn any_record_text_parses(text in ".{0,200}") {
            let kept = KeptRecord::new(&text);
            let shown = kept.text();
            proptest::prop_assert_eq!(shown.as_deref(), Some(text.as_str()));
            proptest::prop_assert_eq!(kept.entries(), parse_record(&text));
        }

        #[test]
        fn packed_records_give_back_their_entries(
            entries in proptest::collection::btree_map(
                (0u8..3, "[a-z0-9.-]{1,60}"), "([0-9a-f]{2}){1,40}", 0..12)
        ) {
            let record: BTreeMap<SourceRef, String> = entries
                .into_iter()
                .map(|((kind, name), hash)| (SourceRef::new(kind_of(kind).unwrap(), name), hash))
                .collect();
            let text = format_record(&record);
            let kept = KeptRecord::new(&text);
            proptest::prop_assert!(matches!(kept, KeptRecord::Packed(_)));
            proptest::prop_assert_eq!(kept.entries(), record);
            let shown = kept.text();
            proptest::prop_assert_eq!(shown.as_deref(), Some(text.as_str()));
        }
    }
}
