use super::*;
use proptest::prelude::*;

/// `Ok(canonical text)` or `Err(message)`.
fn check(input: &str, expected: Result<&str, &str>) {
    let got = LabelSelector::parse(input)
        .map(|s| s.to_string())
        .map_err(|e| e.to_string());
    let expected = expected.map(str::to_owned).map_err(str::to_owned);
    assert_eq!(got, expected, "input: {input:?}");
}

const NAME_PART_REGEX: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const VALUE_REGEX: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

#[test]
fn parses_valid_selectors() {
    let rows: &[(&str, &str)] = &[
        ("", ""),
        ("   ", ""),
        ("a", "a"),
        ("!a", "!a"),
        ("! a", "!a"),
        ("a=b", "a=b"),
        ("a = b", "a=b"),
        ("a==b", "a==b"),
        ("a!=b", "a!=b"),
        ("a=", "a="),
        ("a!=", "a!="),
        ("a=,b", "a=,b"),
        ("a in (x)", "a in (x)"),
        ("a in (y,x,x)", "a in (x,y)"),
        ("a in ()", "a in ()"),
        ("a in (,x)", "a in (,x)"),
        ("a in (x,)", "a in (,x)"),
        ("a in (x,,y)", "a in (,x,y)"),
        ("a notin (x, y)", "a notin (x,y)"),
        ("a in(x)", "a in (x)"),
        ("z,a,m=1", "a,m=1,z"),
        ("b=2,a=1,b!=3", "a=1,b=2,b!=3"),
        ("example.com/app=web", "example.com/app=web"),
        ("a.b-c_d=E.f-G_h", "a.b-c_d=E.f-G_h"),
        ("in=notin", "in=notin"),
        ("in in (in)", "in in (in)"),
        ("notin", "notin"),
        ("a>5", "a>5"),
        ("a<05", "a<05"),
        ("a\t=\nb\r", "a=b"),
        (
            "app in (cron),tier notin (frontend)",
            "app in (cron),tier notin (frontend)",
        ),
    ];
    for (input, canonical) in rows {
        check(input, Ok(canonical));
    }
}

#[test]
fn rejects_like_kube() {
    let rows: &[(&str, String)] = &[
        // Recorded: reference/kube-apiserver-1.32/105 and 106.
        (
            "app in (cron",
            "unable to parse requirement: found '', expected: ',' or ')'".into(),
        ),
        (
            "app=bad value!",
            "found 'value', expected: ',' or 'end of string'".into(),
        ),
        ("a,", "found '', expected: identifier after ','".into()),
        ("a,,b", "found ',', expected: identifier after ','".into()),
        (",a", "found ',', expected: !, identifier, or 'end of string'".into()),
        ("=a", "found '=', expected: !, identifier, or 'end of string'".into()),
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt".into()),
        ("a in x", "unable to parse requirement: found 'x' expected: '('".into()),
        ("a in (x y)", "unable to parse requirement: found 'y', expected: ',' or ')'".into()),
        ("a in (=)", "unable to parse requirement: found '=', expected: ',', ')' or identifier".into()),
        ("a in (x,,)", "unable to parse requirement: found ')', expected: ',', or identifier".into()),
        ("a=(b", "unable to parse requirement: found '(', expected: identifier".into()),
        ("!=a", "found '!=', expected: !, identifier, or 'end of string'".into()),
        ("! =a", "unable to parse requirement: found '=', expected: identifier".into()),
        ("!a=b", "found '=', expected: ',' or 'end of string'".into()),
        ("a=b c", "found 'c', expected: ',' or 'end of string'".into()),
        (
            "a b=c",
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt".into(),
        ),
        (
            "app:web",
            format!("unable to parse requirement: <nil>: Invalid value: \"app:web\": {NAME_PART_REGEX}"),
        ),
        (
            "/a",
            "unable to parse requirement: <nil>: Invalid value: \"/a\": prefix part must be non-empty".into(),
        ),
        (
            "a/",
            format!("unable to parse requirement: <nil>: Invalid value: \"a/\": name part must be non-empty; {NAME_PART_REGEX}"),
        ),
        (
            "Example.com/a",
            "unable to parse requirement: <nil>: Invalid value: \"Example.com/a\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
        ),
        (
            "a/b/c",
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into(),
        ),
        (
            &"k".repeat(64),
            format!("unable to parse requirement: <nil>: Invalid value: \"{}\": name part must be no more than 63 characters", "k".repeat(64)),
        ),
        (
            "a=-b",
            format!("unable to parse requirement: values[0][a]: Invalid value: \"-b\": {VALUE_REGEX}"),
        ),
        (
            &format!("a={}", "v".repeat(64)),
            format!("unable to parse requirement: values[0][a]: Invalid value: \"{}\": must be no more than 63 characters", "v".repeat(64)),
        ),
        (
            "a in (ok,_x,y_)",
            format!("unable to parse requirement: [values[0][a]: Invalid value: \"_x\": {VALUE_REGEX}, values[2][a]: Invalid value: \"y_\": {VALUE_REGEX}]"),
        ),
        (
            "a>x",
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
        ),
        (
            "a=b\"c",
            format!("unable to parse requirement: values[0][a]: Invalid value: \"b\\\"c\": {VALUE_REGEX}"),
        ),
    ];
    for (input, message) in rows {
        check(input, Err(message));
    }
}

