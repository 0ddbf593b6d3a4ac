//! Content hashes of ConfigMaps, Secrets and SecretProviderClassPodStatuses.
//!
//! These must match stakater/Reloader bit for bit: a migrating cluster compares the hashes that
//! program wrote into pod templates with the ones computed here, and any difference is a rollout.
//! The input is every entry rendered as `key=value`, sorted bytewise, joined with `;`, and hashed
//! with SHA-1 (lowercase hex). Only data counts: labels, annotations and type never do.
//!
//! The operator keeps these SHA-1s internally; a [`Hasher`] decides what is written: the SHA-1
//! itself (`sha1`, compatible) or HMAC-SHA-256 of it under the operator's key (`hmac-sha256`).

use std::collections::BTreeMap;

use crate::model::workload::HashMode;
use std::sync::Arc;

use base64::Engine as _;
use k8s_openapi::ByteString;
use sha1::{Digest, Sha1};

/// The hash of an object without data (the SHA-1 of the empty string).
pub const EMPTY_HASH: &str = "da39a3ee5e6b4b0d3255bfef95601890afd80709";

/// The text whose hash the annotations strategy records when a source is deleted.
pub const DELETE_MARKER: &str = "__RELOADER_EMPTY_DELETE_MARKER__";

/// One `key=value` entry, kept as its two parts so that a value is hashed where it lies (a
/// Secret's data is not copied to be hashed).
struct Entry<'a> {
    key: &'a str,
    value: std::borrow::Cow<'a, [u8]>,
}

impl<'a> Entry<'a> {
    fn new(key: &'a str, value: impl Into<std::borrow::Cow<'a, [u8]>>) -> Self {
        Entry { key, value: value.into() }
    }

    /// The entry's text, `key=value`, as the order of entries is the bytewise order of it.
    fn text(&self) -> impl Iterator<Item = u8> + '_ {
        self.key.bytes().chain([b'=']).chain(self.value.iter().copied())
    }

    fn hash_into(&self, hasher: &mut Sha1) {
        hasher.update(self.key.as_bytes());
        hasher.update(b"=");
        hasher.update(&self.value);
    }

    fn sha1(&self) -> String {
        let mut hasher = Sha1::new();
        self.hash_into(&mut hasher);
        hex(&hasher.finalize())
    }
}

/// SHA-1 of `entries` sorted bytewise and joined with `;`.
fn hash_entries(entries: &mut [Entry<'_>]) -> String {
    entries.sort_unstable_by(|a, b| a.text().cmp(b.text()));
    let mut hasher = Sha1::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            hasher.update(b";");
        }
        entry.hash_into(&mut hasher);
    }
    hex(&hasher.finalize())
}

/// Lowercase hex, as hashes are written.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

/// A source's content hash and, when asked for, the hash of each key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceHashes {
    pub content: String,
    /// Empty unless asked for.
    pub keys: BTreeMap<String, String>,
}

/// The content hash of `entries` and, with `per_key`, each entry's own hash. A single entry's
/// hash is the content hash, so the usual one-key source is hashed once.
fn source_hashes(mut entries: Vec<Entry<'_>>, per_key: bool) -> SourceHashes {
    // Before sorting: a later entry for the same key wins, as in a map built in this order.
    let keys = match entries.as_slice() {
        _ if !per_key => BTreeMap::new(),
        [_] => BTreeMap::new(),
        many => many.iter().map(|e| (e.key.to_owned(), e.sha1())).collect(),
    };
    let content = hash_entries(&mut entries);
    let keys = match entries.as_slice() {
        [only] if per_key => BTreeMap::from([(only.key.to_owned(), content.clone())]),
        _ => keys,
    };
    SourceHashes { content, keys }
}

/// ConfigMap: `key=value` for `data`, `key=base64(value)` (standard, padded) for `binaryData`.
/// Entries are borrowed where they were decoded, values as bytes (a Go string's bytes).
pub fn configmap_entry_hashes<'a>(
    data: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    binary_data: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    per_key: bool,
) -> SourceHashes {
    let mut entries: Vec<Entry<'a>> = data.into_iter().map(|(k, v)| Entry::new(k, v)).collect();
    for (k, v) in binary_data {
        let encoded = base64::engine::general_purpose::STANDARD.encode(v);
        entries.push(Entry::new(k, encoded.into_bytes()));
    }
    source_hashes(entries, per_key)
}

/// Secret: `key=<decoded bytes>` for each `data` entry. `stringData` is write-only (the API server
/// folds it into `data`), so it is never seen here.
pub fn secret_entry_hashes<'a>(
    data: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    per_key: bool,
) -> SourceHashes {
    source_hashes(data.into_iter().map(|(k, v)| Entry::new(k, v)).collect(), per_key)
}

