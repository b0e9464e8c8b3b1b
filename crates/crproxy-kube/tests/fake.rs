//! The fake API server behaves like kube-apiserver where its clients depend on it.
#![cfg(feature = "fake")]

use anyhow::{Context as _, Result};
use crproxy_kube::fake::FakeApiServer;
use futures_util::StreamExt;
use serde_json::json;
use std::time::Duration;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

async fn timed<T>(f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .context("timed out")
}

#[tokio::test]
async fn optimistic_concurrency_and_not_found() -> Result<()> {
    let srv = FakeApiServer::start()
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let c = srv.client();
    let created =
        timed(c.create(LEASES, &json!({"metadata": {"name": "l"}, "spec": {}}))).await??;
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .context("rv")?
        .to_owned();
    assert_eq!(created["metadata"]["namespace"], "kube-system");

    let dup = timed(c.create(LEASES, &json!({"metadata": {"name": "l"}}))).await?;
    assert!(
        dup.as_ref().is_err_and(|e| e.is_already_exists()),
        "{dup:?}"
    );

    let mut update = created.clone();
    update["spec"]["holderIdentity"] = json!("a");
    let updated = timed(c.replace(&format!("{LEASES}/l"), &update)).await??;
    assert_ne!(updated["metadata"]["resourceVersion"], json!(rv));
    // Same stale resourceVersion again: someone else (we) changed it meanwhile.
    let stale = timed(c.replace(&format!("{LEASES}/l"), &update)).await?;
    let err = stale.expect_err("stale write");
    assert!(err.is_conflict(), "{err}");
    assert!(
        err.to_string().contains("the object has been modified"),
        "{err}"
    );

    let missing = timed(c.get(&format!("{LEASES}/nope")))
        .await?
        .expect_err("404");
    assert!(missing.is_not_found());
    assert_eq!(
        missing.to_string(),
        "the API server answered 404 NotFound: leases.coordination.k8s.io \"nope\" not found"
    );
    let list = timed(c.list(LEASES)).await??;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    Ok(())
}

#[tokio::test]
async fn watch_all_namespaces_sees_existing_then_live_events() -> Result<()> {
    let srv = FakeApiServer::start()
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let c = srv.client();
    let slices = |ns: &str| format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices");
    srv.insert(&slices("a"), json!({"metadata": {"name": "s1"}}))
        .context("insert")?;
    let mut w = Box::pin(timed(c.watch("/apis/discovery.k8s.io/v1/endpointslices")).await??);
    let first = timed(w.next()).await?.context("ended")??;
    assert_eq!(
        (first.event_type.as_str(), &first.object["metadata"]["name"]),
        ("ADDED", &json!("s1"))
    );
    timed(c.create(&slices("b"), &json!({"metadata": {"name": "s2"}}))).await??;
    timed(c.delete(&format!("{}/s1", slices("a")))).await??;
    let second = timed(w.next()).await?.context("ended")??;
    let third = timed(w.next()).await?.context("ended")??;
    assert_eq!(
        [
            (
                second.event_type.as_str(),
                second.object["metadata"]["namespace"].as_str()
            ),
            (
                third.event_type.as_str(),
                third.object["metadata"]["namespace"].as_str()
            )
        ],
        [("ADDED", Some("b")), ("DELETED", Some("a"))]
    );
    Ok(())
}

#[tokio::test]
async fn list_then_watch_from_its_resource_version_with_a_selector() -> Result<()> {
    let srv = FakeApiServer::start()
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let c = srv.client();
    let col = "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices";
    let slice = |name: &str, svc: &str| json!({"metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}}});
    timed(c.create(col, &slice("a-1", "a"))).await??;
    timed(c.create(col, &slice("b-1", "b"))).await??;
    let sel = "labelSelector=kubernetes.io%2Fservice-name%3Da";
    let list = timed(c.list(&format!("{col}?{sel}"))).await??;
    let names: Vec<&str> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["a-1"]);
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .context("rv")?
        .to_owned();

    // Written between the list and the watch: must still be seen, exactly once.
    timed(c.create(col, &slice("a-2", "a"))).await??;
    let mut w = Box::pin(timed(c.watch(&format!("{col}?{sel}&resourceVersion={rv}"))).await??);
    timed(c.create(col, &slice("b-2", "b"))).await??;
    timed(c.create(col, &slice("a-3", "a"))).await??;
    let mut got = Vec::new();
    for _ in 0..2 {
        let ev = timed(w.next()).await?.context("ended")??;
        got.push(format!(
            "{} {}",
            ev.event_type,
            ev.object["metadata"]["name"].as_str().unwrap_or("?")
        ));
    }
    assert_eq!(got, ["ADDED a-2", "ADDED a-3"]);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), w.next())
            .await
            .is_err(),
        "no duplicates, nothing from other services"
    );

    let bad = timed(c.list(&format!("{col}?labelSelector=env%20in%20(a)"))).await?;
    assert_eq!(bad.expect_err("set-based").status(), Some(400));
    Ok(())
}
