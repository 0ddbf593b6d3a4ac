//! Workloads read from protobuf (`k8s.io/api` apps/v1 and batch/v1 `generated.proto`): the
//! fields `WorkloadObject::info` reads, into kube's typed objects, every other field left at
//! its default.
//!
//! Why: a Deployment's JSON is three times its protobuf (10,000 Deployments of the bench: 77 MB
//! against 27 MB), the API server allocates a tenth as much to send it (37 MB against 386 MB for
//! one list), and reading the few fields used here skips the rest of a pod spec by its length
//! instead of parsing it.
//!
//! What is read: metadata (`object_meta`, as for sources), the pod
//! template's metadata, its containers and init containers (name, env, envFrom, volume
//! mounts) and volumes (ConfigMap, Secret, projected, CSI attributes), and the spec and status
//! fields a rollout's progress is read from (`model::progress`). Strings JSON omits when empty
//! are `None` when empty, as the JSON decode gives them. The integration test
//! `workload_encoding` checks, for every kind, that the summary is the JSON decode's.

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::batch::v1 as batch;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::{ProtoObject, Result, Value, each_field, object_meta, string_map_entry};
use crate::kube::lean::Lean;

/// Decodes a message into `T::default()`, one field at a time.
fn message<'a, T: Default>(
    buf: &'a [u8],
    mut on_field: impl FnMut(&mut T, u64, Value<'a>) -> Result<()>,
) -> Result<T> {
    let mut out = T::default();
    each_field(buf, |n, v| on_field(&mut out, n, v))?;
    Ok(out)
}

fn push<T>(list: &mut Option<Vec<T>>, item: T) {
    list.get_or_insert_with(Vec::new).push(item);
}

// Go writes an int32 as the varint of its sign extension to 64 bits: truncating gives it back.
fn int32(v: Value<'_>) -> Result<i32> {
    Ok(v.varint()? as i32)
}

fn int64(v: Value<'_>) -> Result<i64> {
    Ok(v.varint()? as i64)
}

fn boolean(v: Value<'_>) -> Result<bool> {
    Ok(v.varint()? != 0)
}

/// A string JSON leaves out when empty (`omitempty`).
fn non_empty(v: Value<'_>) -> Result<Option<String>> {
    Ok(Some(v.string()?).filter(|s| !s.is_empty()))
}

/// `LocalObjectReference`'s name, which selectors and sources embed as their field 1.
fn local_name(v: Value<'_>) -> Result<String> {
    let mut name = String::new();
    each_field(v.bytes()?, |n, v| {
        if n == 1 {
            name = v.string()?;
        }
        Ok(())
    })?;
    Ok(name)
}

/// An owner reference (`metadata.ownerReferences[]`, read by [`object_meta`]).
pub(super) fn owner_reference(buf: &[u8]) -> Result<OwnerReference> {
    message(buf, |o: &mut OwnerReference, n, v| {
        match n {
            1 => o.kind = v.string()?,
            3 => o.name = v.string()?,
            4 => o.uid = v.string()?,
            5 => o.api_version = v.string()?,
            6 => o.controller = Some(boolean(v)?),
            7 => o.block_owner_deletion = Some(boolean(v)?),
            _ => {}
        }
        Ok(())
    })
}

// ---- the pod template ------------------------------------------------------------------

fn pod_template(buf: &[u8]) -> Result<core::PodTemplateSpec> {
    message(buf, |t: &mut core::PodTemplateSpec, n, v| {
        match n {
            1 => t.metadata = Some(object_meta(v.bytes()?)?),
            2 => t.spec = Some(pod_spec(v.bytes()?)?),
            _ => {}
        }
        Ok(())
    })
}

fn pod_spec(buf: &[u8]) -> Result<core::PodSpec> {
    message(buf, |p: &mut core::PodSpec, n, v| {
        match n {
            1 => push(&mut p.volumes, volume(v.bytes()?)?),
            2 => p.containers.push(container(v.bytes()?)?),
            20 => push(&mut p.init_containers, container(v.bytes()?)?),
            _ => {}
        }
        Ok(())
    })
}

fn container(buf: &[u8]) -> Result<core::Container> {
    message(buf, |c: &mut core::Container, n, v| {
        match n {
            1 => c.name = v.string()?,
            7 => push(&mut c.env, env_var(v.bytes()?)?),
            9 => push(&mut c.volume_mounts, volume_mount(v.bytes()?)?),
            19 => push(&mut c.env_from, env_from(v.bytes()?)?),
            _ => {}
        }
        Ok(())
    })
}

