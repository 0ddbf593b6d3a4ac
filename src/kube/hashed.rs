//! Secrets and ConfigMaps as the operator takes them in: metadata, the number of data keys and
//! the data's hashes. The data is hashed where it was decoded (in the protobuf list page or
//! watch frame, or the JSON object) and never copied or kept: a 50,000-Secret list is 400 MB
//! of values the operator would otherwise allocate, copy and free once each, only to hash.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use super::protobuf::{self, ProtoObject, SourceMessage};
use crate::decide::hash::{self, SourceHashes};
use crate::model::limits::MAX_KEY_HASHES;
use crate::model::source::KnownData;

/// A source of kind `K` with its data replaced by the data's hashes.
#[derive(Debug, Clone)]
pub struct Hashed<K> {
    pub metadata: ObjectMeta,
    /// Data keys, binary ones included.
    pub key_count: usize,
    /// The content hash, and each key's hash unless there are more than [`MAX_KEY_HASHES`].
    pub hashes: SourceHashes,
    kind: PhantomData<fn() -> K>,
}

impl<K> Hashed<K> {
    fn new(
        metadata: ObjectMeta,
        key_count: usize,
        hash: impl FnOnce(bool) -> SourceHashes,
    ) -> Self {
        let hashes = hash(key_count <= MAX_KEY_HASHES);
        Hashed { metadata, key_count, hashes, kind: PhantomData }
    }

    /// The source as its metadata says now and the source ledger knew its data at the same
    /// resourceVersion (see `kube::ledger`).
    pub fn recalled(metadata: ObjectMeta, known: &KnownData) -> Self {
        let key_count =
            if known.keys_untracked { MAX_KEY_HASHES + 1 } else { known.key_hashes.len() };
        let hashes = SourceHashes {
            content: known.content.clone(),
            keys: known.key_hashes.iter().cloned().collect(),
        };
        Hashed { metadata, key_count, hashes, kind: PhantomData }
    }

    /// More keys than are hashed one by one.
    pub fn keys_untracked(&self) -> bool {
        self.key_count > MAX_KEY_HASHES
    }
}

/// A kind whose objects are taken in as [`Hashed`].
pub trait HashedKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + DeserializeOwned + Clone + Debug
{
    /// From the kind's protobuf message (without envelope).
    fn decode_hashed(buf: &[u8]) -> protobuf::Result<Hashed<Self>>;
    /// From a decoded object (the JSON path).
    fn into_hashed(self) -> Hashed<Self>;
}

impl HashedKind for Secret {
    fn decode_hashed(buf: &[u8]) -> protobuf::Result<Hashed<Self>> {
        let SourceMessage { metadata, data, .. } = SourceMessage::secret(buf)?;
        let keys = data.len();
        Ok(Hashed::new(metadata, keys, |per_key| hash::secret_entry_hashes(data, per_key)))
    }

    fn into_hashed(self) -> Hashed<Self> {
        let keys = self.data.as_ref().map_or(0, BTreeMap::len);
        let data = self.data;
        Hashed::new(self.metadata, keys, |per_key| hash::secret_hashes(data.as_ref(), per_key))
    }
}

impl HashedKind for ConfigMap {
    fn decode_hashed(buf: &[u8]) -> protobuf::Result<Hashed<Self>> {
        let SourceMessage { metadata, data, binary_data } = SourceMessage::config_map(buf)?;
        let keys = data.len() + binary_data.len();
        Ok(Hashed::new(metadata, keys, |per_key| {
            hash::configmap_entry_hashes(data, binary_data, per_key)
        }))
    }

    fn into_hashed(self) -> Hashed<Self> {
        let keys = self.data.as_ref().map_or(0, BTreeMap::len)
            + self.binary_data.as_ref().map_or(0, BTreeMap::len);
        let (data, binary) = (self.data, self.binary_data);
        Hashed::new(self.metadata, keys, |per_key| {
            hash::configmap_hashes(data.as_ref(), binary.as_ref(), per_key)
        })
    }
}

impl<K: HashedKind> ProtoObject for Hashed<K> {
    fn decode_message(buf: &[u8]) -> protobuf::Result<Self> {
        K::decode_hashed(buf)
    }
}

impl<'de, K: HashedKind> Deserialize<'de> for Hashed<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(deserializer).map(K::into_hashed)
    }
}

impl<K: HashedKind> Resource for Hashed<K> {
    resource_type_of!(K);

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn a_json_object_and_its_protobuf_message_hash_alike() {
        // Secret: metadata (name), two data entries out of order.
        let entry = |k: &str, v: &[u8]| {
            let mut e = vec![0x0a, k.len() as u8];
            e.extend_from_slice(k.as_bytes());
            e.extend_from_slice(&[0x12, v.len() as u8]);
            e.extend_from_slice(v);
            let mut field = vec![0x12, e.len() as u8];
            field.extend(e);
            field
        };
        let mut message = vec![0x0a, 0x04, 0x0a, 0x02, b'd', b'b'];
        message.extend(entry("user", b"app"));
        message.extend(entry("password", b"\x00\xff"));
        let decoded = Secret::decode_hashed(&message).unwrap();
        let json = Secret {
            metadata: ObjectMeta { name: Some("db".into()), ..ObjectMeta::default() },
            data: Some(BTreeMap::from([
                ("user".to_string(), ByteString(b"app".to_vec())),
                ("password".to_string(), ByteString(b"\x00\xff".to_vec())),
            ])),
            ..Secret::default()
        }
        .into_hashed();
        assert_eq!(decoded.metadata.name.as_deref(), Some("db"));
        assert_eq!((decoded.key_count, &decoded.hashes), (2, &json.hashes));
        assert_eq!(decoded.hashes.keys.len(), 2);
        // A repeated key counts once, its last value (protobuf map semantics).
        message.extend(entry("user", b"other"));
        let repeated = Secret::decode_hashed(&message).unwrap();
        assert_eq!(repeated.key_count, 2);
        assert_ne!(repeated.hashes.keys["user"], decoded.hashes.keys["user"]);
        assert_eq!(repeated.hashes.keys["password"], decoded.hashes.keys["password"]);
    }

    #[test]
    fn past_the_key_limit_only_the_content_is_hashed() {
        let data: BTreeMap<String, String> =
            (0..=MAX_KEY_HASHES).map(|i| (format!("k{i}"), "v".to_string())).collect();
        let many = ConfigMap { data: Some(data), ..ConfigMap::default() }.into_hashed();
        assert!(many.keys_untracked());
        assert!(many.hashes.keys.is_empty());
        assert_eq!(many.hashes.content.len(), 40);
    }
}
