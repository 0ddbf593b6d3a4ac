//! What a workload's status says of its rollout, read from the object as a few numbers (the
//! workload controller's own report; nothing here looks at pods). Judged by
//! `decide::outcome::verdict`.

/// A workload's rollout as its controller reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutProgress {
    /// `metadata.generation`: bumped by every spec change, our reload included.
    pub generation: i64,
    /// `status.observedGeneration`: the generation the controller has acted on.
    pub observed_generation: i64,
    pub counts: Counts,
}

/// The kind-specific part of [`RolloutProgress`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Counts {
    /// Nothing to follow: the kind does not roll pods by itself (CronJob, Job, a StatefulSet
    /// or DaemonSet with `updateStrategy: OnDelete`, a DeploymentConfig).
    #[default]
    NotFollowed,
    /// Pods (a DaemonSet's: nodes) the controller replaces, kubectl's `rollout status` view.
    Pods {
        /// Wanted (`spec.replicas`; a DaemonSet's `desiredNumberScheduled`).
        desired: i32,
        /// Of those, how many must run the new template (a StatefulSet's partition keeps the
        /// lower ordinals on the old one).
        to_update: i32,
        /// Running the new template.
        updated: i32,
        /// Available (Deployment, DaemonSet) or ready (StatefulSet).
        available: i32,
        /// All pods, old and new (a Deployment's `status.replicas`): old ones still terminating
        /// when above `updated`.
        total: i32,
        /// A StatefulSet whose current revision is not yet its update revision.
        revision_pending: bool,
        /// The controller gave up: a Deployment's `Progressing` condition with reason
        /// `ProgressDeadlineExceeded` (its message).
        deadline_exceeded: Option<String>,
    },
    /// An Argo Rollout's `status.phase`.
    Phase { phase: ArgoPhase, message: Option<String> },
}

/// An Argo Rollout's phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ArgoPhase {
    Healthy,
    #[default]
    Progressing,
    Paused,
    Degraded,
}

impl ArgoPhase {
    pub fn parse(s: &str) -> Self {
        match s {
            "Healthy" => ArgoPhase::Healthy,
            "Paused" => ArgoPhase::Paused,
            "Degraded" => ArgoPhase::Degraded,
            _ => ArgoPhase::Progressing,
        }
    }
}

/// Where a rollout the operator started stands, as reported in Events, metrics and a policy's
/// status (`targets[].rollout`, the `RolledOut` condition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutState {
    Progressing,
    RolledOut,
    Failed,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Progressing => "Progressing",
            RolloutState::RolledOut => "RolledOut",
            RolloutState::Failed => "Failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Progressing" => Some(RolloutState::Progressing),
            "RolledOut" => Some(RolloutState::RolledOut),
            "Failed" => Some(RolloutState::Failed),
            _ => None,
        }
    }
}