/// [`configmap_entry_hashes`] of a decoded ConfigMap's maps.
pub fn configmap_hashes(
    data: Option<&BTreeMap<String, String>>,
    binary_data: Option<&BTreeMap<String, ByteString>>,
    per_key: bool,
) -> SourceHashes {
    configmap_entry_hashes(
        data.into_iter().flatten().map(|(k, v)| (k.as_str(), v.as_bytes())),
        binary_data.into_iter().flatten().map(|(k, v)| (k.as_str(), v.0.as_slice())),
        per_key,
    )
}

/// [`secret_entry_hashes`] of a decoded Secret's data.
pub fn secret_hashes(data: Option<&BTreeMap<String, ByteString>>, per_key: bool) -> SourceHashes {
    secret_entry_hashes(
        data.into_iter().flatten().map(|(k, v)| (k.as_str(), v.0.as_slice())),
        per_key,
    )
}

/// SecretProviderClassPodStatus: `id=version` for each mounted object, plus
/// `SecretProviderClassName=<name>`.
pub fn secret_provider_class_hash<'a>(
    class_name: &str,
    objects: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut entries: Vec<Entry<'_>> =
        objects.into_iter().map(|(id, version)| Entry::new(id, version.as_bytes())).collect();
    entries.push(Entry::new("SecretProviderClassName", class_name.as_bytes()));
    hash_entries(&mut entries)
}

/// The hash of only `keys` of a source, from its per-key hashes: SHA-1 of `key=<key hash>` for
/// each selected key present, sorted and joined with `;` (keys absent from the data drop out).
pub fn hash_of_keys(key_hashes: &BTreeMap<String, String>, keys: &[String]) -> String {
    let selected: std::collections::BTreeSet<&String> =
        keys.iter().filter(|k| key_hashes.contains_key(*k)).collect();
    let mut entries: Vec<Entry<'_>> =
        selected.into_iter().map(|k| Entry::new(k, key_hashes[k].as_bytes())).collect();
    hash_entries(&mut entries)
}

/// The one key-precise rule of both modes: when a workload consumes only some keys of a source
/// (`used`: key refs, volume `items`) and key-precise references are on, the SHA-1 that counts
/// for it is the hash of those keys (within `filter`, a policy entry's `keys`). `None` when the
/// rule does not apply (the source is consumed whole, the option is off, or the source has too
/// many keys for per-key hashes): the source's own hash counts.
pub fn key_precise_sha1(
    used: Option<&std::collections::BTreeSet<String>>,
    key_precise: bool,
    keys_untracked: bool,
    key_hashes: &BTreeMap<String, String>,
    filter: Option<&[String]>,
) -> Option<String> {
    let used = used.filter(|_| key_precise && !keys_untracked)?;
    let keys: Vec<String> =
        used.iter().filter(|k| filter.is_none_or(|filter| filter.contains(k))).cloned().collect();
    Some(hash_of_keys(key_hashes, &keys))
}

/// The hash the annotations strategy writes when a source is deleted.
pub fn delete_marker_hash() -> String {
    sha1_hex(DELETE_MARKER)
}

/// SHA-1 of arbitrary text, for combining several hashes into one value.
pub fn sha1_hex(text: &str) -> String {
    hex(&Sha1::digest(text.as_bytes()))
}

/// Bytes of a generated hash key.
pub const HASH_KEY_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum HashKeyError {
    #[error("a hash key must have at least {HASH_KEY_LEN} bytes, got {0}")]
    TooShort(usize),
    #[error("the system random number generator failed")]
    Random,
}

/// The operator's HMAC key. Its `Debug` never shows the bytes.
#[derive(Clone)]
pub struct HashKey {
    hmac: ring::hmac::Key,
    bytes: Arc<[u8]>,
}

impl HashKey {
    pub fn new(bytes: &[u8]) -> Result<Self, HashKeyError> {
        if bytes.len() < HASH_KEY_LEN {
            return Err(HashKeyError::TooShort(bytes.len()));
        }
        Ok(Self { hmac: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes), bytes: bytes.into() })
    }

    /// A key for another purpose, derived from this one (HMAC-SHA-256 of `purpose`): whoever
    /// lacks the hash key cannot compute it, and it says nothing about the hash key.
    pub fn derive(&self, purpose: &[u8]) -> [u8; 32] {
        let tag = ring::hmac::sign(&self.hmac, purpose);
        let mut out = [0u8; 32];
        out.copy_from_slice(&tag.as_ref()[..32]);
        out
    }

    /// Fresh random key bytes, for a new key Secret.
    pub fn generate() -> Result<Vec<u8>, HashKeyError> {
        use ring::rand::SecureRandom as _;
        let mut bytes = vec![0u8; HASH_KEY_LEN];
        ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| HashKeyError::Random)?;
        Ok(bytes)
    }
}

