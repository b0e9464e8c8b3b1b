//! The sync's kube clients rewrite what an API server answers (tenant content)
//! so that an object nested too deeply reaches kube-rs as a stand-in. Whatever
//! the bytes: never a panic; a rewrite happens only to a text nested deeper than
//! the limit, and what it gives is JSON.

use crproxy_core::deep_objects::{rewrite_answer, rewrite_event, MAX_OBJECT_NESTING};
use crproxy_core::skim::Skim;

fn is_json(text: &str) -> bool {
    let mut skim = Skim::new(text);
    skim.skip().and_then(|()| skim.end()).is_ok()
}

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let Ok(data) = std::str::from_utf8(data) else {
        return;
    };
    let nesting = Skim::new(data).skip_nesting().ok();
    for rewritten in [rewrite_answer(data), rewrite_event(data)]
        .into_iter()
        .flatten()
    {
        assert!(
            nesting.is_some_and(|n| n > MAX_OBJECT_NESTING),
            "rewrote a text nested {nesting:?}"
        );
        assert!(is_json(&rewritten), "not JSON: {rewritten}");
        // A stand-in is shallower than what it replaced.
        let after = Skim::new(&rewritten).skip_nesting().ok();
        assert!(after <= nesting, "{after:?} > {nesting:?}");
    }
}
