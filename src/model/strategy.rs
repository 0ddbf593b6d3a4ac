//! The one reload strategy of both modes: how a change rolls a workload. Annotation mode takes it
//! from `--reload-strategy` (stakater/Reloader's values: `env-vars`, `annotations`, `restart`), a
//! ReloadPolicy from `spec.strategy` (the CRD's values: `EnvVar`, `Annotation`, `Restart`); both
//! spellings are kept as they are for compatibility. And how an Argo Rollout is restarted
//! ([`ArgoRestart`]): through its template, or its own `spec.restartAt`.

use serde::{Deserialize, Serialize};

use crate::model::workload::UnknownValue;

// No doc comments on the variants: schemars would turn the CRD's plain `enum` into a `oneOf`.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum Strategy {
    // Set `STAKATER_<NAME>_<TYPE>` to the source's hash in the pod template.
    #[default]
    #[serde(rename = "EnvVar")]
    EnvVars,
    // Set the `reloader.stakater.com/last-reloaded-from` pod-template annotation.
    #[serde(rename = "Annotation")]
    Annotations,
    // Set `kubectl.kubernetes.io/restartedAt`, as `kubectl rollout restart` does.
    Restart,
    // Restart the pods one by one through the Eviction API, never writing the template
    // (`decide::evict`; Deployment, StatefulSet, DaemonSet, other kinds as `Restart`). Chosen
    // per workload (`reloader.rs/rollout-strategy: evict`) or per policy, not by the flag.
    Evict,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::EnvVars, Strategy::Annotations, Strategy::Restart];

    /// The flag value naming the strategy (`--reload-strategy`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::EnvVars => "env-vars",
            Strategy::Annotations => "annotations",
            Strategy::Restart => "restart",
            Strategy::Evict => "evict",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Strategy {
    type Err = UnknownValue;
    fn from_str(text: &str) -> Result<Self, UnknownValue> {
        Self::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| UnknownValue(text.into()))
    }
}

/// How an Argo Rollout is reloaded: ReloadPolicy `spec.argoRestart`, annotation
/// `reloader.rs/argo-restart` (`template`, `restart-at`) in annotation mode. Other kinds ignore it.
// No doc comments on the variants (see `Strategy`).
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum ArgoRestart {
    // The strategy's write to the pod template: a new revision.
    #[default]
    Template,
    // `spec.restartAt` set to now, as `kubectl argo rollouts restart` does: the pods restart,
    // the template stays.
    RestartAt,
}

impl ArgoRestart {
    pub const ALL: [ArgoRestart; 2] = [ArgoRestart::Template, ArgoRestart::RestartAt];

    /// The annotation value naming it.
    pub fn as_str(self) -> &'static str {
        match self {
            ArgoRestart::Template => "template",
            ArgoRestart::RestartAt => "restart-at",
        }
    }
}

impl std::str::FromStr for ArgoRestart {
    type Err = UnknownValue;
    fn from_str(text: &str) -> Result<Self, UnknownValue> {
        Self::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| UnknownValue(text.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_and_crd_spellings_stay_as_they_are() {
        for (strategy, flag, crd) in [
            (Strategy::EnvVars, "env-vars", "EnvVar"),
            (Strategy::Annotations, "annotations", "Annotation"),
            (Strategy::Restart, "restart", "Restart"),
        ] {
            assert_eq!(strategy.as_str(), flag);
            assert_eq!(flag.parse::<Strategy>().unwrap(), strategy);
            assert_eq!(serde_json::to_value(strategy).unwrap(), crd);
            assert_eq!(serde_json::from_value::<Strategy>(crd.into()).unwrap(), strategy);
        }
        assert!("EnvVar".parse::<Strategy>().is_err(), "the flag takes the flag spelling only");
        assert!("evict".parse::<Strategy>().is_err(), "evict is chosen per workload, not by flag");
        assert_eq!(serde_json::to_value(Strategy::Evict).unwrap(), "Evict");
        assert!(serde_json::from_value::<Strategy>("env-vars".into()).is_err());
        assert_eq!(Strategy::default(), Strategy::EnvVars);
    }

    #[test]
    fn argo_restart_spellings() {
        for (restart, annotation, crd) in [
            (ArgoRestart::Template, "template", "Template"),
            (ArgoRestart::RestartAt, "restart-at", "RestartAt"),
        ] {
            assert_eq!(annotation.parse::<ArgoRestart>().unwrap(), restart);
            assert_eq!(serde_json::to_value(restart).unwrap(), crd);
        }
        assert!("RestartAt".parse::<ArgoRestart>().is_err());
        assert_eq!(ArgoRestart::default(), ArgoRestart::Template);
    }
}