#[test]
fn nul_byte_ends_input_like_go() {
    // apimachinery's lexer uses 0 as its end sentinel; we must read such input the
    // same way the target will.
    check("\0a=b", Ok(""));
    check("a\0", Ok("a"));
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn matching() {
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
    let rows: &[Row] = &[
        ("", &[], true),
        ("a", &[("a", "")], true),
        ("a", &[], false),
        ("!a", &[], true),
        ("!a", &[("a", "x")], false),
        ("a=x", &[("a", "x")], true),
        ("a==x", &[("a", "y")], false),
        ("a=", &[("a", "")], true),
        ("a=", &[], false),
        ("a!=x", &[], true),
        ("a!=x", &[("a", "x")], false),
        ("a!=x", &[("a", "y")], true),
        ("a in (x,y)", &[("a", "y")], true),
        ("a in (x,y)", &[("a", "z")], false),
        ("a in (x,y)", &[], false),
        ("a notin (x,y)", &[], true),
        ("a notin (x,y)", &[("a", "x")], false),
        ("a>5", &[("a", "6")], true),
        ("a>5", &[("a", "5")], false),
        ("a>5", &[("a", "z")], false),
        ("a<5", &[("a", "-1")], true),
        ("a=x,b=y", &[("a", "x"), ("b", "y")], true),
        ("a=x,b=y", &[("a", "x")], false),
    ];
    for (sel, lbls, want) in rows {
        let s = LabelSelector::parse(sel).expect("valid row");
        assert_eq!(s.matches(&labels(lbls)), *want, "{sel} on {lbls:?}");
    }
}

#[test]
fn matching_json() {
    let s = LabelSelector::parse("a=x,!b").expect("valid");
    let v = serde_json::json!({"a": "x"});
    assert!(s.matches_json(Some(&v)));
    assert!(!s.matches_json(None));
    assert!(!s.matches_json(Some(&serde_json::Value::Null)));
    let v = serde_json::json!({"a": "x", "b": "1"});
    assert!(!s.matches_json(Some(&v)));
    // A non-string label value counts as absent.
    let v = serde_json::json!({"a": 1});
    assert!(!s.matches_json(Some(&v)));
    assert!(LabelSelector::parse("!a")
        .expect("valid")
        .matches_json(Some(&serde_json::json!({"a": 1}))));
}

#[test]
fn everything_and_and() {
    assert!(LabelSelector::everything().is_empty());
    assert!(LabelSelector::everything().matches(&BTreeMap::new()));
    let a = LabelSelector::parse("z=1").expect("valid");
    let b = LabelSelector::parse("a=2").expect("valid");
    let both = a.and(b);
    assert_eq!(both.to_string(), "a=2,z=1");
    assert_eq!(both.requirements().len(), 2);
}

#[test]
fn requirement_new_validates() {
    assert!(Requirement::new("a", Operator::In, vec![]).is_err());
    assert!(Requirement::new("a", Operator::Equals, vec!["x".into(), "y".into()]).is_err());
    assert!(Requirement::new("a", Operator::Exists, vec!["x".into()]).is_err());
    assert!(Requirement::new("a b", Operator::Exists, vec![]).is_err());
    let r = Requirement::new("a", Operator::In, vec!["y".into(), "x".into(), "y".into()])
        .expect("valid");
    assert_eq!(r.values, vec!["x".to_owned(), "y".to_owned()]);
    // The parser's requirement: values read as a set, then checked.
    let parsed = LabelSelector::parse("a in (y,x,y)").expect("valid");
    assert_eq!(parsed.requirements(), [r]);
}

/// What `LabelSelectorAsSelector(selector).String()` gives for a LabelSelector
/// object: `Ok(None)` for kube's `Nothing()`.
fn check_object(selector: serde_json::Value, expected: Result<Option<&str>, &str>) {
    let got = LabelSelector::from_object(&selector)
        .map(|s| s.map(|s| s.to_string()))
        .map_err(|e| e.to_string());
    let expected = expected
        .map(|s| s.map(str::to_owned))
        .map_err(str::to_owned);
    assert_eq!(got, expected, "selector: {selector}");
}

#[test]
fn label_selector_objects_read_as_kube_s_label_selector_as_selector() {
    use serde_json::json;
    check_object(json!(null), Ok(None));
    check_object(json!({}), Ok(Some("")));
    check_object(
        json!({"matchLabels": {}, "matchExpressions": []}),
        Ok(Some("")),
    );
    check_object(
        json!({"matchLabels": {"tier": "web", "app": "d"}}),
        Ok(Some("app=d,tier=web")),
    );
    check_object(
        json!({"matchLabels": {"z": "1"}, "matchExpressions": [
            {"key": "env", "operator": "NotIn", "values": ["prod", "dev"]},
            {"key": "a", "operator": "In", "values": ["y", "x", "y"]},
            {"key": "gone", "operator": "DoesNotExist"},
            {"key": "z", "operator": "Exists"},
        ]}),
        Ok(Some("a in (x,y,y),env notin (dev,prod),!gone,z=1,z")),
    );
    check_object(
        json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        Err("\"Gt\" is not a valid label selector operator"),
    );
    check_object(
        json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
        Err("values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty"),
    );
    check_object(
        json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x", "y"]}]}),
        Err("values: Invalid value: []string{\"x\", \"y\"}: values set must be empty for exists and does not exist"),
    );
    check_object(
        json!({"matchLabels": {"bad key": "v"}}),
        Err(&format!(
            "key: Invalid value: \"bad key\": {NAME_PART_REGEX}"
        )),
    );
    check_object(
        json!({"matchLabels": {"k": "bad value!"}}),
        Err(&format!(
            "values[0][k]: Invalid value: \"bad value!\": {VALUE_REGEX}"
        )),
    );
}

fn check_field(input: &str, expected: Result<&str, &str>) {
    let got = FieldSelector::parse(input)
        .map(|s| s.to_string())
        .map_err(|e| e.to_string());
    let expected = expected.map(str::to_owned).map_err(str::to_owned);
    assert_eq!(got, expected, "input: {input:?}");
}

#[test]
fn field_selectors() {
    let rows: &[(&str, Result<&str, &str>)] = &[
        ("", Ok("")),
        ("metadata.name=x", Ok("metadata.name=x")),
        ("metadata.name==x", Ok("metadata.name=x")),
        ("metadata.name!=x", Ok("metadata.name!=x")),
        ("b=1,a=2", Ok("a=2,b=1")),
        ("a=1,,b=2", Ok("a=1,b=2")),
        ("a=", Ok("a=")),
        ("a=x\\,y", Ok("a=x\\,y")),
        ("a=x\\=y\\\\", Ok("a=x\\=y\\\\")),
        // Recorded: reference/kube-apiserver-1.32/107.
        (
            "metadata.name",
            Err("invalid selector: 'metadata.name'; can't understand 'metadata.name'"),
        ),
        (
            "a=1,b",
            Err("invalid selector: 'a=1,b'; can't understand 'b'"),
        ),
        (
            "a=x\\y",
            Err("invalid field selector: invalid escape sequence: \\y"),
        ),
        (
            "a=x\\",
            Err("invalid field selector: invalid escape sequence: \\"),
        ),
        (
            "a=x=y",
            Err("invalid field selector: unescaped character in value: 61"),
        ),
        (
            "a!==x",
            Err("invalid field selector: unescaped character in value: 61"),
        ),
    ];
    for (input, want) in rows {
        check_field(input, *want);
    }
}

#[test]
fn field_matching() {
    let sel =
        FieldSelector::parse("metadata.name=a,metadata.namespace!=kube-system").expect("valid");
    let obj = |name: &'static str, ns: Option<&'static str>| {
        move |f: &str| match f {
            "metadata.name" => Some(name.to_owned()),
            "metadata.namespace" => ns.map(str::to_owned),
            _ => None,
        }
    };
    assert!(sel.matches(obj("a", Some("default"))));
    assert!(sel.matches(obj("a", None)));
    assert!(!sel.matches(obj("a", Some("kube-system"))));
    assert!(!sel.matches(obj("b", Some("default"))));
    assert_eq!(sel.requires_exact_match("metadata.name"), Some("a"));
    assert_eq!(sel.requires_exact_match("metadata.namespace"), None);
    // Absent field compares as "".
    let empty = FieldSelector::parse("spec.x=").expect("valid");
    assert!(empty.matches(|_| None));
}

// ---------------------------------------------------------------------------------
// Properties.

fn key_strategy() -> impl Strategy<Value = String> {
    let name = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,6}[A-Za-z0-9])?";
    prop_oneof![
        3 => prop::sample::select(vec!["a", "b", "app", "in", "notin", "x.io/y"]).prop_map(str::to_owned),
        2 => proptest::string::string_regex(name).expect("regex"),
        1 => (proptest::string::string_regex("[a-z0-9]{1,4}(\\.[a-z0-9]{1,4}){0,2}").expect("regex"),
              proptest::string::string_regex(name).expect("regex"))
            .prop_map(|(p, n)| format!("{p}/{n}")),
    ]
}

