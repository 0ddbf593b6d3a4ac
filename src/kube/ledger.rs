//! The source ledger: the hashes of every Secret's and ConfigMap's data with the
//! resourceVersion they were computed at, written to ConfigMaps in the operator's namespace,
//! so that a start takes the sources in without their data.
//!
//! Why: at a start the operator needs every source's hashes (changes made while it was down
//! are caught up by comparing them with what the workloads record), and receiving the data to
//! hash it is most of a large cluster's start: 50,000 Secrets of 8 KiB are 421 MB the API
//! server encodes and sends and the operator decrypts and hashes (about 2.3 s of API-server CPU
//! and as much of the operator's on the bench machine), while their metadata alone is 9 MB
//! (0.2 s). An object's resourceVersion changes with every write, so a source whose version is
//! the one the ledger names holds the data the ledger's hashes were computed from. A start with
//! a ledger lists the sources' metadata only (`kube::proto_watch`), takes the hashes of those
//! it matches from here, fetches the few it does not, and watches whole objects from there.
//!
//! Every entry is a fact that stays true (this object had this data at this version), so an
//! old or partly written ledger is never wrong, only less complete. It lives in the same etcd
//! as the sources: a restore from backup restores both to the same moment.
//!
//! The ledger holds the plain SHA-1 of every Secret's data, so it is sealed (AES-256-GCM) with
//! a key derived from the operator's hash key and kept only where there is one; a ledger that
//! does not open with the key (another key, edited, truncated) is not read. ConfigMaps in the
//! operator's namespace, like the pending-Job records: the rights both charts grant there.

use std::collections::HashMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use tracing::{debug, warn};

use crate::decide::hash::HashKey;
use crate::model::source::{KnownData, SourceKind};

/// The label naming a ledger ConfigMap's source kind.
pub const LEDGER_LABEL: &str = "reloader.rs/source-ledger";
/// The binaryData key of a chunk.
const DATA_KEY: &str = "ledger";
/// Plain bytes per chunk: a ConfigMap holds at most 1 MiB.
const CHUNK_BYTES: usize = 768 << 10;
/// Chunks read at most (150 MiB of ledger: far beyond a million sources).
const MAX_CHUNKS: usize = 200;
const MAGIC: &[u8; 4] = b"RLG1";
/// Entry flags.
const SAME_NAMESPACE: u8 = 1;
const KEYS_UNTRACKED: u8 = 2;
/// One key whose hash is the content hash (every one-key source): only its name is written.
const ONE_KEY: u8 = 4;
/// A hash that is 40 lowercase hex digits is written as its 20 bytes.
const HASH_BYTES: u8 = 0;
const HASH_TEXT: u8 = 1;

/// A chunk that is not a ledger sealed with this key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct LedgerError(pub &'static str);

type Result<T> = std::result::Result<T, LedgerError>;

/// The sealing key of one kind's ledger.
pub struct LedgerKey {
    key: LessSafeKey,
    /// Binds a chunk to its kind: a Secret chunk does not open as a ConfigMap one.
    aad: String,
}

impl LedgerKey {
    pub fn new(hash_key: &HashKey, kind: SourceKind) -> Self {
        let bytes = hash_key.derive(b"reloader.rs/source-ledger/v1");
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes).expect("32 bytes"));
        Self { key, aad: format!("reloader.rs/source-ledger/{}", kind.tag()) }
    }

    pub fn seal(&self, mut plain: Vec<u8>) -> Vec<u8> {
        use ring::rand::SecureRandom as _;
        let mut nonce = [0u8; NONCE_LEN];
        ring::rand::SystemRandom::new().fill(&mut nonce).expect("system random numbers");
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad.as_bytes()),
                &mut plain,
            )
            .expect("a chunk is far below AES-GCM's limit");
        [&nonce[..], &plain].concat()
    }

    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>> {
        let (nonce, body) =
            sealed.split_first_chunk::<NONCE_LEN>().ok_or(LedgerError("shorter than its nonce"))?;
        let mut body = body.to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(self.aad.as_bytes()),
                &mut body,
            )
            .map_err(|_| LedgerError("does not open with the operator's key"))?;
        Ok(plain.to_vec())
    }
}

/// One source as the ledger knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub namespace: String,
    pub name: String,
    pub known: KnownData,
}

/// Encodes entries into chunks of about [`CHUNK_BYTES`] each (plain, not sealed yet); each
/// chunk reads on its own.
pub struct ChunkWriter {
    chunks: Vec<Vec<u8>>,
    current: Vec<u8>,
    entries: u32,
    namespace: String,
}

