//! Replays the recorded kube-apiserver 1.32 exchanges
//! (`../shared/reference/kube-apiserver-1.32/record.py`) against a devcluster and
//! requires the same status, headers, framing (chunked or not) and bodies as the
//! recording, except for a short list of known, documented differences.
//!
//! Skipped (with a message) when python3 or the reference directory is missing,
//! except under `CI=true`, where both must be there; `CRPROXY_REFERENCE_DIR`
//! points at another copy of the reference.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Exchanges that legitimately differ, and why.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    ("001-", "the server's own version"),
    ("002-", "the server's own address"),
    ("082-", "the server's own version"),
    (
        "004-",
        "CRD field sets: kube's typed structs omit the '.' marker",
    ),
    (
        "005-",
        "CRD field sets: kube's typed structs omit the '.' marker",
    ),
    (
        "006-",
        "CRD field sets: kube's typed structs omit the '.' marker",
    ),
    (
        "007-",
        "CRD field sets: kube's typed structs omit the '.' marker",
    ),
    (
        "121-",
        "one or two progress bookmarks, depending on timing (as on kube)",
    ),
    ("153-", "bootstrap policy rule order"),
    ("154-", "the API audience of the cluster"),
];

/// Response headers that legitimately differ in one exchange: (exchange, header
/// names in lower case, why). Every other header name is compared for every
/// exchange, those in [`KNOWN_DIFFERENCES`] included.
const HEADER_NAME_DIFFERENCES: &[(&str, &[&str], &str)] = &[
    (
        "015-",
        &["accept-ranges", "last-modified"],
        "kube serves OpenAPI v3 through Go's http.ServeContent; devcluster honours \
         no Range or If-Modified-Since, so it does not announce them",
    ),
    (
        "016-",
        &["accept-ranges", "etag", "last-modified", "vary"],
        "kube serves OpenAPI v3 through Go's http.ServeContent; devcluster honours \
         no Range, If-Modified-Since or If-None-Match there, so it does not announce \
         them (clients fetch a group-version by the index's ?hash= URL)",
    ),
];

/// Header names recorded without values whose presence depends on framing or on
/// time, not on the server's behaviour: framing is compared on its own (chunked
/// or not, see `differences`), and every answer carries a Date.
const FRAMING_OR_TIME_HEADERS: &[&str] = &["content-length", "transfer-encoding", "date"];

/// Exchanges whose framing legitimately differs (chunked on one side only), and
/// why; everything else about them is compared.
const FRAMING_DIFFERENCES: &[(&str, &str)] = &[
    (
        "003-",
        "devcluster serves fewer core resources than kube's 39: its list fits Go's buffer",
    ),
    (
        "008-",
        "devcluster serves fewer groups than kube's 22: its list fits Go's buffer",
    ),
];

fn reference_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("CRPROXY_REFERENCE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidate = manifest.join("../../../shared/reference/kube-apiserver-1.32");
    candidate.join("record.py").exists().then_some(candidate)
}

fn lower_headers(v: &Value) -> BTreeMap<String, Value> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The recorded names of the headers whose values were dropped, in lower case
/// (Go writes them capitalized, hyper in lower case), without
/// [`FRAMING_OR_TIME_HEADERS`].
fn other_header_names(doc: &Value) -> BTreeSet<String> {
    doc["other_header_names"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_ascii_lowercase)
        .filter(|n| !FRAMING_OR_TIME_HEADERS.contains(&n.as_str()))
        .collect()
}

/// How the replayed answer's header names differ from the recorded ones (Audit-Id,
/// Cache-Control, the priority-and-fairness UIDs, X-Content-Type-Options, ETag ...),
/// apart from the names `ignored`: only names were recorded, so only presence is
/// compared.
fn header_name_differences(recorded: &Value, replayed: &Value, ignored: &[&str]) -> Option<String> {
    let names = |doc: &Value| -> BTreeSet<String> {
        other_header_names(doc)
            .into_iter()
            .filter(|n| !ignored.contains(&n.as_str()))
            .collect()
    };
    let (a, b) = (names(recorded), names(replayed));
    if a == b {
        return None;
    }
    Some(format!(
        "header names: missing {:?}, unexpected {:?}",
        a.difference(&b).collect::<Vec<_>>(),
        b.difference(&a).collect::<Vec<_>>()
    ))
}

/// The body with every `managedFields` list in a fixed order: entries written in
/// the same request order can land in different seconds, which reorders them.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let mut v = normalized(v);
                    if k == "managedFields" {
                        if let Some(a) = v.as_array_mut() {
                            a.sort_by_key(|e| {
                                (
                                    e["manager"].to_string(),
                                    e["operation"].to_string(),
                                    e["subresource"].to_string(),
                                )
                            });
                        }
                    }
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        other => other.clone(),
    }
}

