//! What the operator's identity may do, and how each kind is followed as a result.
//!
//! Clusters that swap stakater/Reloader's image for this one keep Reloader's RBAC: workloads
//! may be listed and patched but not watched, CronJobs and Jobs not patched, and nothing is
//! granted on `events.k8s.io` or `reloader.rs`. Instead of finding that out through a retry
//! loop of refused requests, the operator asks the API server at start, at each resync and after
//! a refusal with SelfSubjectAccessReviews, one per right it would use (a review that fails is
//! unknown and asked again with backoff: see [`crate::decide::rights`]), and picks per kind and
//! namespace scope:
//!
//! - list and watch, both granted: the kind is watched into memory, as always
//!   ([`Follow::Watch`]);
//! - list without watch: the kind is listed in a source's namespace when that source changes,
//!   the way Reloader does, and nothing of it is kept afterwards ([`Follow::ListOnChange`],
//!   reported as degraded); also while an answer is unknown;
//! - no list, or no right to write it: the kind is skipped ([`Follow::Skip`]).
//!
//! Every missing right is said once: one log line naming the rule that grants it and one
//! `reloader_permission_missing` series. SelfSubjectAccessReview rather than
//! SelfSubjectRulesReview: the rules review is per namespace and may be incomplete (the API
//! server says so for webhook authorizers), the access review is exact for the one question.

use std::collections::HashMap;
use std::fmt;

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

/// A verb of the Kubernetes authorizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// An API resource as RBAC names it: group and plural (and a subresource).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    pub group: &'static str,
    pub plural: &'static str,
    pub subresource: Option<&'static str>,
}

impl Resource {
    pub const fn new(group: &'static str, plural: &'static str) -> Self {
        Resource { group, plural, subresource: None }
    }

    pub const fn sub(self, subresource: &'static str) -> Self {
        Resource { subresource: Some(subresource), ..self }
    }
}

impl fmt::Display for Resource {
    /// `deployments.apps`, `events`, `reloadpolicies.reloader.rs/status`, as kubectl names them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.plural)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(sub) = self.subresource {
            write!(f, "/{sub}")?;
        }
        Ok(())
    }
}

pub const CONFIGMAPS: Resource = Resource::new("", "configmaps");
pub const SECRETS: Resource = Resource::new("", "secrets");
pub const NAMESPACES: Resource = Resource::new("", "namespaces");
pub const CORE_EVENTS: Resource = Resource::new("", "events");
pub const EVENTS: Resource = Resource::new("events.k8s.io", "events");
pub const JOBS: Resource = Resource::new("batch", "jobs");
pub const RELOAD_POLICIES: Resource = Resource::new("reloader.rs", "reloadpolicies");
pub const LEASES: Resource = Resource::new("coordination.k8s.io", "leases");

/// One right: a verb on a resource, cluster-wide (`namespace` `None`) or in one namespace, on
/// every object or on the one named.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Right {
    pub resource: Resource,
    pub verb: Verb,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Right {
    pub fn new(resource: Resource, verb: Verb, namespace: Option<&str>) -> Self {
        Right { resource, verb, namespace: namespace.map(str::to_string), name: None }
    }

    /// The right on one object only (RBAC's `resourceNames`).
    pub fn on(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// The RBAC rule that grants this right, in the flow style kubectl and charts accept; in a
    /// ClusterRole for the whole cluster, in a Role of the namespace otherwise.
    pub fn rule(&self) -> String {
        let resource = match self.resource.subresource {
            Some(sub) => format!("{}/{sub}", self.resource.plural),
            None => self.resource.plural.to_string(),
        };
        let names = match &self.name {
            Some(name) => format!(", resourceNames: [\"{name}\"]"),
            None => String::new(),
        };
        let rule = format!(
            "{{apiGroups: [\"{}\"], resources: [\"{resource}\"]{names}, verbs: [\"{}\"]}}",
            self.resource.group,
            self.verb.as_str()
        );
        match &self.namespace {
            None => format!("ClusterRole rule {rule}"),
            Some(ns) => format!("Role rule in namespace {ns} {rule}"),
        }
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb.as_str(), self.resource)?;
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => f.write_str(" cluster-wide"),
        }
    }
}

pub use crate::decide::rights::{Answer, Follow};

/// The answers to the rights asked about. A right never asked about, or whose review failed,
/// is unknown: worth trying (the request itself then says), and asked again (see
/// [`crate::decide::rights`]).
#[derive(Debug, Clone, Default)]
pub struct Access {
    answers: HashMap<Right, Answer>,
}

impl Access {
    /// A table of known answers (for tests, and for what a refusal showed).
    pub fn from_answers(answers: impl IntoIterator<Item = (Right, bool)>) -> Self {
        let answers = answers.into_iter().map(|(r, ok)| (r, Answer::of(Some(ok))));
        Access { answers: answers.collect() }
    }

