//! kube-runtime's watcher with its initial state taken as a streaming list (a watch with
//! `sendInitialEvents`) where the API server offers one, in pages where it refuses it.
//!
//! Why: the workload kinds are read as JSON through kube-runtime's watcher, whose default lists
//! in pages of 500; 10,000 Deployments (77 MB of JSON, mostly managed fields) were the last
//! list a 5× start waited for once the sources came from the source ledger. A streaming list
//! sends them one at a time from the API server's watch cache, with no page walked again or
//! held. kube-runtime's watcher has no fallback of its own: a server without streaming lists
//! (older releases, the WatchList feature gate off) refuses them with 400 or 422 on every try,
//! so that refusal switches this watcher to pages, for good, as `kube::source_watch` does.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// A refusal of a streaming list, as opposed to any other failure.
fn refused(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
            matches!(status.code, 400 | 422)
        }
        watcher::Error::WatchError(status) => matches!(status.code, 400 | 422),
        _ => false,
    }
}

struct State<K: 'static> {
    stream: BoxStream<'static, Result<Event<K>, watcher::Error>>,
    /// Kept until the streaming list is known to work, to fall back to pages.
    fallback: Option<(Api<K>, watcher::Config)>,
}

/// `watcher::watcher(api, config)` taking its initial state as a streaming list where offered.
pub fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let stream = watcher::watcher(api.clone(), config.clone().streaming_lists()).boxed();
    let state = State { stream, fallback: Some((api, config)) };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            let next = state.stream.next().await?;
            match &next {
                Err(e) if refused(e) && state.fallback.is_some() => {
                    let (api, config) = state.fallback.take().expect("checked");
                    tracing::info!(error = %e, "streaming list refused; listing in pages");
                    state.stream = watcher::watcher(api, config).boxed();
                    continue;
                }
                // Served once: the server offers streaming lists.
                Ok(Event::InitDone) => state.fallback = None,
                _ => {}
            }
            return Some((next, state));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::Client;
    use kube::ResourceExt;

    /// A server without streaming lists: a watch with `sendInitialEvents` gets 422, a list is
    /// answered, and a plain watch says nothing.
    #[tokio::test]
    async fn a_refused_streaming_list_falls_back_to_pages() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = asked.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let uri = request.uri().to_string();
            log.lock().unwrap().push(uri.clone());
            let (code, body) = if uri.contains("sendInitialEvents=true") {
                (422, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":422,"reason":"Invalid","message":"sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"}"#)
            } else if !uri.contains("watch=true") {
                (200, r#"{"kind":"DeploymentList","apiVersion":"apps/v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"web","namespace":"ns","resourceVersion":"4"}}]}"#)
            } else {
                (200, "")
            };
            let response = http::Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(kube::client::Body::from(body.as_bytes().to_vec()))
                .unwrap();
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        let api: Api<Deployment> = Api::all(Client::new(service, "ns"));
        let got: Vec<String> = watcher(api, watcher::Config::default())
            .take(3)
            .map(|e| match e.unwrap() {
                Event::Init => "init".to_string(),
                Event::InitApply(d) => d.name_any(),
                Event::InitDone => "done".to_string(),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
            .await;
        assert_eq!(got, ["init", "web", "done"]);
        let asked = asked.lock().unwrap().clone();
        assert!(asked[0].contains("sendInitialEvents=true"), "{asked:?}");
        assert!(asked[1].contains("limit=500") && !asked[1].contains("watch"), "{asked:?}");
    }
}
