//! The Reloader annotation keys (renamable by flags, as in stakater/Reloader) and how their
//! values parse.

use crate::model::source::SourceKind;

/// Every annotation key the operator reads or writes in annotation mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationKeys {
    pub auto: String,
    pub configmap_auto: String,
    pub secret_auto: String,
    pub secret_provider_class_auto: String,
    pub configmap_reload: String,
    pub secret_reload: String,
    pub secret_provider_class_reload: String,
    pub search: String,
    pub search_match: String,
    pub ignore: String,
    pub configmap_exclude: String,
    pub secret_exclude: String,
    pub secret_provider_class_exclude: String,
    pub rollout_strategy: String,
    pub pause_period: String,
    pub paused_at: String,
    pub last_reloaded_from: String,
}

impl Default for AnnotationKeys {
    fn default() -> Self {
        Self {
            auto: "reloader.stakater.com/auto".into(),
            configmap_auto: "configmap.reloader.stakater.com/auto".into(),
            secret_auto: "secret.reloader.stakater.com/auto".into(),
            secret_provider_class_auto: "secretproviderclass.reloader.stakater.com/auto".into(),
            configmap_reload: "configmap.reloader.stakater.com/reload".into(),
            secret_reload: "secret.reloader.stakater.com/reload".into(),
            secret_provider_class_reload: "secretproviderclass.reloader.stakater.com/reload".into(),
            search: "reloader.stakater.com/search".into(),
            search_match: "reloader.stakater.com/match".into(),
            ignore: "reloader.stakater.com/ignore".into(),
            configmap_exclude: "configmaps.exclude.reloader.stakater.com/reload".into(),
            secret_exclude: "secrets.exclude.reloader.stakater.com/reload".into(),
            secret_provider_class_exclude:
                "secretproviderclasses.exclude.reloader.stakater.com/reload".into(),
            rollout_strategy: "reloader.stakater.com/rollout-strategy".into(),
            pause_period: "deployment.reloader.stakater.com/pause-period".into(),
            paused_at: "deployment.reloader.stakater.com/paused-at".into(),
            last_reloaded_from: "reloader.stakater.com/last-reloaded-from".into(),
        }
    }
}

impl AnnotationKeys {
    /// The typed auto key of a source kind (`configmap.reloader.stakater.com/auto`, ...).
    pub fn typed_auto(&self, kind: SourceKind) -> &str {
        match kind {
            SourceKind::ConfigMap => &self.configmap_auto,
            SourceKind::Secret => &self.secret_auto,
            SourceKind::SecretProviderClass => &self.secret_provider_class_auto,
        }
    }

    /// The named-reload key of a source kind (`configmap.reloader.stakater.com/reload`, ...).
    pub fn named_reload(&self, kind: SourceKind) -> &str {
        match kind {
            SourceKind::ConfigMap => &self.configmap_reload,
            SourceKind::Secret => &self.secret_reload,
            SourceKind::SecretProviderClass => &self.secret_provider_class_reload,
        }
    }

    /// The exclude key of a source kind (`configmaps.exclude.reloader.stakater.com/reload`, ...).
    pub fn exclude(&self, kind: SourceKind) -> &str {
        match kind {
            SourceKind::ConfigMap => &self.configmap_exclude,
            SourceKind::Secret => &self.secret_exclude,
            SourceKind::SecretProviderClass => &self.secret_provider_class_exclude,
        }
    }

    /// Keys worth keeping from a workload's metadata or pod-template annotations.
    pub fn workload_keys(&self) -> Vec<&str> {
        vec![
            &self.auto,
            &self.configmap_auto,
            &self.secret_auto,
            &self.secret_provider_class_auto,
            &self.configmap_reload,
            &self.secret_reload,
            &self.secret_provider_class_reload,
            &self.search,
            &self.configmap_exclude,
            &self.secret_exclude,
            &self.secret_provider_class_exclude,
            &self.rollout_strategy,
            &self.pause_period,
            &self.paused_at,
            &self.last_reloaded_from,
        ]
    }
}

/// Parses a boolean the way Go's `strconv.ParseBool` does (`1 t T TRUE true True`, and the
/// same for false); anything else is `None`.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Splits a comma list, trimming items and dropping empty ones.
pub fn comma_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_parse_bool_table() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", " true", "2", "on"] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn comma_lists_trim_and_skip_empties() {
        let items: Vec<_> = comma_list(" a, b ,,c ,").collect();
        assert_eq!(items, ["a", "b", "c"]);
    }

    #[test]
    fn per_kind_keys() {
        let k = AnnotationKeys::default();
        assert_eq!(k.typed_auto(SourceKind::Secret), "secret.reloader.stakater.com/auto");
        assert_eq!(k.named_reload(SourceKind::ConfigMap), "configmap.reloader.stakater.com/reload");
        assert_eq!(
            k.exclude(SourceKind::SecretProviderClass),
            "secretproviderclasses.exclude.reloader.stakater.com/reload"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_boolean_or_list_text_parses(text in ".{0,100}") {
            let _ = parse_bool(&text);
            proptest::prop_assert!(comma_list(&text).all(|i| !i.is_empty() && !i.contains(',')));
        }
    }
}