    /// Whether a request using the right is worth making: not known to be denied.
    pub fn allows(&self, resource: Resource, verb: Verb, namespace: Option<&str>) -> bool {
        self.grants(&Right::new(resource, verb, namespace))
    }

    /// Whether `right` (as asked, name included) may be tried: granted, or unknown.
    pub fn grants(&self, right: &Right) -> bool {
        self.answer(right).may_try()
    }

    /// The answer about `right` ([`Answer::Unknown`] when never answered).
    pub fn answer(&self, right: &Right) -> Answer {
        self.answers.get(right).copied().unwrap_or(Answer::Unknown)
    }

    pub fn answer_of(&self, resource: Resource, verb: Verb, namespace: Option<&str>) -> Answer {
        self.answer(&Right::new(resource, verb, namespace))
    }

    /// The rights asked about and refused, in a stable order.
    pub fn missing(&self) -> Vec<Right> {
        let denied = self.answers.iter().filter(|(_, a)| **a == Answer::Denied);
        let mut out: Vec<Right> = denied.map(|(r, _)| r.clone()).collect();
        out.sort();
        out
    }

    /// How many of `rights` have no known answer.
    pub fn unknown_among(&self, rights: &[Right]) -> usize {
        rights.iter().filter(|r| self.answer(r) == Answer::Unknown).count()
    }

    /// Takes the answers of a later review over the earlier ones; a review that failed leaves
    /// the answer known before it.
    pub fn merge(&mut self, newer: Access) {
        for (right, answer) in newer.answers {
            let kept = self.answers.get(&right).copied().unwrap_or(Answer::Unknown).then(answer);
            self.answers.insert(right, kept);
        }
    }
}

/// How `--enable-ha` can hold its Lease, and what it lacks for that.
pub struct LeaseRights {
    /// Only `get`/`update` on the Lease (stakater/Reloader's RBAC): poll it instead of
    /// watching and patching it.
    pub poll: bool,
    /// The rights the chosen election would use and the identity lacks.
    pub missing: Vec<Right>,
}

/// Asks which election the identity can run on Lease `name` in `namespace`: watching and
/// patching it (this chart's RBAC), or getting and updating it (stakater/Reloader's). Reviews the
/// API server does not answer are asked again with backoff until the answers decide it (see
/// [`crate::decide::rights::election`]).
pub async fn lease_rights(client: &Client, namespace: &str, name: &str) -> LeaseRights {
    use crate::decide::rights::{Election, election};
    let named = |v| Right::new(LEASES, v, Some(namespace)).on(name);
    let create = Right::new(LEASES, Verb::Create, Some(namespace));
    let watching: Vec<Right> = [Verb::Get, Verb::List, Verb::Watch, Verb::Patch]
        .into_iter()
        .map(named)
        .chain([create.clone()])
        .collect();
    let polling = vec![named(Verb::Get), named(Verb::Update), create];
    let mut asked = watching.clone();
    asked.push(named(Verb::Update));
    let mut access = Access::default();
    let mut reviews = 0u32;
    let poll = loop {
        reviews = reviews.saturating_add(1);
        access.merge(review(client, &asked).await);
        let answers =
            |rights: &[Right]| rights.iter().map(|r| access.answer(r)).collect::<Vec<_>>();
        match election(&answers(&watching), &answers(&polling), reviews) {
            Election::Watching => break false,
            Election::Polling => break true,
            Election::AskAgain(after) => {
                tracing::info!(lease = %format!("{namespace}/{name}"), retry_in = ?after,
                    "the API server did not answer whether the Lease may be watched; asking again");
                tokio::time::sleep(after).await;
            }
        }
    };
    let chosen = if poll { polling } else { watching };
    LeaseRights { poll, missing: chosen.into_iter().filter(|r| !access.grants(r)).collect() }
}

