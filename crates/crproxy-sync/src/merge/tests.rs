use super::*;
use serde_json::json;

fn check(base: Value, host: Value, tenant: Value, want: Value) {
    let got = three_way(Some(&base), Some(&host), Some(&tenant));
    assert_eq!(got, Some(want), "base {base}\nhost {host}\ntenant {tenant}");
}

#[test]
fn tenant_edits_stay_until_the_host_changes_the_same_field() {
    // Tenant edited size; host unchanged: the edit stays.
    check(
        json!({"spec": {"size": 1, "tier": "gold"}}),
        json!({"spec": {"size": 1, "tier": "gold"}}),
        json!({"spec": {"size": 5, "tier": "gold"}}),
        json!({"spec": {"size": 5, "tier": "gold"}}),
    );
    // Host changed another field: the tenant's edit stays, the host's change lands.
    check(
        json!({"spec": {"size": 1, "tier": "gold"}}),
        json!({"spec": {"size": 1, "tier": "silver"}}),
        json!({"spec": {"size": 5, "tier": "gold"}}),
        json!({"spec": {"size": 5, "tier": "silver"}}),
    );
    // Host changed the same field: the host wins.
    check(
        json!({"spec": {"size": 1}}),
        json!({"spec": {"size": 2}}),
        json!({"spec": {"size": 5}}),
        json!({"spec": {"size": 2}}),
    );
    // Host removed a field the tenant edited: removed.
    check(
        json!({"spec": {"size": 1, "tier": "gold"}}),
        json!({"spec": {"tier": "gold"}}),
        json!({"spec": {"size": 5, "tier": "gold"}}),
        json!({"spec": {"tier": "gold"}}),
    );
    // Host added a field; tenant added another: both.
    check(
        json!({"spec": {}}),
        json!({"spec": {"a": 1}}),
        json!({"spec": {"b": 2}}),
        json!({"spec": {"a": 1, "b": 2}}),
    );
    // Tenant deleted a field the host did not change: stays deleted.
    check(
        json!({"spec": {"a": 1, "b": 2}}),
        json!({"spec": {"a": 1, "b": 2}}),
        json!({"spec": {"a": 1}}),
        json!({"spec": {"a": 1}}),
    );
    // Lists are one field.
    check(
        json!({"spec": {"l": [1, 2]}}),
        json!({"spec": {"l": [1, 3]}}),
        json!({"spec": {"l": [9]}}),
        json!({"spec": {"l": [1, 3]}}),
    );
    // A field that changes type on the host is taken whole.
    check(
        json!({"spec": {"x": {"a": 1}}}),
        json!({"spec": {"x": "flat"}}),
        json!({"spec": {"x": {"a": 2}}}),
        json!({"spec": {"x": "flat"}}),
    );
}

#[test]
fn without_a_base_the_host_wins() {
    let host = json!({"spec": {"a": 1}});
    let tenant = json!({"spec": {"a": 2, "b": 3}});
    assert_eq!(three_way(None, Some(&host), Some(&tenant)), Some(host));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Small JSON documents: nested mappings over a few keys, leaves of a few values.
    fn doc() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!(1)),
            Just(json!(2)),
            Just(json!("a")),
            Just(json!([1, 2])),
            Just(Value::Null),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop::collection::btree_map(prop::sample::select(vec!["a", "b", "c"]), inner, 0..3)
                .prop_map(|m| {
                    Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                })
        })
    }

    proptest! {
        #[test]
        fn an_unchanged_host_keeps_the_tenant(base in doc(), tenant in doc()) {
            prop_assert_eq!(three_way(Some(&base), Some(&base), Some(&tenant)), Some(tenant));
        }

        #[test]
        fn an_unedited_copy_follows_the_host(base in doc(), host in doc()) {
            prop_assert_eq!(three_way(Some(&base), Some(&host), Some(&base)), Some(host));
        }

        #[test]
        fn agreeing_sides_stay_agreed(base in doc(), both in doc()) {
            prop_assert_eq!(three_way(Some(&base), Some(&both), Some(&both)), Some(both));
        }
    }
}