/// The first differences between a recorded and a replayed exchange; framing
/// (chunked or not) only when `framing` says so.
fn differences(recorded: &Value, replayed: &Value, framing: bool) -> Vec<String> {
    let (a, b) = (&recorded["response"], &replayed["response"]);
    let mut out = Vec::new();
    if a["status"] != b["status"] {
        out.push(format!("status {} != {}", a["status"], b["status"]));
    }
    let (ha, hb) = (lower_headers(&a["headers"]), lower_headers(&b["headers"]));
    for h in ["content-type", "warning", "retry-after"] {
        if ha.get(h) != hb.get(h) {
            out.push(format!("header {h}: {:?} != {:?}", ha.get(h), hb.get(h)));
        }
    }
    // Only header names were recorded for the rest: kube sends an answer longer
    // than Go's buffer chunked, a shorter one with its length.
    let chunked = |doc: &Value| {
        doc["other_header_names"].as_array().is_some_and(|names| {
            // Go writes header names capitalized, hyper in lower case.
            names.iter().any(|n| {
                n.as_str()
                    .is_some_and(|n| n.eq_ignore_ascii_case("transfer-encoding"))
            })
        })
    };
    if framing && chunked(recorded) != chunked(replayed) {
        out.push(format!(
            "chunked: {} != {}",
            chunked(recorded),
            chunked(replayed)
        ));
    }
    // Trimmed documents (large discovery/OpenAPI) are not comparable whole, and
    // which watch events arrive within the recorder's time window depends on
    // machine load: for watches only the event types must agree where both
    // recordings have events.
    if a.get("stream").is_some() {
        let types = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|e| e["type"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (ta, tb) = (types(&a["body"]), types(&b["body"]));
        let n = ta.len().min(tb.len());
        if ta[..n] != tb[..n] || (ta.is_empty() != tb.is_empty()) {
            out.push(format!("watch events {ta:?} != {tb:?}"));
        }
    } else if recorded.get("trimmed").is_none() && normalized(&a["body"]) != normalized(&b["body"])
    {
        let text = |v: &Value| v.to_string().chars().take(300).collect::<String>();
        out.push(format!(
            "body\n  recorded: {}\n  replayed: {}",
            text(&a["body"]),
            text(&b["body"])
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_kube_exchanges_replay_identically() {
    let skip = |why: &str| {
        assert!(
            !test_support::tool::is_ci(),
            "CI must run the replay, but {why}"
        );
        eprintln!("skipped: {why}");
    };
    let Some(reference) = reference_dir() else {
        return skip("there is no reference directory (set CRPROXY_REFERENCE_DIR)");
    };
    if Command::new("python3").arg("--version").output().is_err() {
        return skip("python3 is not installed");
    }
    test_support::init_crypto();
    let data = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let cluster = devcluster::start(devcluster::DevClusterConfig {
        name: "target".into(),
        data_dir: Some(data.path().to_path_buf()),
        bind: "127.0.0.1".parse().expect("ip"),
        port: 0,
    })
    .await
    .expect("start");
    // The reference was recorded without kube-controller-manager: a deleted
    // namespace stays Terminating with its contents until record.py finalizes it.
    cluster.stop_namespace_controller();
    for (user, group) in [("alice", "developers"), ("bob", "viewers")] {
        cluster.issue_token(user, &[group]).expect("token");
    }
    let ca = data.path().join("ca.crt");
    std::fs::write(&ca, cluster.ca_pem()).expect("ca");

    let script = reference.join("record.py");
    let (port, outdir, datadir) = (
        cluster.addr().port(),
        out.path().to_path_buf(),
        data.path().to_path_buf(),
    );
    let run = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&outdir)
            .env("REF_PORT", port.to_string())
            .env("REF_CA", datadir.join("ca.crt"))
            .env("REF_TOKENS", datadir.join("tokens.csv"))
            .env("REF_KUBECONFIG", datadir.join("admin.kubeconfig"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        // Read on a thread of its own: a script that fills the pipe would block
        // otherwise, and what it said is the failure's explanation.
        let mut stderr = child.stderr.take().expect("piped stderr");
        let said = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        // None: killed at the deadline.
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let said = said.join().unwrap_or_default();
        (status, said)
    });
    let (status, said) = run.await.expect("join");
    assert!(
        status.is_some_and(|s| s.success()),
        "record.py failed ({}); it said:\n{said}",
        status.map_or("still running after 300 s, killed".to_owned(), |s| s
            .to_string())
    );

    let mut mismatches = Vec::new();
    let mut identical = 0;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&reference)
        .expect("reference dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.as_bytes().first().is_some_and(u8::is_ascii_digit))
        })
        .collect();
    files.sort();
    for path in &files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let read = |p: &Path| -> Option<Value> {
            serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
        };
        let (Some(recorded), Some(replayed)) = (read(path), read(&out.path().join(name))) else {
            mismatches.push(format!("{name}: not replayed"));
            continue;
        };
        let framing = !FRAMING_DIFFERENCES.iter().any(|(p, _)| name.starts_with(p));
        let diffs = differences(&recorded, &replayed, framing);
        if diffs.is_empty() {
            identical += 1;
        } else if !KNOWN_DIFFERENCES.iter().any(|(p, _)| name.starts_with(p)) {
            mismatches.push(format!("{name}:\n  {}", diffs.join("\n  ")));
        }
        // Checked apart from the rest, so that an exchange whose body legitimately
        // differs still has to carry the same headers.
        let ignored: Vec<&str> = HEADER_NAME_DIFFERENCES
            .iter()
            .filter(|(p, _, _)| name.starts_with(p))
            .flat_map(|(_, names, _)| names.iter().copied())
            .collect();
        if let Some(diff) = header_name_differences(&recorded, &replayed, &ignored) {
            mismatches.push(format!("{name}:\n  {diff}"));
        }
    }
    cluster.shutdown().await;
    assert!(
        mismatches.is_empty(),
        "{identical} of {} identical; unexpected differences:\n{}",
        files.len(),
        mismatches.join("\n")
    );
    assert!(
        identical + KNOWN_DIFFERENCES.len() >= files.len(),
        "{identical}"
    );
}