fn env_var(buf: &[u8]) -> Result<core::EnvVar> {
    message(buf, |e: &mut core::EnvVar, n, v| {
        match n {
            1 => e.name = v.string()?,
            2 => e.value = non_empty(v)?,
            3 => e.value_from = Some(env_var_source(v.bytes()?)?),
            _ => {}
        }
        Ok(())
    })
}

fn env_var_source(buf: &[u8]) -> Result<core::EnvVarSource> {
    message(buf, |s: &mut core::EnvVarSource, n, v| {
        match n {
            3 => {
                let (name, key, optional) = key_selector(v.bytes()?)?;
                s.config_map_key_ref = Some(core::ConfigMapKeySelector { name, key, optional });
            }
            4 => {
                let (name, key, optional) = key_selector(v.bytes()?)?;
                s.secret_key_ref = Some(core::SecretKeySelector { name, key, optional });
            }
            _ => {}
        }
        Ok(())
    })
}

/// `ConfigMapKeySelector` and `SecretKeySelector` (same fields): name, key, optional.
fn key_selector(buf: &[u8]) -> Result<(String, String, Option<bool>)> {
    message(buf, |s: &mut (String, String, Option<bool>), n, v| {
        match n {
            1 => s.0 = local_name(v)?,
            2 => s.1 = v.string()?,
            3 => s.2 = Some(boolean(v)?),
            _ => {}
        }
        Ok(())
    })
}

fn env_from(buf: &[u8]) -> Result<core::EnvFromSource> {
    message(buf, |e: &mut core::EnvFromSource, n, v| {
        match n {
            1 => e.prefix = non_empty(v)?,
            2 => {
                let (name, optional) = env_source(v.bytes()?)?;
                e.config_map_ref = Some(core::ConfigMapEnvSource { name, optional });
            }
            3 => {
                let (name, optional) = env_source(v.bytes()?)?;
                e.secret_ref = Some(core::SecretEnvSource { name, optional });
            }
            _ => {}
        }
        Ok(())
    })
}

/// `ConfigMapEnvSource` and `SecretEnvSource` (same fields): name, optional.
fn env_source(buf: &[u8]) -> Result<(String, Option<bool>)> {
    message(buf, |s: &mut (String, Option<bool>), n, v| {
        match n {
            1 => s.0 = local_name(v)?,
            2 => s.1 = Some(boolean(v)?),
            _ => {}
        }
        Ok(())
    })
}

fn volume_mount(buf: &[u8]) -> Result<core::VolumeMount> {
    message(buf, |m: &mut core::VolumeMount, n, v| {
        match n {
            1 => m.name = v.string()?,
            3 => m.mount_path = v.string()?,
            _ => {}
        }
        Ok(())
    })
}

/// A volume: its name, and its source (a `VolumeSource` inlined in JSON, field 2 here).
fn volume(buf: &[u8]) -> Result<core::Volume> {
    message(buf, |vol: &mut core::Volume, n, v| {
        match n {
            1 => vol.name = v.string()?,
            2 => each_field(v.bytes()?, |n, v| {
                match n {
                    6 => vol.secret = Some(secret_volume(v.bytes()?)?),
                    19 => {
                        let (name, items) = projection(v.bytes()?)?;
                        vol.config_map =
                            Some(core::ConfigMapVolumeSource { name, items, ..Default::default() });
                    }
                    26 => vol.projected = Some(projected(v.bytes()?)?),
                    28 => vol.csi = Some(csi(v.bytes()?)?),
                    _ => {}
                }
                Ok(())
            })?,
            _ => {}
        }
        Ok(())
    })
}

fn secret_volume(buf: &[u8]) -> Result<core::SecretVolumeSource> {
    message(buf, |s: &mut core::SecretVolumeSource, n, v| {
        match n {
            1 => s.secret_name = non_empty(v)?,
            2 => push(&mut s.items, key_to_path(v.bytes()?)?),
            _ => {}
        }
        Ok(())
    })
}

/// A ConfigMap volume's or a projection's name (field 1) and items (field 2).
fn projection(buf: &[u8]) -> Result<(String, Option<Vec<core::KeyToPath>>)> {
    message(buf, |p: &mut (String, Option<Vec<core::KeyToPath>>), n, v| {
        match n {
            1 => p.0 = local_name(v)?,
            2 => push(&mut p.1, key_to_path(v.bytes()?)?),
            _ => {}
        }
        Ok(())
    })
}

