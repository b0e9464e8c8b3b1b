use super::*;
use http_body_util::{BodyExt, StreamBody};

type Chunk = Result<Frame<Bytes>, std::convert::Infallible>;
type Chunks = StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Chunk>>>;

/// `{"a":{"a":...1...}}`, `levels` objects deep.
fn nested(levels: usize) -> String {
    format!("{}1{}", r#"{"a":"#.repeat(levels), "}".repeat(levels))
}

fn widget(name: &str, levels: usize) -> String {
    format!(
        r#"{{"apiVersion":"example.com/v1","kind":"Widget","metadata":{{"name":"{name}","uid":"u"}},"spec":{}}}"#,
        nested(levels)
    )
}

/// A JSON answer to `method path` whose body arrives in `chunks`.
fn answer(method: Method, path: &str, chunks: Vec<String>) -> Response<StandInBody<Chunks>> {
    let frames: Vec<Chunk> = chunks
        .into_iter()
        .map(|c| Ok(Frame::data(Bytes::from(c))))
        .collect();
    let response = Response::builder()
        .header(CONTENT_TYPE, "application/json")
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .expect("response");
    guard(&method, path, response)
}

async fn frames_of(response: Response<StandInBody<Chunks>>) -> Vec<String> {
    let mut body = response.into_body();
    let mut out = Vec::new();
    // Bounded: the test bodies have a handful of frames.
    for _ in 0..100 {
        match body.frame().await {
            None => return out,
            Some(frame) => out.push(
                String::from_utf8(frame.expect("frame").into_data().expect("data").to_vec())
                    .expect("utf-8"),
            ),
        }
    }
    panic!("more than 100 frames");
}

#[tokio::test]
async fn watch_events_pass_as_each_line_completes_and_a_deep_one_is_replaced() {
    let shallow = format!(r#"{{"type":"ADDED","object":{}}}"#, widget("a", 3));
    let deep = format!(r#"{{"type":"ADDED","object":{}}}"#, widget("deep", 300));
    let (head, tail) = deep.split_at(deep.len() / 2);
    let response = answer(
        Method::GET,
        "/apis/example.com/v1/widgets?watch=true&resourceVersion=1",
        vec![
            format!("{shallow}\n{head}"),
            format!("{tail}\n"),
            format!("{shallow}\n"),
        ],
    );
    let frames = frames_of(response).await;
    assert_eq!(frames.len(), 3, "{frames:?}");
    // The first frame is handed on at once, without the half event.
    assert_eq!(frames[0], format!("{shallow}\n"));
    let event: serde_json::Value =
        serde_json::from_str(frames[1].trim_end()).expect("the deep event decodes");
    assert_eq!(event["object"]["metadata"]["name"], "deep");
    assert!(event["object"]["metadata"]["annotations"]
        .get(deep_objects::TOO_DEEP_ANNOTATION)
        .is_some());
    assert_eq!(frames[2], format!("{shallow}\n"));
}

#[tokio::test]
async fn a_list_is_read_whole_and_its_deep_item_replaced() {
    let list = format!(
        r#"{{"apiVersion":"example.com/v1","items":[{},{}],"kind":"WidgetList","metadata":{{}}}}"#,
        widget("a", 3),
        widget("deep", 300)
    );
    let (head, tail) = list.split_at(list.len() / 3);
    let response = answer(
        Method::GET,
        "/apis/example.com/v1/widgets?limit=500",
        vec![head.into(), tail.into()],
    );
    let frames = frames_of(response).await;
    assert_eq!(frames.len(), 1);
    let list: serde_json::Value = serde_json::from_str(&frames[0]).expect("the list decodes");
    assert_eq!(list["items"][0]["spec"]["a"]["a"]["a"], 1);
    assert_eq!(list["items"][1]["metadata"]["name"], "deep");
    assert!(list["items"][1].get("spec").is_none());
}

#[tokio::test]
async fn writes_and_shallow_answers_pass_as_they_came() {
    let deep = widget("deep", 300);
    let (head, tail) = deep.split_at(10);
    // The answer of a write is passed on as it came.
    let response = answer(
        Method::PUT,
        "/apis/example.com/v1/widgets/deep",
        vec![head.into(), tail.into()],
    );
    assert_eq!(
        frames_of(response).await,
        vec![head.to_owned(), tail.to_owned()]
    );
    let shallow = widget("a", 3);
    let response = answer(
        Method::GET,
        "/apis/example.com/v1/widgets/a",
        vec![shallow.clone()],
    );
    assert_eq!(frames_of(response).await, vec![shallow]);
}

#[test]
fn watches_are_told_by_their_query() {
    assert!(is_watch("/api/v1/pods?watch=true"));
    assert!(is_watch("/api/v1/pods?labelSelector=a&watch=1"));
    assert!(is_watch("/api/v1/pods?watch=yes"));
    assert!(!is_watch("/api/v1/pods?watch=false"));
    assert!(!is_watch("/api/v1/pods?watch=0"));
    assert!(!is_watch("/api/v1/pods/watch"));
}