impl PartialEq for HashKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for HashKey {}

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(<redacted>)")
    }
}

/// Turns a content hash (the SHA-1 hex the operator computes internally) into the value that
/// leaves the operator. The one place hash modes are applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Hasher {
    #[default]
    Sha1,
    HmacSha256(HashKey),
}

impl Hasher {
    /// `sha1_hex` as is, or hex(HMAC-SHA-256(key, sha1_hex)): a pseudo-random function of the
    /// data's SHA-1 that says nothing about it without the key.
    pub fn apply(&self, sha1_hex: &str) -> String {
        match self {
            Hasher::Sha1 => sha1_hex.to_string(),
            Hasher::HmacSha256(key) => {
                hex(ring::hmac::sign(&key.hmac, sha1_hex.as_bytes()).as_ref())
            }
        }
    }

    pub fn mode(&self) -> HashMode {
        match self {
            Hasher::Sha1 => HashMode::Sha1,
            Hasher::HmacSha256(_) => HashMode::HmacSha256,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Golden values were computed outside this code, with coreutils, e.g.
    //! `printf 'a=1;b=2' | sha1sum`, so a bug here cannot hide in the expectation.
    use super::*;

    fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
    fn bytes(pairs: &[(&str, &[u8])]) -> BTreeMap<String, ByteString> {
        pairs.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect()
    }
    fn configmap_hash(
        data: Option<&BTreeMap<String, String>>,
        binary_data: Option<&BTreeMap<String, ByteString>>,
    ) -> String {
        configmap_hashes(data, binary_data, false).content
    }
    fn secret_hash(data: Option<&BTreeMap<String, ByteString>>) -> String {
        secret_hashes(data, false).content
    }
    fn configmap_key_hashes(data: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
        configmap_hashes(data, None, true).keys
    }

    #[test]
    fn empty_objects_hash_to_the_empty_string() {
        assert_eq!(configmap_hash(None, None), EMPTY_HASH);
        assert_eq!(configmap_hash(Some(&BTreeMap::new()), Some(&BTreeMap::new())), EMPTY_HASH);
        assert_eq!(secret_hash(None), EMPTY_HASH);
    }

    #[test]
    fn configmap_golden_values() {
        // printf 'a=1;b=2' | sha1sum
        assert_eq!(
            configmap_hash(Some(&strings(&[("b", "2"), ("a", "1")])), None),
            "f83e99e324ba68ccc373a58ef1eb42f8ab88646a"
        );
        // printf 'url=postgres://db:5432/app' | sha1sum
        assert_eq!(
            configmap_hash(Some(&strings(&[("url", "postgres://db:5432/app")])), None),
            "9cd04b7d5829bebb7ef8a1256c7c564c8871f4b8"
        );
    }

    #[test]
    fn configmap_binary_data_is_base64_encoded() {
        // printf 'bin=AAH/;text=hi' | sha1sum
        let data = strings(&[("text", "hi")]);
        let bin = bytes(&[("bin", &[0x00, 0x01, 0xff])]);
        assert_eq!(
            configmap_hash(Some(&data), Some(&bin)),
            "6e16702704645768c2ed054cf3c59965e26657d7"
        );
    }

    #[test]
    fn entries_sort_as_whole_strings_not_by_key() {
        // 'a.b=2' sorts before 'a=1' because '.' < '='.  printf 'a.b=2;a=1' | sha1sum
        assert_eq!(
            configmap_hash(Some(&strings(&[("a", "1"), ("a.b", "2")])), None),
            "499daa6d70eb53ada0bb7346397120ffefcda5c3"
        );
    }

    #[test]
    fn secret_golden_values_use_decoded_bytes() {
        // printf 'password=s3cr3t;user=admin' | sha1sum
        let data = bytes(&[("user", b"admin"), ("password", b"s3cr3t")]);
        assert_eq!(secret_hash(Some(&data)), "e013dcfd8b3a9e80e812740978788202e1ef1325");
    }

    #[test]
    fn secret_and_configmap_with_the_same_text_hash_the_same() {
        let s = secret_hash(Some(&bytes(&[("k", b"v")])));
        let c = configmap_hash(Some(&strings(&[("k", "v")])), None);
        assert_eq!(s, c);
    }

    #[test]
    fn non_utf8_secret_bytes_are_hashed_raw() {
        let a = secret_hash(Some(&bytes(&[("k", &[0xff, 0xfe])])));
        let b = secret_hash(Some(&bytes(&[("k", &[0xff, 0xfd])])));
        assert_ne!(a, b);
        assert_eq!(a.len(), 40);
    }

    #[test]
    fn keyed_hash_ignores_other_keys_and_golden_value() {
        let a = configmap_key_hashes(Some(&strings(&[("flags", "on"), ("other", "1")])));
        let b = configmap_key_hashes(Some(&strings(&[("flags", "on"), ("other", "2")])));
        let keys = ["flags".to_string()];
        assert_eq!(hash_of_keys(&a, &keys), hash_of_keys(&b, &keys));
        let c = configmap_key_hashes(Some(&strings(&[("flags", "off"), ("other", "1")])));
        assert_ne!(hash_of_keys(&a, &keys), hash_of_keys(&c, &keys));
        // printf 'flags=on' | sha1sum  -> the key hash; then 'flags=<that>' | sha1sum
        assert_eq!(a["flags"], "45d8cfd70c0bf8ec3986fa1e3e1a57effabb56ce");
        assert_eq!(hash_of_keys(&a, &keys), "1f469c5ee206403869a902f453bea0f5208415cf");
        assert_eq!(hash_of_keys(&a, &["missing".to_string()]), EMPTY_HASH);
    }

    #[test]
    fn one_pass_gives_the_content_hash_and_each_keys_hash() {
        let two = strings(&[("b", "2"), ("a", "1")]);
        let both = configmap_hashes(Some(&two), None, true);
        assert_eq!(both.content, configmap_hashes(Some(&two), None, false).content);
        // printf 'a=1' | sha1sum; printf 'b=2' | sha1sum
        assert_eq!(both.keys["a"], "86eda770a6060824b090dd4df091e3bd4121279c");
        assert_eq!(both.keys["b"], "90f50c69eb50e493cd1ab95b7d6fbd0b3a53f01e");
        assert!(configmap_hashes(Some(&two), None, false).keys.is_empty());
        // One key: its hash is the content hash.
        let one = secret_hashes(Some(&bytes(&[("data", b"x")])), true);
        assert_eq!(one.keys, BTreeMap::from([("data".to_string(), one.content.clone())]));
        assert_eq!(
            secret_hashes(None, true),
            SourceHashes { content: EMPTY_HASH.into(), keys: BTreeMap::new() }
        );
        // binaryData keys hash their base64 text, as in the content hash.
        let bin = BTreeMap::from([("k".to_string(), ByteString(vec![0xff]))]);
        assert_eq!(configmap_hashes(None, Some(&bin), true).keys["k"], sha1_hex("k=/w=="));
    }

    #[test]
    fn delete_marker_golden_value() {
        // printf '__RELOADER_EMPTY_DELETE_MARKER__' | sha1sum
        assert_eq!(delete_marker_hash(), "aae45badef99284e4dae01d6046154ea9d99532f");
    }

    #[test]
    fn hmac_golden_value_and_sha1_passthrough() {
        // python3: hmac.new(bytes(range(32)), b'e013dcfd8b3a9e80e812740978788202e1ef1325',
        //                   hashlib.sha256).hexdigest()
        let key: Vec<u8> = (0u8..32).collect();
        let keyed = Hasher::HmacSha256(HashKey::new(&key).unwrap());
        let sha1 = "e013dcfd8b3a9e80e812740978788202e1ef1325";
        assert_eq!(
            keyed.apply(sha1),
            "8e6f529a3fc4e9dc71f3365cafcad1cea8d6aaf4526bcbd39c359804604ea9a2"
        );
        // python3: hmac.new(b'\0' * 32, b'da39a3ee5e6b4b0d3255bfef95601890afd80709', ...)
        let zero = Hasher::HmacSha256(HashKey::new(&[0u8; 32]).unwrap());
        assert_eq!(
            zero.apply(EMPTY_HASH),
            "92f7ba165b778fb5d4e27d09e656e2498a2d5846b17784954c94b63542a5c4d9"
        );
        assert_eq!(Hasher::Sha1.apply(sha1), sha1);
        assert_ne!(keyed, zero);
    }

    #[test]
    fn hash_keys_are_long_random_and_never_printed() {
        assert!(matches!(HashKey::new(&[1u8; 16]), Err(HashKeyError::TooShort(16))));
        let a = HashKey::generate().unwrap();
        let b = HashKey::generate().unwrap();
        assert_eq!(a.len(), HASH_KEY_LEN);
        assert_ne!(a, b);
        let key = HashKey::new(&a).unwrap();
        assert_eq!(format!("{key:?}"), "HashKey(<redacted>)");
        assert_eq!(format!("{:?}", Hasher::HmacSha256(key)), "HmacSha256(HashKey(<redacted>))");
    }

    #[test]
    fn secret_provider_class_golden_value() {
        // printf 'SecretProviderClassName=vault-db;secret/db-pass=v2;secret/db-user=v1' | sha1sum
        let h = secret_provider_class_hash(
            "vault-db",
            [("secret/db-user", "v1"), ("secret/db-pass", "v2")],
        );
        assert_eq!(h, "b37bb40b66ce32cec6371934528a48b4d0d308b5");
    }
}