impl Default for ChunkWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkWriter {
    pub fn new() -> Self {
        ChunkWriter {
            chunks: Vec::new(),
            current: Vec::new(),
            entries: 0,
            namespace: String::new(),
        }
    }

    pub fn push(&mut self, namespace: &str, name: &str, known: &KnownData) {
        if self.current.len() >= CHUNK_BYTES {
            self.finish_chunk();
        }
        let same = self.entries > 0 && self.namespace == namespace;
        let one_key = match known.key_hashes.as_slice() {
            [(_, hash)] => *hash == known.content,
            _ => false,
        };
        let flags = if same { SAME_NAMESPACE } else { 0 }
            | if known.keys_untracked { KEYS_UNTRACKED } else { 0 }
            | if one_key { ONE_KEY } else { 0 };
        let out = &mut self.current;
        out.push(flags);
        if !same {
            put_str(out, namespace);
            namespace.clone_into(&mut self.namespace);
        }
        put_str(out, name);
        put_varint(out, known.resource_version);
        put_hash(out, &known.content);
        if one_key {
            put_str(out, &known.key_hashes[0].0);
        } else {
            put_varint(out, known.key_hashes.len() as u64);
            for (key, hash) in &known.key_hashes {
                put_str(out, key);
                put_hash(out, hash);
            }
        }
        self.entries += 1;
    }

    fn finish_chunk(&mut self) {
        let mut chunk = Vec::with_capacity(self.current.len() + 8);
        chunk.extend_from_slice(MAGIC);
        chunk.extend_from_slice(&self.entries.to_be_bytes());
        chunk.append(&mut self.current);
        self.chunks.push(chunk);
        self.entries = 0;
    }

    /// The plain chunks (at least one, maybe empty).
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        if self.entries > 0 || self.chunks.is_empty() {
            self.finish_chunk();
        }
        self.chunks
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_hash(out: &mut Vec<u8>, hash: &str) {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes: Option<Vec<u8>> = (hash.len() == 40)
        .then(|| {
            hash.as_bytes()
                .chunks_exact(2)
                .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
                .collect()
        })
        .flatten();
    match bytes {
        Some(bytes) => {
            out.push(HASH_BYTES);
            out.extend_from_slice(&bytes);
        }
        None => {
            out.push(HASH_TEXT);
            put_str(out, hash);
        }
    }
}

/// Reads a plain chunk; every length is checked against what is left.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8> {
        let (&b, rest) = self.buf.split_first().ok_or(LedgerError("truncated"))?;
        self.buf = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift).ok_or(LedgerError("varint overflow"))?;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(LedgerError("varint too long"))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.buf.len() {
            return Err(LedgerError("length past the end"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn str(&mut self) -> Result<&'a str> {
        let n = usize::try_from(self.varint()?).map_err(|_| LedgerError("length too large"))?;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| LedgerError("not UTF-8"))
    }

    fn hash(&mut self) -> Result<String> {
        match self.byte()? {
            HASH_BYTES => Ok(crate::decide::hash::hex(self.bytes(20)?)),
            HASH_TEXT => Ok(self.str()?.to_owned()),
            _ => Err(LedgerError("unknown hash form")),
        }
    }
}

/// The ledger as read at a start: by namespace and name, taken out as sources are matched.
#[derive(Debug, Default)]
pub struct LedgerIndex {
    /// By namespace, then name: looked up with borrowed names, no key built per source.
    entries: HashMap<Box<str>, HashMap<Box<str>, KnownData>>,
    len: usize,
}