fn key_to_path(buf: &[u8]) -> Result<core::KeyToPath> {
    message(buf, |k: &mut core::KeyToPath, n, v| {
        match n {
            1 => k.key = v.string()?,
            2 => k.path = v.string()?,
            _ => {}
        }
        Ok(())
    })
}

fn projected(buf: &[u8]) -> Result<core::ProjectedVolumeSource> {
    message(buf, |p: &mut core::ProjectedVolumeSource, n, v| {
        if n == 1 {
            push(&mut p.sources, volume_projection(v.bytes()?)?);
        }
        Ok(())
    })
}

fn volume_projection(buf: &[u8]) -> Result<core::VolumeProjection> {
    message(buf, |p: &mut core::VolumeProjection, n, v| {
        match n {
            1 => {
                let (name, items) = projection(v.bytes()?)?;
                p.secret = Some(core::SecretProjection { name, items, ..Default::default() });
            }
            3 => {
                let (name, items) = projection(v.bytes()?)?;
                p.config_map =
                    Some(core::ConfigMapProjection { name, items, ..Default::default() });
            }
            _ => {}
        }
        Ok(())
    })
}

fn csi(buf: &[u8]) -> Result<core::CSIVolumeSource> {
    message(buf, |c: &mut core::CSIVolumeSource, n, v| {
        match n {
            1 => c.driver = v.string()?,
            4 => string_map_entry(v.bytes()?, &mut c.volume_attributes)?,
            _ => {}
        }
        Ok(())
    })
}

// ---- the kinds -------------------------------------------------------------------------

/// A workload message: metadata (1), spec (2), status (3).
fn workload<'a, Spec: Default, Status: Default>(
    buf: &'a [u8],
    spec: impl Fn(&mut Spec, u64, Value<'a>) -> Result<()>,
    status: impl Fn(&mut Status, u64, Value<'a>) -> Result<()>,
) -> Result<(ObjectMeta, Option<Spec>, Option<Status>)> {
    message(buf, |w: &mut (ObjectMeta, Option<Spec>, Option<Status>), n, v| {
        match n {
            1 => w.0 = object_meta(v.bytes()?)?,
            2 => w.1 = Some(message(v.bytes()?, &spec)?),
            3 => w.2 = Some(message(v.bytes()?, &status)?),
            _ => {}
        }
        Ok(())
    })
}

/// A rollout strategy's `type` (field 1 of the apps/v1 update strategies).
fn strategy_type(buf: &[u8]) -> Result<Option<String>> {
    let mut kind = None;
    each_field(buf, |n, v| {
        if n == 1 {
            kind = non_empty(v)?;
        }
        Ok(())
    })?;
    Ok(kind)
}

impl ProtoObject for Lean<apps::Deployment> {
    fn decode_message(buf: &[u8]) -> Result<Self> {
        let spec = |s: &mut apps::DeploymentSpec, n: u64, v: Value<'_>| {
            match n {
                1 => s.replicas = Some(int32(v)?),
                3 => s.template = pod_template(v.bytes()?)?,
                7 => s.paused = Some(boolean(v)?),
                _ => {}
            }
            Ok(())
        };
        let status = |s: &mut apps::DeploymentStatus, n: u64, v: Value<'_>| {
            match n {
                1 => s.observed_generation = Some(int64(v)?),
                2 => s.replicas = Some(int32(v)?),
                3 => s.updated_replicas = Some(int32(v)?),
                4 => s.available_replicas = Some(int32(v)?),
                6 => push(&mut s.conditions, deployment_condition(v.bytes()?)?),
                7 => s.ready_replicas = Some(int32(v)?),
                _ => {}
            }
            Ok(())
        };
        let (metadata, spec, status) = workload(buf, spec, status)?;
        Ok(Lean(apps::Deployment { metadata, spec: spec.unwrap_or_default(), status }))
    }
}

fn deployment_condition(buf: &[u8]) -> Result<apps::DeploymentCondition> {
    message(buf, |c: &mut apps::DeploymentCondition, n, v| {
        match n {
            1 => c.type_ = non_empty(v)?,
            2 => c.status = non_empty(v)?,
            4 => c.reason = non_empty(v)?,
            5 => c.message = non_empty(v)?,
            _ => {}
        }
        Ok(())
    })
}

