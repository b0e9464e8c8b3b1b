//! The deletion policy's CEL expression, evaluated by the cel crate (the interpreter
//! devcluster uses) on DELETE-shaped inputs: `oldObject` set, `object` null.

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Value as CelValue};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => n.as_i64().map(CelValue::Int).unwrap_or(CelValue::Null),
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => CelValue::Map(CelMap::from(
            map.iter()
                .map(|(k, v)| (Key::from(k.as_str()), to_cel(v)))
                .collect::<HashMap<Key, CelValue>>(),
        )),
    }
}

/// `allowed`: the validation passes (deletion allowed).
fn check(old_object: Value, allowed: bool) {
    let env = Arc::new(Env::stdlib());
    let mut ctx = Context::with_env(env.clone());
    ctx.add_variable_from_value("object", CelValue::Null);
    ctx.add_variable_from_value("oldObject", to_cel(&old_object));
    let expr = crproxy_wiring::protection_expression();
    let program = env.compile(&expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let got = program
        .execute(&ctx)
        .unwrap_or_else(|e| panic!("{expr} on {old_object}: {e}"));
    assert_eq!(got, CelValue::Bool(allowed), "{old_object}");
}

#[test]
fn only_labelled_objects_are_protected() {
    check(
        json!({"metadata": {"name": "v1.example.com", "labels": {"vcluster.loft.sh/protected": "resource-proxy"}}}),
        false,
    );
    check(
        json!({"metadata": {"name": "x", "labels": {"vcluster.loft.sh/protected": "resource-proxy", "a": "b"}}}),
        false,
    );
    check(
        json!({"metadata": {"name": "x", "labels": {"vcluster.loft.sh/protected": "other"}}}),
        true,
    );
    check(
        json!({"metadata": {"name": "x", "labels": {"a": "b"}}}),
        true,
    );
    check(json!({"metadata": {"name": "x", "labels": {}}}), true);
    check(json!({"metadata": {"name": "x"}}), true);
}