/// Bounds a controller's message before it is kept (it comes from the cluster: any size).
pub fn bounded_message(s: &str) -> String {
    const MAX: usize = 512;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_bounded_on_a_char_boundary() {
        assert_eq!(bounded_message("short"), "short");
        let long = "é".repeat(400);
        let cut = bounded_message(&long);
        assert!(cut.len() <= 512 + "…".len());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn argo_phases_parse_and_unknown_is_progressing() {
        assert_eq!(ArgoPhase::parse("Healthy"), ArgoPhase::Healthy);
        assert_eq!(ArgoPhase::parse("Degraded"), ArgoPhase::Degraded);
        assert_eq!(ArgoPhase::parse("Paused"), ArgoPhase::Paused);
        assert_eq!(ArgoPhase::parse("whatever"), ArgoPhase::Progressing);
    }
}

mod read {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};

    impl RolloutProgress {
        /// A Deployment's: pods wanted, updated, available and still there; its own progress
        /// deadline.
        pub fn of_deployment(d: &Deployment) -> Self {
            let status = d.status.clone().unwrap_or_default();
            let desired = d.spec.replicas.unwrap_or(1);
            let deadline_exceeded =
                status.conditions.as_deref().unwrap_or_default().iter().find_map(|c| {
                    (c.type_.as_deref() == Some("Progressing")
                        && c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
                    .then(|| {
                        bounded_message(
                            c.message.as_deref().unwrap_or("progress deadline exceeded"),
                        )
                    })
                });
            RolloutProgress {
                generation: d.metadata.generation.unwrap_or(0),
                observed_generation: status.observed_generation.unwrap_or(0),
                counts: Counts::Pods {
                    desired,
                    to_update: desired,
                    updated: status.updated_replicas.unwrap_or(0),
                    available: status.available_replicas.unwrap_or(0),
                    total: status.replicas.unwrap_or(0),
                    revision_pending: false,
                    deadline_exceeded,
                },
            }
        }

        /// A StatefulSet's: ready pods, the updated ones below its partition, its revisions.
        /// `OnDelete` replaces no pod by itself: not followed.
        pub fn of_stateful_set(s: &StatefulSet) -> Self {
            let strategy = s.spec.update_strategy.as_ref();
            let generation = s.metadata.generation.unwrap_or(0);
            let status = s.status.clone().unwrap_or_default();
            let observed_generation = status.observed_generation.unwrap_or(0);
            if strategy.and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
                return RolloutProgress {
                    generation,
                    observed_generation,
                    counts: Counts::NotFollowed,
                };
            }
            let desired = s.spec.replicas.unwrap_or(1).max(0);
            let partition = strategy
                .and_then(|u| u.rolling_update.as_ref())
                .and_then(|r| r.partition)
                .unwrap_or(0)
                .clamp(0, desired);
            let partitioned = partition > 0;
            RolloutProgress {
                generation,
                observed_generation,
                counts: Counts::Pods {
                    desired,
                    to_update: desired - partition,
                    updated: status.updated_replicas.unwrap_or(0),
                    available: status.ready_replicas.unwrap_or(0),
                    // A StatefulSet replaces pods in place: no old pods beside the new ones.
                    total: status.updated_replicas.unwrap_or(0),
                    revision_pending: !partitioned
                        && status.update_revision.is_some()
                        && status.update_revision != status.current_revision,
                    deadline_exceeded: None,
                },
            }
        }

        /// A DaemonSet's: nodes that should run it, updated and available there. `OnDelete`:
        /// not followed.
        pub fn of_daemon_set(d: &DaemonSet) -> Self {
            let generation = d.metadata.generation.unwrap_or(0);
            let status = d.status.clone().unwrap_or_default();
            let observed_generation = status.observed_generation.unwrap_or(0);
            let strategy = d.spec.update_strategy.as_ref();
            if strategy.and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
                return RolloutProgress {
                    generation,
                    observed_generation,
                    counts: Counts::NotFollowed,
                };
            }
            let desired = status.desired_number_scheduled;
            let updated = status.updated_number_scheduled.unwrap_or(0);
            RolloutProgress {
                generation,
                observed_generation,
                counts: Counts::Pods {
                    desired,
                    to_update: desired,
                    updated,
                    available: status.number_available.unwrap_or(0),
                    total: updated,
                    revision_pending: false,
                    deadline_exceeded: None,
                },
            }
        }

        /// An Argo Rollout's, from its JSON: `status.phase`, `status.message` and
        /// `status.observedGeneration` (a string in Argo's API).
        pub fn of_argo_rollout(
            generation: Option<i64>,
            status: Option<&serde_json::Value>,
        ) -> Self {
            let field = |name: &str| status.and_then(|s| s.get(name));
            let observed_generation = match field("observedGeneration") {
                Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
                Some(v) => v.as_i64().unwrap_or(0),
                None => 0,
            };
            RolloutProgress {
                generation: generation.unwrap_or(0),
                observed_generation,
                counts: Counts::Phase {
                    phase: ArgoPhase::parse(field("phase").and_then(|p| p.as_str()).unwrap_or("")),
                    message: field("message")
                        .and_then(|m| m.as_str())
                        .filter(|m| !m.is_empty())
                        .map(bounded_message),
                },
            }
        }
    }
}
