use super::*;

/// `Kubeconfig::load` of `name` in a fresh directory, written with `contents` unless
/// `None`: the error must name that file, with `problem`, and render as
/// `invalid kubeconfig: ` + `shown` (with `{file}` standing for the path), also once
/// turned into an [`Error`] by `?`.
fn check(name: &str, contents: Option<&str>, problem: KubeconfigFileProblem, shown: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(name);
    if let Some(contents) = contents {
        std::fs::write(&file, contents).expect("write");
    }
    let err = Kubeconfig::load(&file).expect_err(name);
    let rendered = err.to_string();
    let KubeconfigFileError {
        path,
        problem: actual,
    } = &err;
    assert_eq!(path, &file, "{name}");
    assert_eq!(actual, &problem, "{name}");
    let shown = shown.replace("{file}", &file.display().to_string());
    assert_eq!(rendered, format!("invalid kubeconfig: {shown}"), "{name}");
    assert_eq!(Error::from(err).to_string(), rendered, "{name}");
}

#[test]
fn a_kubeconfig_file_that_cannot_be_used_is_named_in_the_error() {
    check(
        "absent.kubeconfig",
        None,
        KubeconfigFileProblem::Unreadable("No such file or directory (os error 2)".into()),
        "cannot read {file}: No such file or directory (os error 2)",
    );
    check(
        "broken.kubeconfig",
        Some("apiVersion: v1\nclusters: [oops\n"),
        KubeconfigFileProblem::Invalid(
            "bad YAML: unclosed bracket '[' at line 2, column 11".into(),
        ),
        "{file}: bad YAML: unclosed bracket '[' at line 2, column 11",
    );
}
