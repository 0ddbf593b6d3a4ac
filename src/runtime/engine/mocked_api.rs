//! The reconcile and the feed against a mocked API server (`tower-test`'s mock service behind
//! a real `kube::Client`), for the paths that need no real server: the request a reconcile
//! makes and what it does with each answer, the keys the feed queues, and how the pods of
//! policies' `Pod` targets are listed (in pages, each policy on its own). Behaviour against
//! the real control plane is in `tests/it`.

#[cfg(test)]
mod tests {
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};
    use tower_test::mock::{self, Handle};

    use super::super::*;
    use crate::decide::rollout::Next;

    type ApiHandle = Handle<Request<Body>, Response<Body>>;

    /// An engine whose client is the mock's (`--debounce 0s`, so a change rolls at once, and
    /// `args`), with its caches synced and a ConfigMap `app-config` in `shop` whose hash is `h2`.
    /// Events go to a client nobody answers.
    fn engine_with(args: &[&str]) -> (Arc<Engine>, ApiHandle) {
        engine_led(args, crate::kube::leader::sole_leader())
    }

    /// As [`engine_with`], leading while `leadership` says so.
    fn engine_led(
        args: &[&str],
        leadership: tokio::sync::watch::Receiver<bool>,
    ) -> (Arc<Engine>, ApiHandle) {
        use clap::Parser;
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let nobody = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let events = Client::try_from(nobody).expect("a client");
        let cli = crate::cli::Cli::parse_from(["reloader", "--debounce", "0s"].iter().chain(args));
        let config = crate::runtime::operator::engine_config(&cli.reload);
        let engine = Engine::new(client, events, config, leadership);
        engine.feed.caches_synced(true);
        engine.feed.source_observed("shop", config_map("app-config"), SourceFacts::with_hash("h2"));
        (engine, handle)
    }

    fn engine() -> (Arc<Engine>, ApiHandle) {
        engine_with(&[])
    }

    fn config_map(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }

    /// A Deployment `name` in `shop` with `auto`, whose container takes `app-config` and holds
    /// `STAKATER_APP_CONFIG_CONFIGMAP` = `stored`; `uses` says whether it references the ConfigMap.
    fn deployment(name: &str, stored: &str, uses: bool) -> Value {
        let env_from =
            if uses { json!([{"configMapRef": {"name": "app-config"}}]) } else { json!([]) };
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                         "resourceVersion": "1", "generation": 1,
                         "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "app:1", "envFrom": env_from,
                    "env": [{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": stored}]}]}}}
        })
    }

    /// Puts a Deployment in the index as a write's answer would (nothing is queued).
    fn known(engine: &Engine, object: &Value) -> WorkloadKey {
        let object: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
        engine.feed.refresh(WorkloadKind::Deployment, &object).expect("a workload reloaded here")
    }

    fn answer(status: StatusCode, body: &Value) -> Response<Body> {
        let bytes = serde_json::to_vec(body).expect("JSON");
        Response::builder().status(status).body(Body::from(bytes)).expect("a response")
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason,
               "reason": reason, "code": code})
    }

    /// The next request: method, path and query, and its body as JSON (`Null` when empty).
    async fn next_request(
        handle: &mut ApiHandle,
    ) -> (Method, String, Value, mock::SendResponse<Response<Body>>) {
        let (request, send) = handle.next_request().await.expect("a request");
        let (method, uri) = (request.method().clone(), request.uri().to_string());
        let bytes = request.into_body().collect_bytes().await.expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON")
        };
        (method, uri, body, send)
    }

    /// The `STAKATER_APP_CONFIG_CONFIGMAP` value a strategic merge patch sets.
    fn variable_set_by(patch: &Value) -> Option<&str> {
        let containers = patch.pointer("/spec/template/spec/containers")?.as_array()?;
        let env = containers.iter().find(|c| c["name"] == "app")?["env"].as_array()?;
        let var = env.iter().find(|e| e["name"] == "STAKATER_APP_CONFIG_CONFIGMAP")?;
        var["value"].as_str()
    }

    #[tokio::test]
    async fn a_workload_whose_source_changed_gets_one_patch_setting_the_new_hash() {
        let (engine, mut handle) = engine();
        let key = known(&engine, &deployment("web", "h1", true));
        let api = tokio::spawn(async move {
            let (method, uri, body, send) = next_request(&mut handle).await;
            // The server's answer: the object as the patch left it (its record included).
            let mut written = deployment("web", "h2", true);
            if let Some(record) = body.pointer("/metadata/annotations").and_then(Value::as_object) {
                let annotations =
                    written["metadata"]["annotations"].as_object_mut().expect("a map");
                annotations.extend(record.clone());
            }
            send.send_response(answer(StatusCode::OK, &written));
            (method, uri, body)
        });
        let next = engine.reconciler.reconcile(&key).await;
        let (method, uri, patch) = api.await.expect("the API task");
        assert_eq!(method, Method::PATCH);
        assert!(uri.starts_with("/apis/apps/v1/namespaces/shop/deployments/web?"), "{uri}");
        assert_eq!(variable_set_by(&patch), Some("h2"), "{patch:#}");
        assert!(matches!(next, Next::Idle), "{next:?}");
        assert_eq!(engine.reconciler.failures_of(&key), 0);
        // The index took the answer: a second reconcile finds it current and asks nothing (the
        // mock is gone, so a request would fail and be retried).
        let again = engine.reconciler.reconcile(&key).await;
        assert!(matches!(again, Next::Idle), "{again:?}");
    }

    #[tokio::test]
    async fn a_conflict_reads_the_workload_again_and_writes_on_what_it_finds() {
        let (engine, mut handle) = engine();
        let key = known(&engine, &deployment("web", "h1", true));
        let api = tokio::spawn(async move {
            let mut seen = Vec::new();
            let (method, uri, _, send) = next_request(&mut handle).await;
            seen.push((method, uri));
            send.send_response(answer(StatusCode::CONFLICT, &status(409, "Conflict")));
            // Someone else changed it meanwhile (a new image), still on the old hash.
            let (method, uri, _, send) = next_request(&mut handle).await;
            seen.push((method, uri));
            let mut fresh = deployment("web", "h1", true);
            fresh["metadata"]["resourceVersion"] = json!("2");
            fresh["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:2");
            send.send_response(answer(StatusCode::OK, &fresh));
            let (method, uri, patch, send) = next_request(&mut handle).await;
            seen.push((method, uri));
            send.send_response(answer(StatusCode::OK, &deployment("web", "h2", true)));
            (seen, patch)
        });
        let next = engine.reconciler.reconcile(&key).await;
        let (seen, patch) = api.await.expect("the API task");
        let methods: Vec<&Method> = seen.iter().map(|(m, _)| m).collect();
        assert_eq!(methods, [Method::PATCH, Method::GET, Method::PATCH]);
        assert_eq!(seen[1].1, "/apis/apps/v1/namespaces/shop/deployments/web");
        assert_eq!(variable_set_by(&patch), Some("h2"), "{patch:#}");
        assert!(matches!(next, Next::Idle), "{next:?}");
        assert_eq!(engine.reconciler.failures_of(&key), 0, "a conflict is no failure");
    }

    /// What the mock was asked, in order: method, path and query, body.
    type Asked = Arc<Mutex<Vec<(Method, String, Value)>>>;

    /// Answers every request with `respond` until the task is aborted.
    fn serve(
        mut handle: ApiHandle,
        respond: impl Fn(&Method, &str) -> Response<Body> + Send + 'static,
    ) -> (Asked, tokio::task::JoinHandle<()>) {
        let asked = Asked::default();
        let log = asked.clone();
        let task = tokio::spawn(async move {
            loop {
                let (method, uri, body, send) = next_request(&mut handle).await;
                send.send_response(respond(&method, &uri));
                log.lock().push((method, uri, body));
            }
        });
        (asked, task)
    }

    #[tokio::test]
    async fn a_refused_or_throttled_write_is_a_failure_retried_with_backoff() {
        for (code, reason) in [(403, "Forbidden"), (429, "TooManyRequests")] {
            // A rollout admitted counts against the minimum interval even when its write failed:
            // off here, to see the retries.
            let (engine, handle) = engine_with(&["--min-rollout-interval", "0s"]);
            let key = known(&engine, &deployment("web", "h1", true));
            let (asked, api) = serve(handle, move |method, _| match *method {
                Method::PATCH => {
                    let status_code = StatusCode::from_u16(code).expect("a status");
                    answer(status_code, &status(code, reason))
                }
                // The rights asked again after a refusal: granted.
                _ => answer(StatusCode::CREATED, &json!({"status": {"allowed": true}})),
            });
            let first = engine.reconciler.reconcile(&key).await;
            assert!(
                matches!(first, Next::Retry(d) if d == Duration::from_secs(1)),
                "{code}: {first:?}"
            );
            assert_eq!(engine.reconciler.failures_of(&key), 1, "{code}");
            // The backoff doubles with each consecutive failure.
            let second = engine.reconciler.reconcile(&key).await;
            assert!(
                matches!(second, Next::Retry(d) if d == Duration::from_secs(2)),
                "{code}: {second:?}"
            );
            assert_eq!(engine.reconciler.failures_of(&key), 2, "{code}");
            api.abort();
            let asked = asked.lock();
            let patches = asked.iter().filter(|(m, ..)| *m == Method::PATCH).count();
            assert_eq!(patches, 2, "{code}: one write per reconcile");
            // A refusal (not a throttle) has the identity's rights asked again, once.
            let reviews =
                asked.iter().filter(|(_, uri, _)| uri.contains("selfsubjectaccessreviews"));
            assert_eq!(reviews.count() > 0, code == 403, "{code}: {asked:?}");
        }
    }

    #[tokio::test]
    async fn the_feed_queues_the_workloads_a_source_change_concerns_and_asks_the_api_nothing() {
        let (engine, mut handle) = engine();
        let web = known(&engine, &deployment("web", "h2", true));
        let other = known(&engine, &deployment("other", "h2", false));
        assert!(engine.queue.is_empty(), "a write's answer queues nothing");
        let update = engine.feed.source_observed(
            "shop",
            config_map("app-config"),
            SourceFacts::with_hash("h3"),
        );
        assert_eq!(update, SourceUpdate::Changed);
        assert_eq!(engine.queue.len(), 1);
        let queued = tokio::time::timeout(Duration::from_secs(1), engine.queue.next()).await;
        assert_eq!(queued.expect("a key due at once"), Some(web.clone()));
        assert_ne!(web, other);
        // The same hash again: nothing changed, nothing queued.
        engine.queue.done(&web);
        let same = engine.feed.source_observed(
            "shop",
            config_map("app-config"),
            SourceFacts::with_hash("h3"),
        );
        assert_eq!(same, SourceUpdate::Unchanged);
        assert!(engine.queue.is_empty());
        // A ConfigMap nobody uses queues nobody.
        engine.feed.source_observed("shop", config_map("unused"), SourceFacts::with_hash("x1"));
        engine.feed.source_observed("shop", config_map("unused"), SourceFacts::with_hash("x2"));
        assert!(engine.queue.is_empty());
        let quiet = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
        assert!(quiet.is_err(), "the feed calls no API");
    }

    /// A policy in `namespace` whose target of kind `Pod` selects `app=kafka`, rolled to the
    /// ConfigMap `app-config`.
    fn pod_policy(namespace: &str, name: &str) -> Value {
        json!({
            "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                         "generation": 1, "resourceVersion": "1"},
            "spec": {"sources": [{"kind": "ConfigMap", "name": "app-config"}],
                     "targets": [{"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}}],
                     "strategy": "Evict", "hashMode": "SHA1"}
        })
    }

    /// Two Ready pods of one controller, as a list of `namespace`'s pods answers.
    fn kafka_pods(namespace: &str) -> Value {
        let pod = |name: &str, created: &str| {
            json!({"metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                       "labels": {"app": "kafka"}, "creationTimestamp": created,
                       "ownerReferences": [{"apiVersion": "x/v1", "kind": "StrimziPodSet",
                           "name": "kafka", "uid": "uid-set", "controller": true}]},
                   "spec": {"containers": [{"name": "broker", "image": "kafka"}]},
                   "status": {"conditions": [{"type": "Ready", "status": "True",
                       "lastTransitionTime": created}]}})
        };
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
               "items": [pod("kafka-0", "2020-01-01T00:00:00Z"),
                         pod("kafka-1", "2020-01-01T00:01:00Z")]})
    }

    /// Serves a Pod-target test's API: every request logged in `log`; each pods list handed to
    /// `list` with its path (which answers it, or keeps it unanswered); policy `b`'s status
    /// echoed back; anything else created.
    fn serve_pod_targets(
        mut handle: ApiHandle,
        log: Asked,
        mut list: impl FnMut(&str, mock::SendResponse<Response<Body>>) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let (method, uri, body, send) = next_request(&mut handle).await;
                log.lock().push((method.clone(), uri.clone(), body.clone()));
                if method == Method::GET && uri.contains("/pods?") {
                    list(&uri, send);
                } else if uri.contains("/reloadpolicies/b/status") {
                    let mut written = pod_policy("shop", "b");
                    written["status"] = body["status"].clone();
                    send.send_response(answer(StatusCode::OK, &written));
                } else {
                    send.send_response(answer(StatusCode::CREATED, &json!({})));
                }
            }
        })
    }

    /// Policy `a`'s pods (namespace `slow`) are listed and never answered; policy `b`'s (namespace
    /// `shop`) still get their looks every tick, and a change of `b`'s source evicts a pod. Looked
    /// at one after another, `b` would wait on `a`'s list for ever.
    #[tokio::test]
    async fn a_policy_whose_pods_never_list_holds_up_no_other_policys_evictions() {
        let (engine, handle) = engine();
        engine.feed.source_observed("slow", config_map("app-config"), SourceFacts::with_hash("h2"));
        for (namespace, name) in [("slow", "a"), ("shop", "b")] {
            let policy: crate::model::policy::ReloadPolicy =
                serde_json::from_value(pod_policy(namespace, name)).unwrap();
            engine.policies.apply(&policy);
        }
        let asked = Asked::default();
        let log = asked.clone();
        let mut unanswered = Vec::new();
        let api = serve_pod_targets(handle, log, move |uri, send| {
            if uri.starts_with("/api/v1/namespaces/slow/pods?") {
                // Held, never answered (nor dropped, which would fail the list).
                unanswered.push(send);
            } else {
                send.send_response(answer(StatusCode::OK, &kafka_pods("shop")));
            }
        });
        let looks = tokio::spawn(engine.policies.clone().pod_targets_loop());
        let count = |what: &dyn Fn(&Method, &str) -> bool| {
            asked.lock().iter().filter(|(m, uri, _)| what(m, uri)).count()
        };
        let shop_lists = |m: &Method, uri: &str| {
            *m == Method::GET && uri.starts_with("/api/v1/namespaces/shop/pods?")
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while count(&shop_lists) < 2 {
            assert!(std::time::Instant::now() < deadline, "b looked at again: {:?}", asked.lock());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Pages of at most 250.
        let first = asked.lock().iter().find(|(m, uri, _)| shop_lists(m, uri)).unwrap().1.clone();
        assert!(first.contains("limit=250"), "{first}");
        engine.feed.source_observed("shop", config_map("app-config"), SourceFacts::with_hash("h3"));
        let evictions = |m: &Method, uri: &str| *m == Method::POST && uri.contains("/eviction");
        while count(&evictions) == 0 {
            assert!(std::time::Instant::now() < deadline, "b's pod evicted: {:?}", asked.lock());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        looks.abort();
        api.abort();
        let asked = asked.lock();
        let evicted: Vec<&String> =
            asked.iter().filter(|(m, uri, _)| evictions(m, uri)).map(|(_, uri, _)| uri).collect();
        assert!(!evicted.is_empty(), "{asked:?}");
        let oldest = "/api/v1/namespaces/shop/pods/kafka-0/eviction";
        assert!(evicted.iter().all(|uri| uri.starts_with(oldest)), "{evicted:?}");
        // `a`'s look still hangs: it was not started a second time.
        let slow = asked.iter().filter(|(_, uri, _)| uri.starts_with("/api/v1/namespaces/slow/"));
        assert_eq!(slow.count(), 1, "{asked:?}");
    }

    /// A replica that stops leading while a policy's pods are being listed evicts nothing and
    /// writes no status from that look once the list answers: the look is stopped.
    #[tokio::test]
    async fn a_look_under_way_when_leadership_is_lost_evicts_nothing() {
        let (leading, leadership) = tokio::sync::watch::channel(true);
        let (engine, handle) = engine_led(&[], leadership);
        let policy: crate::model::policy::ReloadPolicy =
            serde_json::from_value(pod_policy("shop", "b")).unwrap();
        engine.policies.apply(&policy);
        let asked = Asked::default();
        let log = asked.clone();
        let (listed, mut list_asked) = tokio::sync::mpsc::unbounded_channel();
        let mut lists = 0;
        let api = serve_pod_targets(handle, log, move |_, send| {
            // The first look's list is answered; the next ones when the test says so.
            lists += 1;
            if lists == 1 {
                send.send_response(answer(StatusCode::OK, &kafka_pods("shop")));
            } else {
                let _ = listed.send(send);
            }
        });
        let looks = tokio::spawn(engine.policies.clone().pod_targets_loop());
        // The pods seen once at the current content (the first look, answered); the source
        // changes before the next tick; the next look's list is held, and leadership goes.
        let first_list = |asked: &Asked| {
            asked.lock().iter().any(|(_, uri, _)| uri.starts_with("/api/v1/namespaces/shop/pods?"))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !first_list(&asked) {
            assert!(std::time::Instant::now() < deadline, "the first look: {:?}", asked.lock());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        engine.feed.source_observed("shop", config_map("app-config"), SourceFacts::with_hash("h3"));
        let held = tokio::time::timeout(Duration::from_secs(10), list_asked.recv()).await;
        let held = held.expect("a second look").expect("a list");
        leading.send(false).unwrap();
        let flipped = asked.lock().len();
        tokio::time::sleep(Duration::from_secs(3)).await;
        held.send_response(answer(StatusCode::OK, &kafka_pods("shop")));
        tokio::time::sleep(Duration::from_secs(3)).await;
        looks.abort();
        api.abort();
        let asked = asked.lock();
        let written = asked[flipped..].iter().filter(|(m, uri, _)| {
            uri.contains("/eviction") || (*m == Method::PATCH && uri.contains("/reloadpolicies/"))
        });
        assert_eq!(written.count(), 0, "{asked:?}");
    }

    /// A `Pod` target's pods are listed page by page (`limit`, then `continue`), each page
    /// taken before the next is asked for; once the selection is over its bound no further
    /// page is asked for.
    #[tokio::test]
    async fn selected_pods_are_listed_in_pages_and_no_further_than_the_bound() {
        use crate::decide::pod_targets::Selection;
        let page = |names: &[&str], next: Option<&str>| {
            let mut list = kafka_pods("shop");
            let items: Vec<Value> = names
                .iter()
                .map(|n| {
                    let mut pod = list["items"][0].clone();
                    pod["metadata"]["name"] = json!(n);
                    pod["metadata"]["uid"] = json!(format!("uid-{n}"));
                    pod
                })
                .collect();
            list["items"] = json!(items);
            if let Some(token) = next {
                list["metadata"]["continue"] = json!(token);
            }
            list
        };
        let selector: kube::core::Selector = serde_json::from_value::<
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
        >(json!({"matchLabels": {"app": "kafka"}}))
        .unwrap()
        .try_into()
        .unwrap();
        for (at_most, pages_asked, within) in [(10, 3, true), (3, 2, false)] {
            let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
            let client = Client::new(service, "default");
            let (asked, api) = serve(handle, move |_, uri| {
                let body = if uri.contains("continue=second") {
                    page(&["p2", "p3"], Some("third"))
                } else if uri.contains("continue=third") {
                    page(&["p4"], None)
                } else {
                    page(&["p0", "p1"], Some("second"))
                };
                answer(StatusCode::OK, &body)
            });
            let mut selection = Selection::new(at_most);
            crate::kube::evict::select_pods(&client, "shop", &selector, &mut selection)
                .await
                .expect("listed");
            api.abort();
            let asked = asked.lock();
            let uris: Vec<&String> = asked.iter().map(|(_, uri, _)| uri).collect();
            assert_eq!(uris.len(), pages_asked, "{at_most}: {uris:?}");
            assert!(uris.iter().all(|u| u.contains("limit=250")), "{uris:?}");
            assert!(uris[1].contains("continue=second"), "{uris:?}");
            let groups = selection.groups("shop");
            assert_eq!(groups.is_ok(), within, "{at_most}: {groups:?}");
            if let Ok(groups) = groups {
                assert_eq!(groups.owned.values().map(Vec::len).sum::<usize>(), 5);
            }
        }
    }
}
