use super::*;

use crate::driver::{Identity, Protocol};
use http_body_util::BodyExt;

fn endpoint() -> Endpoint {
    crproxy_kube::install_crypto_provider();
    Endpoint::new(
        "direct",
        "127.0.0.1:6443".parse().expect("addr"),
        None,
        &Identity::Bearer("t".into()),
        Protocol::Http1,
    )
    .expect("endpoint")
}

fn owner() -> Owner {
    Owner {
        name: "client".into(),
        project: "default".into(),
    }
}

async fn json_body(request: Request<Body>) -> Value {
    let bytes = request
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&bytes).expect("json")
}

#[tokio::test]
async fn creates_name_objects_by_sequence_and_stamp_labels_only_when_asked() {
    let e = endpoint();
    let stamped = CreateObjects {
        namespace: "bench".into(),
        prefix: "c-direct".into(),
        owner: Some(owner()),
    };
    let request = stamped.request(&e, 0, 7, &mut ()).expect("request");
    assert_eq!(request.method(), Method::POST);
    assert_eq!(
        request.uri().path(),
        "/apis/example.com/v1/namespaces/bench/widgets"
    );
    assert_eq!(request.headers()["content-type"], "application/json");
    let body = json_body(request).await;
    assert_eq!(body["metadata"]["name"], "c-direct-7");
    assert_eq!(
        body["metadata"]["labels"]["vcluster.com/owner-vcluster"],
        "client"
    );
    assert_eq!(
        body["metadata"]["labels"]["vcluster.com/owner-project"],
        "default"
    );

    let bare = CreateObjects {
        owner: None,
        ..stamped
    };
    let body = json_body(bare.request(&e, 0, 1, &mut ()).expect("request")).await;
    assert!(body["metadata"].get("labels").is_none());

    let delete = DeleteObjects {
        namespace: "bench".into(),
        prefix: "c-direct".into(),
    };
    let request = delete.request(&e, 3, 7, &mut ()).expect("request");
    assert_eq!(request.method(), Method::DELETE);
    assert_eq!(
        request.uri().path(),
        "/apis/example.com/v1/namespaces/bench/widgets/c-direct-7"
    );
}

fn answer(status: u16, body: &str) -> Exchange {
    Exchange {
        status: http::StatusCode::from_u16(status).expect("status"),
        body: Some(Bytes::from(body.to_string())),
        bytes: body.len() as u64,
        elapsed: std::time::Duration::from_millis(1),
    }
}

#[tokio::test]
async fn updates_carry_and_follow_the_resource_version() {
    let e = endpoint();
    let update = UpdateObjects {
        namespace: "bench".into(),
        owner: None,
    };
    let mut state = Owned {
        name: "u-0".into(),
        resource_version: "41".into(),
    };
    let request = update.request(&e, 0, 1, &mut state).expect("request");
    assert_eq!(request.method(), Method::PUT);
    let body = json_body(request).await;
    assert_eq!(body["metadata"]["resourceVersion"], "41");
    assert_eq!(body["spec"]["n"], 1);

    assert!(update.observe(
        &mut state,
        &answer(200, r#"{"metadata":{"resourceVersion":"42"}}"#)
    ));
    assert_eq!(state.resource_version, "42");
    assert!(!update.observe(&mut state, &answer(409, r#"{"kind":"Status"}"#)));
    assert!(!update.observe(&mut state, &answer(200, "not json")));
    assert_eq!(state.resource_version, "42");
}

#[tokio::test]
async fn patches_are_merge_patches_of_the_worker_object() {
    let e = endpoint();
    let patch = PatchObjects {
        namespace: "bench".into(),
    };
    let request = patch
        .request(&e, 0, 9, &mut "p-2".to_string())
        .expect("request");
    assert_eq!(request.method(), Method::PATCH);
    assert_eq!(
        request.headers()["content-type"],
        "application/merge-patch+json"
    );
    assert!(request.uri().path().ends_with("/widgets/p-2"));
    assert_eq!(json_body(request).await, json!({"spec": {"n": 9}}));
}

#[tokio::test]
async fn seeded_patches_touch_one_object_per_request() {
    let e = endpoint();
    let patch = PatchNamed {
        namespace: "seeded".into(),
        prefix: "s-crproxy-16-r0".into(),
    };
    for seq in [0, 7] {
        let request = patch.request(&e, 3, seq, &mut ()).expect("request");
        assert_eq!(request.method(), Method::PATCH);
        assert_eq!(
            request.headers()["content-type"],
            "application/merge-patch+json"
        );
        assert_eq!(
            request.uri().path(),
            format!("/apis/example.com/v1/namespaces/seeded/widgets/s-crproxy-16-r0-{seq}")
        );
        assert_eq!(json_body(request).await, json!({"spec": {"n": seq}}));
    }
}

#[test]
fn a_short_list_is_an_error() {
    let list = ReadPath {
        path: collection_path("l"),
        min_bytes: 10,
    };
    assert!(list.observe(&mut (), &answer(200, "0123456789")));
    assert!(!list.observe(&mut (), &answer(200, "short")));
    assert!(!list.observe(&mut (), &answer(503, "0123456789abc")));
}
