use super::*;
use proptest::prelude::*;
use serde::de::IgnoredAny;

/// Whether skipping the whole text succeeds.
fn skims(text: &str) -> bool {
    let mut skim = Skim::new(text);
    skim.skip().and_then(|()| skim.end()).is_ok()
}

/// Whether serde_json accepts the text when it ignores the value.
fn serde_ignores(text: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(text).is_ok()
}

/// Skipping accepts a text exactly when serde_json's ignoring does.
fn check_skip(text: &str, accepted: bool) {
    assert_eq!(skims(text), accepted, "skim of {text:?}");
    assert_eq!(serde_ignores(text), accepted, "serde_json of {text:?}");
}

#[test]
fn skip_accepts_what_serde_json_ignores() {
    for text in [
        "null",
        "true",
        "false",
        "0",
        "-0",
        "12",
        "-12.5e+3",
        "1E9",
        "0.0",
        r#""""#,
        r#""a\"b\\c\/d\b\f\n\r\t\u00e9\uD83D\uDE00""#,
        // A lone surrogate is well formed as an escape; only reading it fails.
        r#""\ud800""#,
        "[]",
        "{}",
        " [ 1 , [ ] , { } , \"x\" ] ",
        r#"{"a":{"b":[{"c":null}]},"d":[1,2,3]}"#,
        "\t\r\n{\"k\" : 1}\n",
        &"[".repeat(500)
            .chars()
            .chain("]".repeat(500).chars())
            .collect::<String>(),
    ] {
        check_skip(text, true);
    }
}

#[test]
fn skip_refuses_what_serde_json_refuses() {
    for text in [
        "",
        " ",
        "nul",
        "nulll",
        "tru",
        "True",
        "01",
        "-",
        "-a",
        "1.",
        "1.e5",
        "1e",
        "1e+",
        ".5",
        "+1",
        r#"""#,
        r#""abc"#,
        r#""a\x""#,
        r#""\u12""#,
        r#""\u12g4""#,
        "\"tab\there\"",
        "\"nul\u{0}\"",
        "[",
        "[1,]",
        "[,1]",
        "[1 2]",
        "]",
        "{",
        "{,}",
        r#"{"a"}"#,
        r#"{"a":}"#,
        r#"{"a":1,}"#,
        r#"{"a":1 "b":2}"#,
        r#"{1:2}"#,
        r#"{"a":1]"#,
        r#"[1}"#,
        "1 2",
        "{} {}",
        &"[".repeat(500),
    ] {
        check_skip(text, false);
    }
}

/// Reads the text as one string, as serde_json would read it into a `String`.
fn check_string(text: &str) {
    let mut skim = Skim::new(text);
    let ours = skim
        .string()
        .map(Cow::into_owned)
        .and_then(|s| skim.end().map(|()| s));
    let theirs = serde_json::from_str::<String>(text);
    assert_eq!(ours.ok(), theirs.ok(), "{text:?}");
}

#[test]
fn strings_read_like_serde_json_reads_them() {
    for text in [
        r#""plain""#,
        r#""with \"quotes\" and \\ and \/""#,
        r#""\b\f\n\r\t""#,
        r#""\u0041\u00e9\u4e2d""#,
        r#""pair \uD83D\uDE00 end""#,
        r#""lone high \uD800""#,
        r#""lone high then text \uD800x""#,
        r#""high then non-low \uD800\u0041""#,
        r#""lone low \uDC00""#,
        r#""high then other escape \uD800\n""#,
        "\"caf\u{e9}\"",
        "\"\u{1F600}\"",
        r#""unterminated"#,
        "\"control\u{1}\"",
    ] {
        check_string(text);
    }
}

#[test]
fn nesting_deeper_than_the_bits_still_matches_each_closer() {
    // Past 128 levels the skip keeps its containers in a Vec: a mixed nesting
    // must close in order there and at the boundary, and a wrong closer at any
    // depth is refused.
    for depth in [127, 128, 129, 300] {
        let open: String = (0..depth)
            .map(|i| if i % 3 == 0 { "{\"k\":" } else { "[" })
            .collect();
        let close: String = (0..depth)
            .rev()
            .map(|i| if i % 3 == 0 { "}" } else { "]" })
            .collect();
        check_skip(&format!("{open}1{close}"), true);
        for wrong in [0, depth / 2, depth - 1] {
            let mut closers: Vec<char> = close.chars().collect();
            closers[wrong] = if closers[wrong] == '}' { ']' } else { '}' };
            let text = format!("{open}1{}", closers.iter().collect::<String>());
            assert!(!skims(&text), "wrong closer {wrong} of {depth}");
        }
    }
}

#[test]
fn strings_without_escapes_are_borrowed() {
    let text = r#""uid-1""#;
    assert!(matches!(
        Skim::new(text).string(),
        Ok(Cow::Borrowed("uid-1"))
    ));
    let escaped = r#""a\nb""#;
    assert!(matches!(Skim::new(escaped).string(), Ok(Cow::Owned(s)) if s == "a\nb"));
}

