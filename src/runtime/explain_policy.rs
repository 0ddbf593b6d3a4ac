//! `reloader explain rp/<name>`: reads, read-only and with the user's kubeconfig, the policy,
//! the namespace's workloads and sources (as [`super::explain`] reads them for one workload),
//! explains each target as `reloader explain <kind>/<name>` does, and hands the rest to
//! [`crate::decide::explain_policy::explain_policy`].

use crate::decide::explain_policy::{PolicyExplanation, PolicyView, explain_policy};
use crate::decide::selection::SelectionInputs;
use crate::model::workload::WorkloadKind;
use crate::runtime::engine::EngineConfig;
use crate::runtime::engine::write::info_of;
use crate::runtime::explain::{Context, Error, explain_object, workload_objects};

/// Explains ReloadPolicy `name` in `namespace` under the operator settings `config` (and the
/// rights of its ServiceAccount `account`, when given).
pub async fn run_policy(
    client: &kube::Client,
    config: &EngineConfig,
    namespace: &str,
    name: &str,
    account: Option<(String, String)>,
) -> Result<PolicyExplanation, Error> {
    let context = Context::read(client, config, namespace, account).await?;
    let Some((policy, hasher)) = context.policies.iter().find(|(p, _)| p.name == name).cloned()
    else {
        return Err(format!("no ReloadPolicy {namespace}/{name}").into());
    };
    let mut targets = Vec::new();
    let mut workloads = Vec::new();
    for kind in WorkloadKind::ALL {
        for obj in workload_objects(client, namespace, kind).await? {
            let Some(info) = info_of(kind, &obj, &config.keys) else { continue };
            if policy.target_for(&info).is_some() {
                targets.push(explain_object(client, config, &context, kind, &obj).await?);
            }
            let selection =
                SelectionInputs::of(&info.metadata_annotations, &info.template_annotations)
                    .parse(&config.keys);
            workloads.push((info, selection));
        }
    }
    let view = PolicyView {
        policy: &policy,
        hasher: hasher.as_ref(),
        status: context.statuses.get(name),
        sources: &context.sources,
        workloads: &workloads,
        policies: &context.policies,
        auto_reload_all: config.auto_reload_all,
    };
    Ok(explain_policy(&view, targets))
}