impl ProtoObject for Lean<apps::DaemonSet> {
    fn decode_message(buf: &[u8]) -> Result<Self> {
        let spec = |s: &mut apps::DaemonSetSpec, n: u64, v: Value<'_>| {
            match n {
                2 => s.template = pod_template(v.bytes()?)?,
                3 => {
                    let type_ = strategy_type(v.bytes()?)?;
                    s.update_strategy =
                        Some(apps::DaemonSetUpdateStrategy { type_, ..Default::default() });
                }
                _ => {}
            }
            Ok(())
        };
        let status = |s: &mut apps::DaemonSetStatus, n: u64, v: Value<'_>| {
            match n {
                3 => s.desired_number_scheduled = int32(v)?,
                5 => s.observed_generation = Some(int64(v)?),
                6 => s.updated_number_scheduled = Some(int32(v)?),
                7 => s.number_available = Some(int32(v)?),
                _ => {}
            }
            Ok(())
        };
        let (metadata, spec, status) = workload(buf, spec, status)?;
        Ok(Lean(apps::DaemonSet { metadata, spec: spec.unwrap_or_default(), status }))
    }
}

impl ProtoObject for Lean<apps::StatefulSet> {
    fn decode_message(buf: &[u8]) -> Result<Self> {
        let spec = |s: &mut apps::StatefulSetSpec, n: u64, v: Value<'_>| {
            match n {
                1 => s.replicas = Some(int32(v)?),
                3 => s.template = pod_template(v.bytes()?)?,
                7 => s.update_strategy = Some(stateful_set_strategy(v.bytes()?)?),
                _ => {}
            }
            Ok(())
        };
        let status = |s: &mut apps::StatefulSetStatus, n: u64, v: Value<'_>| {
            match n {
                1 => s.observed_generation = Some(int64(v)?),
                2 => s.replicas = int32(v)?,
                3 => s.ready_replicas = Some(int32(v)?),
                5 => s.updated_replicas = Some(int32(v)?),
                6 => s.current_revision = non_empty(v)?,
                7 => s.update_revision = non_empty(v)?,
                _ => {}
            }
            Ok(())
        };
        let (metadata, spec, status) = workload(buf, spec, status)?;
        Ok(Lean(apps::StatefulSet { metadata, spec: spec.unwrap_or_default(), status }))
    }
}

fn stateful_set_strategy(buf: &[u8]) -> Result<apps::StatefulSetUpdateStrategy> {
    let mut strategy =
        apps::StatefulSetUpdateStrategy { type_: strategy_type(buf)?, ..Default::default() };
    each_field(buf, |n, v| {
        if n == 2 {
            let mut rolling = apps::RollingUpdateStatefulSetStrategy::default();
            each_field(v.bytes()?, |n, v| {
                if n == 1 {
                    rolling.partition = Some(int32(v)?);
                }
                Ok(())
            })?;
            strategy.rolling_update = Some(rolling);
        }
        Ok(())
    })?;
    Ok(strategy)
}

/// A `JobSpec`'s pod template (field 6).
fn job_spec_field(s: &mut batch::JobSpec, n: u64, v: Value<'_>) -> Result<()> {
    if n == 6 {
        s.template = pod_template(v.bytes()?)?;
    }
    Ok(())
}

impl ProtoObject for Lean<batch::CronJob> {
    fn decode_message(buf: &[u8]) -> Result<Self> {
        let spec = |s: &mut batch::CronJobSpec, n: u64, v: Value<'_>| {
            match n {
                1 => s.schedule = v.string()?,
                4 => s.suspend = Some(boolean(v)?),
                5 => {
                    let template = &mut s.job_template;
                    each_field(v.bytes()?, |n, v| {
                        match n {
                            1 => template.metadata = Some(object_meta(v.bytes()?)?),
                            2 => template.spec = Some(message(v.bytes()?, job_spec_field)?),
                            _ => {}
                        }
                        Ok(())
                    })?;
                }
                _ => {}
            }
            Ok(())
        };
        let no_status = |_: &mut batch::CronJobStatus, _: u64, _: Value<'_>| Ok(());
        let (metadata, spec, status) = workload(buf, spec, no_status)?;
        Ok(Lean(batch::CronJob { metadata, spec: spec.unwrap_or_default(), status }))
    }
}

impl ProtoObject for Lean<batch::Job> {
    fn decode_message(buf: &[u8]) -> Result<Self> {
        let no_status = |_: &mut batch::JobStatus, _: u64, _: Value<'_>| Ok(());
        let (metadata, spec, status) = workload(buf, job_spec_field, no_status)?;
        Ok(Lean(batch::Job { metadata, spec, status }))
    }
}