fn value_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["", "x", "y", "in", "1", "20"]).prop_map(str::to_owned),
        1 => proptest::string::string_regex("([A-Za-z0-9]([-A-Za-z0-9_.]{0,6}[A-Za-z0-9])?)?").expect("regex"),
    ]
}

fn requirement_strategy() -> impl Strategy<Value = Requirement> {
    let ops = prop::sample::select(vec![
        Operator::Equals,
        Operator::DoubleEquals,
        Operator::NotEquals,
        Operator::In,
        Operator::NotIn,
        Operator::Exists,
        Operator::DoesNotExist,
        Operator::GreaterThan,
        Operator::LessThan,
    ]);
    (
        key_strategy(),
        ops,
        prop::collection::vec(value_strategy(), 1..4),
        0i64..50,
    )
        .prop_map(|(key, op, values, n)| {
            let values = match op {
                Operator::Exists | Operator::DoesNotExist => vec![],
                Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                    values.into_iter().take(1).collect()
                }
                Operator::GreaterThan | Operator::LessThan => vec![n.to_string()],
                Operator::In | Operator::NotIn => values,
            };
            Requirement::new(key, op, values).expect("generated requirement is valid")
        })
}

fn selector_strategy() -> impl Strategy<Value = LabelSelector> {
    prop::collection::vec(requirement_strategy(), 0..5).prop_map(LabelSelector::from_requirements)
}

