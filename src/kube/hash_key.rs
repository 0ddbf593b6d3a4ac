//! The key of keyed hashes (`--hash-mode hmac-sha256`, ReloadPolicy `hashMode: HMAC-SHA256`):
//! 32 random bytes in a Secret, written once and reused, so restarts and replicas write the
//! same values. The Helm chart creates the Secret empty and labelled, and the operator fills it
//! in (`get` and `update` on that name are all it needs); without the chart, the operator
//! creates it when it may. Without `--enable-ha` any replica may write it (a lost race is a 409
//! and a second read); with it only the leader does, and standbys read it.
//!
//! A Secret is used only when it carries [`KEY_LABEL`] or the operator's managed-by label, so
//! a Secret that happens to have the name is not taken for a key. Once loaded, the key is
//! re-read every [`RECHECK`]: a change is reported (it would silently re-roll every keyed
//! workload), never adopted until a restart. The key is never logged: errors and messages
//! name the Secret, never its data.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::decide::hash::{HashKey, HashKeyError, Hasher};
use crate::model::workload::HashMode;

/// The data key holding the key bytes.
pub const DATA_KEY: &str = "key";
/// Field manager of the Secret's creation.
pub const FIELD_MANAGER: &str = "reloader.rs/hash-key";
/// The label that marks a Secret as the key's (the chart sets it on the Secret it creates).
pub const KEY_LABEL: &str = "reloader.rs/hash-key";
/// How often a loaded key's Secret is read again to notice changes.
pub const RECHECK: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read or create the hash key Secret {secret}: {source}")]
    Api {
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("the hash key Secret {secret} has no usable data key {DATA_KEY:?}: {source}")]
    Invalid {
        secret: String,
        #[source]
        source: HashKeyError,
    },
    #[error("cannot generate a hash key: {0}")]
    Generate(#[source] HashKeyError),
    #[error(
        "the Secret {secret} is not marked as the hash key (label {KEY_LABEL}=true or \
         app.kubernetes.io/managed-by=reloader); not using it"
    )]
    Unmarked { secret: String },
}

/// Whether `secret` was made to hold the key (by the chart or by the operator).
fn is_marked(secret: &Secret) -> bool {
    let labels = secret.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(KEY_LABEL) == Some("true") || label("app.kubernetes.io/managed-by") == Some("reloader")
}

/// Where the key is, and whether it is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// Not loaded yet (a standby waiting for the leader to create it, or the first attempt).
    Pending,
    Loaded(HashKey),
    /// The last attempt failed: why (names the Secret, never the key).
    Unavailable(String),
}

/// The shared slot the engine reads the key from; changes wake its watchers.
#[derive(Debug)]
pub struct KeySlot {
    pub namespace: String,
    pub name: String,
    state: watch::Sender<KeyState>,
}

impl KeySlot {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            state: watch::channel(KeyState::Pending).0,
        }
    }

    /// `namespace/name` of the Secret.
    pub fn secret(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn state(&self) -> KeyState {
        self.state.borrow().clone()
    }

    /// The key, when it is loaded.
    pub fn loaded(&self) -> Option<HashKey> {
        match &*self.state.borrow() {
            KeyState::Loaded(key) => Some(key.clone()),
            _ => None,
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<KeyState> {
        self.state.subscribe()
    }

    pub fn install(&self, key: HashKey) {
        self.state.send_replace(KeyState::Loaded(key));
    }

    /// No key is looked for (policy mode off, annotation mode on SHA-1): said so, so that what
    /// waits for the key to be settled (the pending-Job records' seal) does not wait for it.
    pub fn not_used(&self) {
        self.fail("no hash key is used: policy mode is off and --hash-mode is sha1".into());
    }

    /// Resolves once the key is loaded or known unavailable, or after `at_most`.
    pub async fn settled(&self, at_most: std::time::Duration) {
        let mut state = self.subscribe();
        let _ = tokio::time::timeout(at_most, state.wait_for(|s| *s != KeyState::Pending)).await;
    }

    fn fail(&self, reason: String) {
        self.state.send_if_modified(|s| match s {
            KeyState::Loaded(_) => false,
            _ if *s == KeyState::Unavailable(reason.clone()) => false,
            _ => {
                *s = KeyState::Unavailable(reason);
                true
            }
        });
    }

    /// The hasher for `mode`, or why it cannot be had yet (never a silent fall-back to SHA-1).
    pub fn hasher(&self, mode: HashMode) -> Result<Hasher, String> {
        match (mode, self.state()) {
            (HashMode::Sha1, _) => Ok(Hasher::Sha1),
            (HashMode::HmacSha256, KeyState::Loaded(key)) => Ok(Hasher::HmacSha256(key)),
            (HashMode::HmacSha256, KeyState::Pending) => {
                Err(format!("waiting for the hash key Secret {}", self.secret()))
            }
            (HashMode::HmacSha256, KeyState::Unavailable(why)) => Err(why),
        }
    }

    /// One attempt: read the Secret; when it is absent and `create`, create it with a fresh
    /// key (a 409 means another replica won the race: read theirs). Ok(false): absent, not
    /// created.
    pub async fn load_once(&self, client: &Client, create: bool) -> Result<bool, KeyError> {
        let result = self.try_load(client, create).await;
        if let Err(e) = &result {
            self.fail(e.to_string());
        }
        result
    }

    async fn try_load(&self, client: &Client, create: bool) -> Result<bool, KeyError> {
        let api: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let api_error = |source| KeyError::Api { secret: self.secret(), source };
        let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let stored = match api.get_opt(&self.name).await.map_err(api_error)? {
            Some(s) if !is_marked(&s) => return Err(KeyError::Unmarked { secret: self.secret() }),
            Some(s) if key_bytes(&s).is_some() => s,
            Some(_) | None if !create => return Ok(false),
            Some(mut placeholder) => {
                // The chart's empty Secret: fill it in, guarded by the version read (a 409
                // means another replica did first: read theirs).
                let bytes = HashKey::generate().map_err(KeyError::Generate)?;
                placeholder.data =
                    Some(BTreeMap::from([(DATA_KEY.to_string(), ByteString(bytes))]));
                match api.replace(&self.name, &params, &placeholder).await {
                    Ok(filled) => {
                        info!(secret = %self.secret(), "wrote a new key into the hash key Secret");
                        filled
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        api.get(&self.name).await.map_err(api_error)?
                    }
                    Err(e) => return Err(api_error(e)),
                }
            }
            None => {
                let bytes = HashKey::generate().map_err(KeyError::Generate)?;
                let secret = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(self.name.clone()),
                        labels: Some(BTreeMap::from([
                            ("app.kubernetes.io/managed-by".to_string(), "reloader".to_string()),
                            (KEY_LABEL.to_string(), "true".to_string()),
                        ])),
                        ..Default::default()
                    },
                    type_: Some("Opaque".into()),
                    data: Some(BTreeMap::from([(DATA_KEY.to_string(), ByteString(bytes))])),
                    ..Default::default()
                };
                match api.create(&params, &secret).await {
                    Ok(created) => {
                        info!(secret = %self.secret(), "created the hash key Secret");
                        created
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        api.get(&self.name).await.map_err(api_error)?
                    }
                    Err(e) => return Err(api_error(e)),
                }
            }
        };
        let key = HashKey::new(key_bytes(&stored).unwrap_or_default())
            .map_err(|source| KeyError::Invalid { secret: self.secret(), source })?;
        self.install(key);
        Ok(true)
    }

    /// Reads the Secret again: `Ok(true)` when it still holds the loaded key.
    pub async fn still_current(&self, client: &Client) -> Result<bool, KeyError> {
        let KeyState::Loaded(loaded) = self.state() else { return Ok(false) };
        let api: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let stored = api
            .get_opt(&self.name)
            .await
            .map_err(|source| KeyError::Api { secret: self.secret(), source })?;
        let now = stored.as_ref().and_then(key_bytes).and_then(|b| HashKey::new(b).ok());
        Ok(now.as_ref() == Some(&loaded))
    }
}

