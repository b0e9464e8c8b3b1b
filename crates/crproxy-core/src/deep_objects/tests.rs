use super::*;
use serde_json::json;

/// `{"a":{"a":...{"a":1}...}}`, `levels` objects deep.
fn nested(levels: usize) -> String {
    let mut text = String::new();
    for _ in 0..levels {
        text.push_str(r#"{"a":"#);
    }
    text.push('1');
    for _ in 0..levels {
        text.push('}');
    }
    text
}

/// A Widget that nests `levels` deep through its spec (and a level less
/// through its managedFields).
fn widget(name: &str, levels: usize) -> String {
    format!(
        r#"{{"apiVersion":"example.com/v1","kind":"Widget","metadata":{{"name":"{name}","namespace":"demo","uid":"u-{name}","resourceVersion":"7","labels":{{"app":"x"}},"annotations":{{"note":"kept"}},"managedFields":[{{"fieldsV1":{}}}]}},"spec":{}}}"#,
        nested(levels.saturating_sub(5)),
        nested(levels.saturating_sub(1)),
    )
}

fn decode(text: &str) -> Value {
    serde_json::from_str(text).expect("serde_json decodes the rewritten text")
}

#[test]
fn nesting_is_counted_per_container() {
    for (text, expected) in [
        ("1", 0),
        ("{}", 1),
        ("[]", 1),
        (r#"{"a":[]}"#, 2),
        (r#"[[1],{"a":{"b":[]}}]"#, 4),
    ] {
        assert_eq!(Skim::new(text).skip_nesting(), Ok(expected), "{text}");
    }
    assert_eq!(Skim::new(&nested(300)).skip_nesting(), Ok(300));
}

#[test]
fn shallow_answers_and_events_are_passed_on_untouched() {
    let list = format!(
        r#"{{"apiVersion":"example.com/v1","items":[{}],"kind":"WidgetList","metadata":{{}}}}"#,
        widget("a", 40)
    );
    assert_eq!(rewrite_answer(&list), None);
    assert_eq!(rewrite_answer(&widget("a", MAX_OBJECT_NESTING)), None);
    let event = format!(
        r#"{{"type":"ADDED","object":{}}}"#,
        widget("a", MAX_OBJECT_NESTING)
    );
    assert_eq!(rewrite_event(&event), None);
    // Not JSON: passed on for the reader to refuse.
    assert_eq!(rewrite_answer("{\"a\":"), None);
    let deep = widget("deep", 200);
    assert_eq!(rewrite_answer(&format!("{deep}}}")), None);
    let event = format!(r#"{{"type":"ADDED","object":{deep}}}}}"#);
    assert_eq!(rewrite_event(&event), None);
}

#[test]
fn a_deep_item_of_a_list_becomes_its_stand_in_and_the_rest_stay() {
    let list = format!(
        r#"{{"apiVersion":"example.com/v1","items":[{},{},{}],"kind":"WidgetList","metadata":{{"resourceVersion":"9"}}}}"#,
        widget("a", 10),
        widget("deep", 400),
        widget("c", 10)
    );
    assert!(serde_json::from_str::<Value>(&list).is_err());
    let rewritten = decode(&rewrite_answer(&list).expect("rewritten"));
    let items = rewritten["items"].as_array().expect("items");
    assert_eq!(items.len(), 3);
    assert_eq!(items[0], decode(&widget("a", 10)));
    assert_eq!(items[2], decode(&widget("c", 10)));
    assert_eq!(
        items[1],
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {
            "name": "deep", "namespace": "demo", "uid": "u-deep", "resourceVersion": "7",
            "labels": {"app": "x"},
            "annotations": {"note": "kept", TOO_DEEP_ANNOTATION: TOO_DEEP_REASON}}})
    );
    assert_eq!(rewritten["metadata"]["resourceVersion"], "9");
    assert_eq!(rewritten["kind"], "WidgetList");
}

#[test]
fn a_deep_object_and_a_deep_event_become_stand_ins() {
    let object = decode(&rewrite_answer(&widget("deep", 200)).expect("rewritten"));
    assert_eq!(object["metadata"]["uid"], "u-deep");
    assert_eq!(
        object["metadata"]["annotations"][TOO_DEEP_ANNOTATION],
        TOO_DEEP_REASON
    );
    assert!(object.get("spec").is_none());
    assert!(object["metadata"].get("managedFields").is_none());

    let event = format!(r#"{{"type":"MODIFIED","object":{}}}"#, widget("deep", 200));
    let rewritten = decode(&rewrite_event(&event).expect("rewritten"));
    assert_eq!(rewritten["type"], "MODIFIED");
    assert_eq!(rewritten["object"]["metadata"]["name"], "deep");
    assert_eq!(
        rewritten["object"]["metadata"]["annotations"][TOO_DEEP_ANNOTATION],
        TOO_DEEP_REASON
    );
}

#[test]
fn a_stand_in_without_annotations_gets_them() {
    let object = format!(
        r#"{{"kind":"Widget","metadata":{{"name":"n"}},"spec":{}}}"#,
        nested(150)
    );
    let rewritten = decode(&rewrite_answer(&object).expect("rewritten"));
    assert_eq!(
        rewritten,
        json!({"kind": "Widget", "metadata": {"name": "n",
            "annotations": {TOO_DEEP_ANNOTATION: TOO_DEEP_REASON}}})
    );
}

#[test]
fn the_limit_is_the_deepest_object_kube_rs_reads_in_a_list() {
    let list = |levels: usize| {
        format!(
            r#"{{"apiVersion":"example.com/v1","items":[{}],"kind":"WidgetList","metadata":{{}}}}"#,
            widget("w", levels)
        )
    };
    let at_limit = list(MAX_OBJECT_NESTING);
    assert_eq!(
        Skim::new(&at_limit).skip_nesting(),
        Ok(MAX_OBJECT_NESTING + 2)
    );
    assert!(serde_json::from_str::<Value>(&at_limit).is_ok());
    assert_eq!(rewrite_answer(&at_limit), None);
    let past = list(MAX_OBJECT_NESTING + 1);
    assert!(serde_json::from_str::<Value>(&past).is_err());
    assert!(rewrite_answer(&past).is_some());
    assert!(TOO_DEEP_REASON.contains(&MAX_OBJECT_NESTING.to_string()));
}
