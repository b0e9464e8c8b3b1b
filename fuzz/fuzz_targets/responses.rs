//! How a named GET answer is judged and how its Accept header is rewritten: never a
//! panic; an answer judged owned names this owner in its labels (or, for a Table,
//! in every row); the rewritten Accept only ever asks for JSON.
#![no_main]

use crproxy_core::ownership::{self, Owner, Visibility};
use crproxy_core::precondition::Pin;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let owner = Owner::new("client", "project");
    if ownership::response_visibility(&owner, data) == Visibility::Owned {
        let answer: serde_json::Value = serde_json::from_slice(data).expect("owned means JSON");
        let is_table = answer["kind"] == "Table"
            && answer["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("meta.k8s.io/"));
        let rows = answer.get("rows").and_then(serde_json::Value::as_array);
        match rows {
            Some(rows) if is_table => {
                assert!(rows.iter().all(|r| owner.owns(&r["object"])));
            }
            _ => assert!(owner.owns(&answer)),
        }
        let _ = Pin::of(&answer);
    }
    if let Ok(accept) = std::str::from_utf8(data) {
        let rewritten = ownership::inspectable_accept(Some(accept));
        for range in rewritten.split(',') {
            let essence = range.split(';').next().unwrap_or("").trim();
            assert!(
                essence.eq_ignore_ascii_case("application/json"),
                "{rewritten}"
            );
        }
    }
});
