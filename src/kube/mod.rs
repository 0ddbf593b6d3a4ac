//! The modules that talk to the Kubernetes API: the workload writes, the identity's rights,
//! leader election, the HMAC hash key Secret, the client's request budget, and the protobuf
//! list-then-watch of Secrets and ConfigMaps, whose data is hashed as it is decoded, and the
//! workloads' decode without their managed fields.

/// The type half of `kube::Resource` for a wrapper that reads a namespaced kind `$kind`
/// differently ([`hashed::Hashed`], [`lean::Lean`]): its kind, group, version and plural are
/// the wrapped kind's; the wrapper gives `meta` and `meta_mut` itself.
macro_rules! resource_type_of {
    ($kind:ident) => {
        type DynamicType = ();
        type Scope = k8s_openapi::NamespaceResourceScope;

        fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
            $kind::kind(dt)
        }
        fn group(dt: &()) -> std::borrow::Cow<'_, str> {
            $kind::group(dt)
        }
        fn version(dt: &()) -> std::borrow::Cow<'_, str> {
            $kind::version(dt)
        }
        fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
            $kind::plural(dt)
        }
    };
}

pub mod access;
pub mod evict;
pub mod hash_key;
pub mod hashed;
pub mod leader;
pub mod lean;
pub mod ledger;
pub mod pending_jobs;
pub mod proto_watch;
pub mod protobuf;
pub mod ratelimit;
pub mod write;
