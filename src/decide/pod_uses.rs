//! How a pod spec uses its ConfigMaps, Secrets and SecretProviderClasses, in `reloader
//! explain`'s words. Reading only: which sources count is `WorkloadInfo`'s and the selection's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};

use crate::model::source::{SourceKind, SourceRef};

/// How a pod spec uses each source: `env`, `envFrom`, `volume`, `projected`, `csi`, and the
/// `init ` forms for init containers. Reading only; which sources count is `WorkloadInfo`'s.
pub fn uses(pod: &PodSpec) -> BTreeMap<SourceRef, BTreeSet<&'static str>> {
    let mut out: BTreeMap<SourceRef, BTreeSet<&'static str>> = BTreeMap::new();
    for c in &pod.containers {
        container_uses(c, ["env", "envFrom"], &mut out);
    }
    for c in pod.init_containers.iter().flatten() {
        container_uses(c, ["init env", "init envFrom"], &mut out);
    }
    for v in pod.volumes.iter().flatten() {
        volume_uses(v, &mut out);
    }
    out
}

fn container_uses(
    c: &Container,
    [env, env_from]: [&'static str; 2],
    out: &mut BTreeMap<SourceRef, BTreeSet<&'static str>>,
) {
    let mut add = |kind, name: &str, how| {
        out.entry(SourceRef::new(kind, name)).or_default().insert(how);
    };
    for from in c.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
        if let Some(r) = &from.config_map_key_ref {
            add(SourceKind::ConfigMap, &r.name, env);
        }
        if let Some(r) = &from.secret_key_ref {
            add(SourceKind::Secret, &r.name, env);
        }
    }
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.config_map_ref {
            add(SourceKind::ConfigMap, &r.name, env_from);
        }
        if let Some(r) = &e.secret_ref {
            add(SourceKind::Secret, &r.name, env_from);
        }
    }
}

fn volume_uses(v: &Volume, out: &mut BTreeMap<SourceRef, BTreeSet<&'static str>>) {
    let mut add = |kind, name: &str, how| {
        out.entry(SourceRef::new(kind, name)).or_default().insert(how);
    };
    if let Some(cm) = &v.config_map {
        add(SourceKind::ConfigMap, &cm.name, "volume");
    }
    if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
        add(SourceKind::Secret, name, "volume");
    }
    for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
        if let Some(cm) = &p.config_map {
            add(SourceKind::ConfigMap, &cm.name, "projected");
        }
        if let Some(s) = &p.secret {
            add(SourceKind::Secret, &s.name, "projected");
        }
    }
    let csi = v.csi.as_ref().and_then(|c| c.volume_attributes.as_ref());
    if let Some(spc) = csi.and_then(|a| a.get("secretProviderClass")) {
        add(SourceKind::SecretProviderClass, spc, "csi");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }

    #[test]
    fn uses_name_every_way_a_pod_spec_takes_a_source() {
        let pod: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "app",
                "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                "envFrom": [{"configMapRef": {"name": "c"}}]}],
            "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "c"}}]}],
            "volumes": [
                {"name": "v", "configMap": {"name": "c"}},
                {"name": "p", "projected": {"sources": [{"secret": {"name": "s"}}]}},
                {"name": "x", "csi": {"driver": "d", "volumeAttributes": {"secretProviderClass": "spc"}}}
            ]
        }))
        .unwrap();
        let got = uses(&pod);
        let set = |v: &[&'static str]| v.iter().copied().collect::<BTreeSet<_>>();
        assert_eq!(got[&cm("c")], set(&["envFrom", "init envFrom", "volume"]));
        assert_eq!(got[&SourceRef::new(SourceKind::Secret, "s")], set(&["env", "projected"]));
        assert_eq!(got[&SourceRef::new(SourceKind::SecretProviderClass, "spc")], set(&["csi"]));
    }
}