#[test]
fn walking_an_object_reads_keys_and_chosen_values() {
    let text = r#" {"kind":"Widget","metadata":{"name":"w","labels":{"a":"1"},"n":[1,{"x":2}]},"k\u0065y":null} "#;
    let mut skim = Skim::new(text);
    let mut seen = Vec::new();
    let mut entries = skim.object().expect("an object");
    while let Some(key) = entries.next_key(&mut skim).expect("a key") {
        match key.as_ref() {
            "metadata" => {
                let mut meta = skim.object().expect("metadata");
                while let Some(key) = meta.next_key(&mut skim).expect("a key") {
                    if key == "name" {
                        seen.push(format!("name={}", skim.string().expect("text")));
                    } else {
                        seen.push(format!("skipped {key}"));
                        skim.skip().expect("skip");
                    }
                }
            }
            other => {
                seen.push(format!("{other}: {:?}", skim.peek().expect("kind")));
                skim.skip().expect("skip");
            }
        }
    }
    skim.end().expect("nothing after");
    assert_eq!(
        seen,
        [
            "kind: String",
            "name=w",
            "skipped labels",
            "skipped n",
            "key: Null"
        ]
    );
}

#[test]
fn walking_an_array_visits_each_element() {
    let text = r#"[ "a" , 1 , {"b":[]} ]"#;
    let mut skim = Skim::new(text);
    let mut elements = skim.array().expect("an array");
    let mut kinds = Vec::new();
    while elements.next(&mut skim).expect("an element") {
        kinds.push(skim.peek().expect("kind"));
        skim.skip().expect("skip");
    }
    skim.end().expect("nothing after");
    assert_eq!(kinds, [Kind::String, Kind::Number, Kind::Object]);

    for bad in ["[1,]", "[1 2]", "[,]", "[1"] {
        let mut skim = Skim::new(bad);
        let mut elements = skim.array().expect("an array");
        let walked = (|| {
            while elements.next(&mut skim)? {
                skim.skip()?;
            }
            skim.end()
        })();
        assert!(walked.is_err(), "{bad:?}");
    }
}

#[test]
fn walking_refuses_a_malformed_object() {
    for bad in [
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{"a":1 "b":2}"#,
        r#"{,"a":1}"#,
        r#"{"a":1"#,
        "{\"a\u{1}\":1}",
    ] {
        let mut skim = Skim::new(bad);
        let mut entries = skim.object().expect("an object");
        let walked = (|| {
            while entries.next_key(&mut skim)?.is_some() {
                skim.skip()?;
            }
            skim.end()
        })();
        assert!(walked.is_err(), "{bad:?}");
    }
}

#[test]
fn typed_reads_say_what_they_expected() {
    let mut skim = Skim::new("  7");
    let error = skim.string().expect_err("not a string");
    assert_eq!(error.problem, Problem::ExpectedString);
    assert_eq!(error.at, 2);
    assert_eq!(error.to_string(), "expected a string at byte 2");

    assert_eq!(Skim::new("null").optional_string(), Ok(None));
    assert_eq!(
        Skim::new("\"x\"").optional_string(),
        Ok(Some(Cow::Borrowed("x")))
    );
    assert!(Skim::new("{}").optional_string().is_err());

    let mut skim = Skim::new("[{\"a\":\"b\"}, \"c\"]");
    let mut elements = skim.array().expect("an array");
    assert!(elements.next(&mut skim).expect("first"));
    assert_eq!(skim.string_or_skip(), Ok(None));
    assert!(elements.next(&mut skim).expect("second"));
    assert_eq!(skim.string_or_skip(), Ok(Some(Cow::Borrowed("c"))));
    assert!(!elements.next(&mut skim).expect("end"));

    let mut skim = Skim::new(r#"[[5], {"a": 1}]"#);
    let mut elements = skim.array().expect("an array");
    assert!(elements.next(&mut skim).expect("first"));
    assert!(skim.object_or_skip().expect("skipped").is_none());
    assert!(elements.next(&mut skim).expect("second"));
    let mut entries = skim.object_or_skip().expect("entered").expect("an object");
    assert_eq!(entries.next_key(&mut skim), Ok(Some(Cow::Borrowed("a"))));
    skim.skip().expect("the value");
    assert_eq!(entries.next_key(&mut skim), Ok(None));
    assert!(!elements.next(&mut skim).expect("end"));
    skim.end().expect("nothing after");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any text: skipping agrees with serde_json about whether it is JSON.
    #[test]
    fn skip_agrees_with_serde_json_on_any_text(chars in proptest::collection::vec(
        prop_oneof![
            Just('{'), Just('}'), Just('['), Just(']'), Just('"'), Just('\\'),
            Just(':'), Just(','), Just(' '), Just('0'), Just('1'), Just('-'),
            Just('.'), Just('e'), Just('u'), Just('n'), Just('a'), Just('\u{e9}'),
            any::<char>(),
        ],
        0..40,
    )) {
        let text: String = chars.into_iter().collect();
        prop_assert_eq!(skims(&text), serde_ignores(&text), "{:?}", text);
    }

    /// Any JSON document, however written, is skipped whole.
    #[test]
    fn skip_accepts_every_serialized_document(value in json_value(), pretty in any::<bool>()) {
        let text = if pretty {
            serde_json::to_string_pretty(&value)
        } else {
            serde_json::to_string(&value)
        }.expect("serializable");
        prop_assert!(skims(&text));
        // Cut short by its last byte, it is no longer a whole value.
        if text.len() > 1 && !matches!(value, serde_json::Value::Number(_)) {
            prop_assert!(!skims(&text[..text.len() - 1]));
        }
    }

    /// Any string serde_json writes reads back the same.
    #[test]
    fn strings_round_trip(s in any::<String>()) {
        let text = serde_json::to_string(&s).expect("serializable");
        let mut skim = Skim::new(&text);
        prop_assert_eq!(skim.string().map(Cow::into_owned), Ok(s));
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