impl LedgerIndex {
    /// Adds a plain chunk's entries (a later version of a source wins).
    pub fn read_chunk(&mut self, plain: &[u8]) -> Result<()> {
        let mut r = Reader { buf: plain };
        if r.bytes(4)? != MAGIC {
            return Err(LedgerError("not a ledger chunk of this version"));
        }
        let count = u32::from_be_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
        // Each entry takes at least five bytes: a count beyond that is a lie.
        if count as usize > plain.len() / 5 {
            return Err(LedgerError("more entries than bytes"));
        }
        let mut namespace: &str = "";
        for i in 0..count {
            let flags = r.byte()?;
            if flags & SAME_NAMESPACE == 0 {
                namespace = r.str()?;
            } else if i == 0 {
                return Err(LedgerError("a chunk's first entry names no namespace"));
            }
            let name = r.str()?;
            let resource_version = r.varint()?;
            let content = r.hash()?;
            let key_hashes = if flags & ONE_KEY != 0 {
                vec![(r.str()?.to_owned(), content.clone())]
            } else {
                let keys =
                    usize::try_from(r.varint()?).map_err(|_| LedgerError("too many keys"))?;
                if keys > r.buf.len() / 2 {
                    return Err(LedgerError("more keys than bytes"));
                }
                let mut key_hashes = Vec::with_capacity(keys);
                for _ in 0..keys {
                    key_hashes.push((r.str()?.to_owned(), r.hash()?));
                }
                key_hashes
            };
            let known = KnownData {
                resource_version,
                content,
                key_hashes,
                keys_untracked: flags & KEYS_UNTRACKED != 0,
            };
            if !self.entries.contains_key(namespace) {
                self.entries.insert(namespace.into(), HashMap::new());
            }
            let names = self.entries.get_mut(namespace).expect("inserted above");
            match names.get(name) {
                Some(held) if held.resource_version >= resource_version => {}
                Some(_) => {
                    names.insert(name.into(), known);
                }
                None => {
                    names.insert(name.into(), known);
                    self.len += 1;
                }
            }
        }
        if !r.buf.is_empty() {
            return Err(LedgerError("bytes after the last entry"));
        }
        Ok(())
    }

    /// What the ledger knows of `namespace/name` if it knew it at `resource_version`.
    pub fn known(&self, namespace: &str, name: &str, resource_version: u64) -> Option<&KnownData> {
        let known = self.entries.get(namespace)?.get(name)?;
        (known.resource_version == resource_version).then_some(known)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A resourceVersion as the ledger keeps it: the API server's are decimal integers; one that is
/// not is never matched (the source is fetched instead).
pub fn version_number(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok().filter(|&v| v > 0)
}

fn digest(plain: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, plain);
    d.as_ref().try_into().expect("32 bytes")
}

const CHUNK_PREFIX: &str = "reloader-source-ledger-";

fn chunk_name(kind: SourceKind, index: usize) -> String {
    format!("{CHUNK_PREFIX}{}-{index}", kind.tag())
}

/// Whether a ConfigMap's name is that of a ledger chunk.
pub fn is_chunk_name(name: &str) -> bool {
    name.starts_with(CHUNK_PREFIX)
}

/// Reads and writes one kind's ledger in the operator's namespace.
pub struct LedgerStore {
    client: Client,
    namespace: String,
    kind: SourceKind,
    /// SHA-256 of each chunk as last written (plain), to skip writing what did not change;
    /// `None` until the chunks an earlier process left are looked up (by the first write).
    written: tokio::sync::Mutex<Option<Vec<[u8; 32]>>>,
}

impl LedgerStore {
    pub fn new(client: Client, namespace: String, kind: SourceKind) -> Self {
        Self { client, namespace, kind, written: tokio::sync::Mutex::new(None) }
    }

    pub fn kind(&self) -> SourceKind {
        self.kind
    }

    fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn selector(&self) -> String {
        format!("{LEDGER_LABEL}={}", self.kind.tag())
    }

    /// The ledger as written last; empty when there is none or it cannot be read (said once).
    pub async fn read(&self, key: &LedgerKey) -> LedgerIndex {
        let mut index = LedgerIndex::default();
        let params = ListParams::default().labels(&self.selector());
        let list = match self.api().list(&params).await {
            Ok(list) => list,
            Err(e) => {
                warn!(namespace = %self.namespace, kind = %self.kind, error = %e,
                    "source ledger not readable: the sources are listed whole");
                return index;
            }
        };
        let mut read = 0;
        for cm in list.items.iter().take(MAX_CHUNKS) {
            let name = cm.metadata.name.as_deref().unwrap_or_default();
            let chunk = cm.binary_data.as_ref().and_then(|d| d.get(DATA_KEY));
            let opened = chunk
                .ok_or(LedgerError("no ledger data"))
                .and_then(|c| key.open(&c.0))
                .and_then(|plain| index.read_chunk(&plain));
            match opened {
                Ok(()) => read += 1,
                Err(e) => warn!(namespace = %self.namespace, configmap = name, error = %e,
                    "source ledger chunk not read: its sources are fetched"),
            }
        }
        debug!(kind = %self.kind, chunks = read, sources = index.len(), "source ledger read");
        index
    }