fn labels_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["a", "b", "app", "in", "notin", "x.io/y"])
            .prop_map(str::to_owned),
        prop::sample::select(vec!["", "x", "y", "in", "1", "20", "z"]).prop_map(str::to_owned),
        0..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn display_parse_round_trip(sel in selector_strategy()) {
        let text = sel.to_string();
        let back = LabelSelector::parse(&text);
        prop_assert_eq!(back, Ok(sel), "text: {}", text);
    }

    #[test]
    fn and_matches_iff_both_match(a in selector_strategy(), b in selector_strategy(), l in labels_strategy()) {
        let both = a.clone().and(b.clone());
        prop_assert_eq!(both.matches(&l), a.matches(&l) && b.matches(&l));
        // The conjunction also survives a trip through its text, which is what the
        // proxy sends to the target.
        let reparsed = LabelSelector::parse(&both.to_string()).expect("canonical text parses");
        prop_assert_eq!(reparsed.matches(&l), both.matches(&l));
    }

    #[test]
    fn parse_never_panics(s in ".{0,40}") {
        let _ = LabelSelector::parse(&s);
        let _ = FieldSelector::parse(&s);
    }

    #[test]
    fn parse_of_symbol_soup_is_stable(s in "[a-c!=(), \tin]{0,24}") {
        // Whatever parses must print to something that parses to the same selector.
        if let Ok(sel) = LabelSelector::parse(&s) {
            prop_assert_eq!(LabelSelector::parse(&sel.to_string()), Ok(sel));
        }
    }

    #[test]
    fn field_round_trip(fields in prop::collection::vec(("[a-z.]{1,8}", any::<bool>(), ".{0,8}"), 0..4)) {
        let text = fields
            .iter()
            .map(|(f, neg, v)| FieldRequirement { field: f.clone(), negated: *neg, value: v.clone() }.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let parsed = FieldSelector::parse(&text).expect("escaped text parses");
        let again = FieldSelector::parse(&parsed.to_string()).expect("canonical parses");
        prop_assert_eq!(&again, &parsed);
        prop_assert_eq!(parsed.requirements().len(), fields.len());
    }
}
