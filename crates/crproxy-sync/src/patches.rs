//! `patches`: fields that hold the name of another object in the same namespace, which
//! are rewritten to that object's host name on the way to the host (and back where
//! the host writes such a field, e.g. in status).

use crproxy_core::config::sync::{FieldPath, PathStep};
use serde_json::Value;

/// Calls `rewrite` on every string the path reaches in `object` and stores its
/// result there. Missing fields and non-string values are left alone.
pub fn rewrite_strings(object: &mut Value, path: &FieldPath, rewrite: &dyn Fn(&str) -> String) {
    let infallible = |s: &str| Ok::<_, std::convert::Infallible>(rewrite(s));
    let Ok(()) = try_rewrite_strings(object, path, &infallible);
}

/// [`rewrite_strings`] with a `rewrite` that may refuse a string: the first
/// refusal is returned, and `object` is then only partly rewritten (its caller
/// drops it).
pub fn try_rewrite_strings<E>(
    object: &mut Value,
    path: &FieldPath,
    rewrite: &dyn Fn(&str) -> Result<String, E>,
) -> Result<(), E> {
    visit(object, &path.steps, rewrite)
}

fn visit<E>(
    value: &mut Value,
    steps: &[PathStep],
    rewrite: &dyn Fn(&str) -> Result<String, E>,
) -> Result<(), E> {
    let Some((step, rest)) = steps.split_first() else {
        if let Value::String(s) = value {
            *s = rewrite(s)?;
        }
        return Ok(());
    };
    match (step, value) {
        (PathStep::Key(k), Value::Object(m)) => {
            if let Some(v) = m.get_mut(k) {
                visit(v, rest, rewrite)?;
            }
        }
        (PathStep::Each, Value::Array(a)) => {
            for v in a {
                visit(v, rest, rewrite)?;
            }
        }
        (PathStep::Index(i), Value::Array(a)) => {
            if let Some(v) = a.get_mut(*i) {
                visit(v, rest, rewrite)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(path: &str, mut object: Value, want: Value) {
        let path = FieldPath::parse(path).expect("valid path");
        rewrite_strings(&mut object, &path, &|s| format!("{s}-x-ns-x-t"));
        assert_eq!(object, want, "{}", path.text);
    }

    #[test]
    fn rewrites_what_the_path_reaches() {
        check(
            "spec.secretRef.name",
            json!({"spec": {"secretRef": {"name": "creds"}, "other": "creds"}}),
            json!({"spec": {"secretRef": {"name": "creds-x-ns-x-t"}, "other": "creds"}}),
        );
        check(
            "spec.volumes[*].secret",
            json!({"spec": {"volumes": [{"secret": "a"}, {"secret": "b"}, {"x": 1}]}}),
            json!({"spec": {"volumes": [{"secret": "a-x-ns-x-t"}, {"secret": "b-x-ns-x-t"}, {"x": 1}]}}),
        );
        check(
            "spec.names[1]",
            json!({"spec": {"names": ["a", "b"]}}),
            json!({"spec": {"names": ["a", "b-x-ns-x-t"]}}),
        );
        // Absent fields, wrong shapes and non-strings are left alone.
        check(
            "spec.missing.name",
            json!({"spec": {}}),
            json!({"spec": {}}),
        );
        check(
            "spec.n",
            json!({"spec": {"n": 3}}),
            json!({"spec": {"n": 3}}),
        );
        check(
            "spec.l[*]",
            json!({"spec": {"l": "x"}}),
            json!({"spec": {"l": "x"}}),
        );
    }
}