    /// Writes `chunks` (plain) sealed, skipping those unchanged since the last write, and
    /// removes chunks past them. Returns how many were written.
    pub async fn write(&self, chunks: Vec<Vec<u8>>, key: &LedgerKey) -> kube::Result<usize> {
        let api = self.api();
        let digests: Vec<[u8; 32]> = chunks.iter().map(|c| digest(c)).collect();
        // One write at a time (the periodic one and the one at shutdown may meet).
        let mut written_slot = self.written.lock().await;
        if written_slot.is_none() {
            *written_slot = Some(self.existing_chunks().await);
        }
        let before = written_slot.clone().unwrap_or_default();
        let mut written = 0;
        for (i, plain) in chunks.into_iter().enumerate() {
            if before.get(i) == Some(&digests[i]) {
                continue;
            }
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(chunk_name(self.kind, i)),
                    namespace: Some(self.namespace.clone()),
                    labels: Some(
                        [
                            (LEDGER_LABEL.to_string(), self.kind.tag().to_string()),
                            ("app.kubernetes.io/managed-by".to_string(), "reloader".to_string()),
                        ]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                binary_data: Some([(DATA_KEY.to_string(), ByteString(key.seal(plain)))].into()),
                ..ConfigMap::default()
            };
            // An update without a resourceVersion replaces whatever is there (ConfigMaps allow
            // it): this replica is the only writer, as the leader.
            let name = chunk_name(self.kind, i);
            match api.replace(&name, &PostParams::default(), &cm).await {
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    api.create(&PostParams::default(), &cm).await?;
                }
                other => {
                    other?;
                }
            }
            written += 1;
        }
        // Chunks of a longer ledger written before: removed (or emptied where delete is not
        // granted, as under stakater/Reloader's chart).
        for i in digests.len()..before.len().max(digests.len()) {
            self.remove_chunk(&api, i, key).await?;
        }
        *written_slot = Some(digests);
        Ok(written)
    }

