use super::*;

#[test]
fn quoted_writes_what_gos_strconv_quote_writes() {
    let check = |s: &str, expected: &str| assert_eq!(quoted(s), expected, "{s:?}");
    check("", r#""""#);
    check("plain-name", r#""plain-name""#);
    check(r#"a"b\c"#, r#""a\"b\\c""#);
    check("\n\r\t\u{7}\u{8}\u{c}\u{b}", r#""\n\r\t\a\b\f\v""#);
    check("\u{1}\u{1f}\u{7f}", r#""\x01\x1f\x7f""#);
    check("\u{85}", r#""\u0085""#);
    check("\u{fffd}", r#""\ufffd""#);
    check("ünïcødé 名前", "\"ünïcødé 名前\"");
}