/// The key bytes of a Secret, when it has any.
fn key_bytes(secret: &Secret) -> Option<&[u8]> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .map(|b| b.0.as_slice())
        .filter(|b| !b.is_empty())
}

/// Loads the key until it is loaded or `stop`: creating it when this replica may write
/// (`leadership`), otherwise waiting for it to appear. A failure is logged once, as a warning.
pub async fn maintain(
    client: Client,
    slot: Arc<KeySlot>,
    mut leadership: watch::Receiver<bool>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let mut warned = false;
    let mut pause = Duration::from_secs(1);
    let mut election_over = false;
    loop {
        if matches!(slot.state(), KeyState::Loaded(_)) {
            break;
        }
        let leading = !election_over && *leadership.borrow_and_update();
        match slot.load_once(&client, leading).await {
            Ok(true) => {
                info!(secret = %slot.secret(), "loaded the hash key");
                break;
            }
            Ok(false) => debug!(secret = %slot.secret(), "no hash key yet; the leader creates it"),
            Err(e) if !warned => {
                warned = true;
                warn!(error = %e, "hash key unavailable: keyed hashes (hashMode HMAC-SHA256) wait for it; will retry");
            }
            Err(e) => debug!(error = %e, "hash key still unavailable"),
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(pause) => {}
            changed = leadership.changed(), if !election_over => election_over = changed.is_err(),
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
    // Loaded: watch for changes, and say so once per change.
    let mut reported = false;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(RECHECK) => {}
        }
        match slot.still_current(&client).await {
            Ok(true) => reported = false,
            Ok(false) if !reported => {
                reported = true;
                warn!(secret = %slot.secret(), "the hash key Secret no longer holds the key in use (changed or deleted); the operator keeps its key until restarted, when every keyed workload rolls once");
            }
            Ok(false) => {}
            Err(e) => debug!(error = %e, "cannot re-read the hash key Secret"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_keys_only_when_loaded_and_says_why_not() {
        let slot = KeySlot::new("ops", "reloader-hash-key");
        assert_eq!(slot.hasher(HashMode::Sha1), Ok(Hasher::Sha1));
        let pending = slot.hasher(HashMode::HmacSha256).unwrap_err();
        assert!(pending.contains("ops/reloader-hash-key"), "{pending}");
        slot.fail("forbidden: ops/reloader-hash-key".into());
        assert_eq!(
            slot.hasher(HashMode::HmacSha256),
            Err("forbidden: ops/reloader-hash-key".to_string())
        );
        let key = HashKey::new(&[3u8; 32]).unwrap();
        slot.install(key.clone());
        assert_eq!(slot.hasher(HashMode::HmacSha256), Ok(Hasher::HmacSha256(key)));
        // A later failure never unloads a key.
        slot.fail("gone".into());
        assert!(matches!(slot.state(), KeyState::Loaded(_)));
    }
}