    async fn remove_chunk(
        &self,
        api: &Api<ConfigMap>,
        i: usize,
        key: &LedgerKey,
    ) -> kube::Result<()> {
        let name = chunk_name(self.kind, i);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let empty = ChunkWriter::new().finish().remove(0);
                let mut cm = api.get(&name).await?;
                cm.binary_data = Some([(DATA_KEY.to_string(), ByteString(key.seal(empty)))].into());
                api.replace(&name, &PostParams::default(), &cm).await.map(drop)
            }
            Err(e) => Err(e),
        }
    }

    /// Digests matching nothing for the chunks an earlier process left, so that the first
    /// write rewrites or removes every one of them (a shorter ledger leaves no stale chunk).
    async fn existing_chunks(&self) -> Vec<[u8; 32]> {
        let params = ListParams::default().labels(&self.selector());
        let count = match self.api().list_metadata(&params).await {
            Ok(list) => list
                .items
                .iter()
                .filter_map(|m| {
                    m.metadata.name.as_deref()?.rsplit('-').next()?.parse::<usize>().ok()
                })
                .map(|i| i + 1)
                .max()
                .unwrap_or(0),
            Err(_) => 0,
        };
        vec![[0xff; 32]; count.min(MAX_CHUNKS)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(rv: u64, content: &str, keys: &[(&str, &str)]) -> KnownData {
        KnownData {
            resource_version: rv,
            content: content.into(),
            key_hashes: keys.iter().map(|(k, h)| (k.to_string(), h.to_string())).collect(),
            keys_untracked: false,
        }
    }

    fn key(byte: u8) -> HashKey {
        HashKey::new(&[byte; 32]).unwrap()
    }

    #[test]
    fn entries_round_trip_through_sealed_chunks_and_only_their_version_matches() {
        let mut writer = ChunkWriter::new();
        let sha = "0123456789abcdef0123456789abcdef01234567";
        writer.push("shop", "db", &known(41, "aa", &[("user", "u1"), ("password", sha)]));
        writer.push("shop", "tls", &known(7, "bb", &[]));
        writer.push("shop", "one", &known(8, sha, &[("config.yaml", sha)]));
        let untracked = KnownData { keys_untracked: true, ..known(9, "cc", &[]) };
        writer.push("web", "big", &untracked);
        let chunks = writer.finish();
        assert_eq!(chunks.len(), 1);
        let sealing = LedgerKey::new(&key(1), SourceKind::Secret);
        let sealed = sealing.seal(chunks[0].clone());
        let mut index = LedgerIndex::default();
        index.read_chunk(&sealing.open(&sealed).unwrap()).unwrap();
        assert_eq!(index.len(), 4);
        assert_eq!(
            index.known("shop", "db", 41),
            Some(&known(41, "aa", &[("user", "u1"), ("password", sha)]))
        );
        assert_eq!(index.known("shop", "one", 8), Some(&known(8, sha, &[("config.yaml", sha)])));
        // A SHA-1 and a one-key source's key take 20 bytes and a name.
        let mut one = ChunkWriter::new();
        one.push("shop", "one", &known(8, sha, &[("config.yaml", sha)]));
        assert!(one.finish()[0].len() < 8 + 1 + 5 + 4 + 2 + 21 + 12, "compact");
        assert_eq!(index.known("web", "big", 9), Some(&untracked));
        // Another version of the object: its data may differ, so nothing is known.
        assert_eq!(index.known("shop", "db", 42), None);
        assert_eq!(index.known("web", "db", 41), None);
    }

    #[test]
    fn a_chunk_opens_only_with_its_key_and_kind() {
        let plain = ChunkWriter::new().finish().remove(0);
        let secrets = LedgerKey::new(&key(1), SourceKind::Secret);
        let sealed = secrets.seal(plain.clone());
        assert_eq!(secrets.open(&sealed).unwrap(), plain);
        assert!(LedgerKey::new(&key(2), SourceKind::Secret).open(&sealed).is_err());
        assert!(LedgerKey::new(&key(1), SourceKind::ConfigMap).open(&sealed).is_err());
        let mut edited = sealed.clone();
        *edited.last_mut().unwrap() ^= 1;
        assert!(secrets.open(&edited).is_err());
        assert!(secrets.open(&sealed[..5]).is_err());
        // Sealed twice, never the same bytes (a fresh nonce each time).
        assert_ne!(secrets.seal(plain.clone()), sealed);
    }

    #[test]
    fn large_ledgers_split_into_chunks_that_read_on_their_own() {
        let mut writer = ChunkWriter::new();
        let hash = "0123456789abcdef0123456789abcdef01234567";
        for i in 0..30_000u64 {
            writer.push(
                &format!("ns-{}", i / 100),
                &format!("source-{i}"),
                &known(i + 1, hash, &[]),
            );
        }
        let chunks = writer.finish();
        assert!(chunks.len() > 1, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|c| c.len() <= CHUNK_BYTES + 1024));
        let mut index = LedgerIndex::default();
        // The last chunk alone: its first entry names its namespace.
        index.read_chunk(chunks.last().unwrap()).unwrap();
        assert!(index.known("ns-299", "source-29999", 30_000).is_some());
        for chunk in &chunks {
            index.read_chunk(chunk).unwrap();
        }
        assert_eq!(index.len(), 30_000);
    }

    #[test]
    fn hostile_chunks_are_errors_not_panics_or_huge_allocations() {
        let mut writer = ChunkWriter::new();
        writer.push("ns", "a", &known(1, "h", &[("k", "v")]));
        let good = writer.finish().remove(0);
        // Every truncation fails cleanly.
        for cut in 0..good.len() {
            assert!(LedgerIndex::default().read_chunk(&good[..cut]).is_err(), "cut at {cut}");
        }
        // A count of entries far beyond the bytes.
        let mut lying = good.clone();
        lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            LedgerIndex::default().read_chunk(&lying),
            Err(LedgerError("more entries than bytes"))
        );
        // A string length far beyond the bytes.
        let mut long = [MAGIC.as_slice(), &1u32.to_be_bytes(), &[0]].concat();
        put_str(&mut long, "ns");
        put_str(&mut long, "a");
        put_varint(&mut long, 1);
        long.push(HASH_TEXT);
        put_varint(&mut long, u64::MAX);
        assert!(LedgerIndex::default().read_chunk(&long).is_err());
        // Trailing bytes.
        let trailing = [good.as_slice(), &[0]].concat();
        assert!(LedgerIndex::default().read_chunk(&trailing).is_err());
    }

    #[test]
    fn a_later_version_of_a_source_wins_across_chunks() {
        let write = |rv| {
            let mut w = ChunkWriter::new();
            w.push("ns", "a", &known(rv, &format!("h{rv}"), &[]));
            w.finish().remove(0)
        };
        let mut index = LedgerIndex::default();
        index.read_chunk(&write(5)).unwrap();
        index.read_chunk(&write(3)).unwrap();
        assert_eq!(index.known("ns", "a", 5).map(|k| k.content.as_str()), Some("h5"));
        assert_eq!(version_number(Some("123")), Some(123));
        assert_eq!(version_number(Some("abc")), None);
        assert_eq!(version_number(Some("0")), None);
    }
}
