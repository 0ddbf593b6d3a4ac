//! Which entries of a ReloadPolicy are targets of kind `Pod` and whether they can be carried
//! out: read where the policy is parsed once per change (`policy_plan::ActivePolicy`) and
//! where its status and explanation are made (`pod_targets` says the rest of what these
//! targets do).

use crate::model::policy::{PolicyTargetKind, ReloadPolicySpec};
use crate::model::strategy::Strategy;

/// Why the entries of kind `Pod` of `spec` cannot be carried out, each naming the entry and
/// the rule (the CRD refuses them; a policy stored before its rules were installed may hold
/// them, and is then told so in its status instead).
pub fn problems(spec: &ReloadPolicySpec) -> Vec<String> {
    let mut out = Vec::new();
    for (index, target) in spec.targets.iter().enumerate() {
        if target.kind != PolicyTargetKind::Pod {
            continue;
        }
        if target.name.is_some() {
            out.push(format!(
                "spec.targets[{index}]: a target of kind Pod selects pods by selector; name is \
                 not allowed"
            ));
        }
        if spec.strategy != Strategy::Evict {
            let strategy = serde_json::to_value(spec.strategy).unwrap_or_default();
            out.push(format!(
                "spec.targets[{index}]: targets of kind Pod are restarted by evicting them: set \
                 strategy: Evict (the policy's strategy is {})",
                strategy.as_str().unwrap_or_default()
            ));
        }
    }
    out
}

/// The entries of kind `Pod` of `spec`, as `spec.targets[i]`.
pub fn pod_entries(spec: &ReloadPolicySpec) -> Vec<String> {
    let pods = spec.targets.iter().enumerate().filter(|(_, t)| t.kind == PolicyTargetKind::Pod);
    pods.map(|(index, _)| format!("spec.targets[{index}]")).collect()
}