/// Asks the API server about each right (a few at a time). A review the API server does not
/// answer (429, 5xx, a timeout) is [`Answer::Unknown`]: asked again, never granted for good.
pub async fn review(client: &Client, rights: &[Right]) -> Access {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answers = futures::stream::iter(rights.iter().cloned())
        .map(|right| {
            let api = api.clone();
            async move {
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(attributes(&right)),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match api.create(&PostParams::default(), &review).await {
                    Ok(answer) => (right, Answer::of(Some(answer.status.is_some_and(|s| s.allowed)))),
                    Err(e) => {
                        tracing::debug!(right = %right, error = %e, "access review failed; its answer is unknown");
                        (right, Answer::Unknown)
                    }
                }
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    Access { answers: answers.into_iter().collect() }
}

/// What a review asks about `right`.
fn attributes(right: &Right) -> ResourceAttributes {
    ResourceAttributes {
        group: Some(right.resource.group.to_string()),
        resource: Some(right.resource.plural.to_string()),
        subresource: right.resource.subresource.map(str::to_string),
        verb: Some(right.verb.as_str().to_string()),
        namespace: right.namespace.clone(),
        name: right.name.clone(),
        ..Default::default()
    }
}

/// Asks the API server about each right of ServiceAccount `namespace/name` (SubjectAccessReviews:
/// `reloader explain` asking what the operator may do, with the asker's right to ask). A review
/// that fails is [`Answer::Unknown`], as in [`review`].
pub async fn review_of_account(
    client: &Client,
    namespace: &str,
    name: &str,
    rights: &[Right],
) -> Access {
    use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewSpec};
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let groups = vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".to_string(),
    ];
    let answers = futures::stream::iter(rights.iter().cloned())
        .map(|right| {
            let (api, user, groups) = (api.clone(), user.clone(), groups.clone());
            async move {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        resource_attributes: Some(attributes(&right)),
                        user: Some(user),
                        groups: Some(groups),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = api.create(&PostParams::default(), &review).await.ok();
                (right, Answer::of(answer.map(|a| a.status.is_some_and(|s| s.allowed))))
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    Access { answers: answers.into_iter().collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENTS: Resource = Resource::new("apps", "deployments");

    #[test]
    fn unknown_rights_may_be_tried_and_refused_ones_are_listed_in_order() {
        let access = Access::from_answers([
            (Right::new(DEPLOYMENTS, Verb::Watch, None), false),
            (Right::new(DEPLOYMENTS, Verb::List, None), true),
            (Right::new(CONFIGMAPS, Verb::Watch, Some("team-a")), false),
        ]);
        assert!(!access.allows(DEPLOYMENTS, Verb::Watch, None));
        assert!(access.allows(DEPLOYMENTS, Verb::List, None));
        assert!(access.allows(DEPLOYMENTS, Verb::Patch, None), "never asked: tried");
        assert_eq!(access.answer_of(DEPLOYMENTS, Verb::Patch, None), Answer::Unknown);
        assert!(access.allows(CONFIGMAPS, Verb::Watch, None), "another scope");
        let missing: Vec<String> = access.missing().iter().map(ToString::to_string).collect();
        assert_eq!(
            missing,
            ["watch configmaps in namespace team-a", "watch deployments.apps cluster-wide"]
        );
    }

    #[test]
    fn a_later_review_overrides_an_earlier_answer() {
        let mut access = Access::from_answers([(Right::new(DEPLOYMENTS, Verb::Watch, None), true)]);
        access.merge(Access::from_answers([(Right::new(DEPLOYMENTS, Verb::Watch, None), false)]));
        assert!(!access.allows(DEPLOYMENTS, Verb::Watch, None));
        // A review that failed keeps what was known.
        let failed = Access {
            answers: HashMap::from([(Right::new(DEPLOYMENTS, Verb::Watch, None), Answer::Unknown)]),
        };
        access.merge(failed);
        assert_eq!(access.answer_of(DEPLOYMENTS, Verb::Watch, None), Answer::Denied);
        let watch =
            [Right::new(DEPLOYMENTS, Verb::Watch, None), Right::new(DEPLOYMENTS, Verb::List, None)];
        assert_eq!(access.unknown_among(&watch), 1);
    }

    #[test]
    fn the_rule_that_grants_a_right_names_group_resource_and_verb() {
        assert_eq!(
            Right::new(DEPLOYMENTS, Verb::Watch, None).rule(),
            r#"ClusterRole rule {apiGroups: ["apps"], resources: ["deployments"], verbs: ["watch"]}"#
        );
        assert_eq!(
            Right::new(RELOAD_POLICIES.sub("status"), Verb::Patch, Some("apps")).rule(),
            r#"Role rule in namespace apps {apiGroups: ["reloader.rs"], resources: ["reloadpolicies/status"], verbs: ["patch"]}"#
        );
        let lease = Right::new(LEASES, Verb::Watch, Some("ops")).on("reloader-lock");
        assert_eq!(
            lease.to_string(),
            "watch leases.coordination.k8s.io reloader-lock in namespace ops"
        );
        assert_eq!(
            lease.rule(),
            r#"Role rule in namespace ops {apiGroups: ["coordination.k8s.io"], resources: ["leases"], resourceNames: ["reloader-lock"], verbs: ["watch"]}"#
        );
        assert_eq!(EVENTS.to_string(), "events.events.k8s.io");
        assert_eq!(CORE_EVENTS.to_string(), "events");
    }
}
