use super::*;
use crproxy_core::pki::CertificateAuthority;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A directory holding a CA and a client certificate it issued, as PEM files and
/// as the base64 values kubeconfig `*-data` fields take.
struct Material {
    dir: tempfile::TempDir,
    ca: String,
    cert: String,
    key: String,
    other_key: String,
}

fn material() -> Material {
    let ca = CertificateAuthority::generate("test-ca").expect("ca");
    let client = ca.issue_client("admin", &[]).expect("client");
    let other = ca.issue_client("other", &[]).expect("client");
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, contents) in [
        ("ca.crt", ca.pem().cert.as_str()),
        ("client.crt", client.cert.as_str()),
        ("client.key", client.key.as_str()),
        ("ca-twice.crt", &b64(ca.pem().cert.as_bytes())),
        ("not-pem.crt", "hello\n"),
    ] {
        std::fs::write(dir.path().join(name), contents).expect("write");
    }
    Material {
        dir,
        ca: ca.pem().cert.clone(),
        cert: client.cert,
        key: client.key,
        other_key: other.key,
    }
}

/// `ClusterConfig::from_kubeconfig` of a kubeconfig with this cluster and user
/// (YAML flow mappings; `{dir}` stands for the material's directory, which relative
/// paths resolve against): the server URL, or the error.
fn check(m: &Material, cluster: &str, user: &str, expected: Result<&str, &str>) {
    let dir = m.dir.path().display().to_string();
    let yaml = format!(
        "clusters: [{{name: c, cluster: {cluster}}}]\n\
         users: [{{name: admin, user: {user}}}]\n\
         contexts: [{{name: x, context: {{cluster: c, user: admin}}}}]\n\
         current-context: x\n"
    )
    .replace("{dir}", &dir);
    let mut kc = Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    kc.base_dir = Some(m.dir.path().to_path_buf());
    let actual = ClusterConfig::from_kubeconfig(&kc, None)
        .map(|c| c.server.to_string())
        .map_err(|e| e.to_string());
    let expected = expected
        .map(str::to_owned)
        .map_err(|e| format!("invalid kubeconfig: {}", e.replace("{dir}", &dir)));
    assert_eq!(actual, expected, "cluster {cluster}, user {user}");
}

#[test]
fn tls_material_that_is_not_pem_is_named_by_its_field() {
    let m = material();
    let ca = b64(m.ca.as_bytes());
    let with_ca =
        |server: &str| format!("{{server: '{server}', certificate-authority-data: {ca}}}");
    let server = with_ca("https://127.0.0.1:6443");
    let inline = |cert: &str, key: &str| {
        format!(
            "{{client-certificate-data: {}, client-key-data: {}}}",
            b64(cert.as_bytes()),
            b64(key.as_bytes())
        )
    };
    check(
        &m,
        &server,
        &inline(&m.cert, &m.key),
        Ok("https://127.0.0.1:6443/"),
    );
    check(
        &m,
        &format!("{{server: 'https://h:6443', certificate-authority-data: {}}}", b64(ca.as_bytes())),
        "{}",
        Err("clusters[c].cluster.certificate-authority-data: holds no PEM certificate (base64-encoded twice?)"),
    );
    check(
        &m,
        "{server: 'https://h:6443', certificate-authority: not-pem.crt}",
        "{}",
        Err(
            "clusters[c].cluster.certificate-authority: {dir}/not-pem.crt holds no PEM certificate",
        ),
    );
    check(
        &m,
        "{server: 'https://h:6443', certificate-authority: ca-twice.crt}",
        "{}",
        Err("clusters[c].cluster.certificate-authority: {dir}/ca-twice.crt holds no PEM certificate (the file holds base64: write the decoded PEM text)"),
    );
    check(
        &m,
        "{server: 'https://h:6443', certificate-authority-data: 'not base64!'}",
        "{}",
        Err("clusters[c].cluster.certificate-authority-data: is not valid base64: Invalid symbol 33, offset 9."),
    );
    check(
        &m,
        &server,
        &inline(&b64(m.cert.as_bytes()), &m.key),
        Err("users[admin].user.client-certificate-data: holds no PEM certificate (base64-encoded twice?)"),
    );
    check(
        &m,
        &server,
        &inline(&m.cert, "-----BEGIN PRIVATE KEY-----\n"),
        Err("users[admin].user.client-key-data: is not a valid PEM private key: there is no \"-----END PRIVATE KEY-----\" line (cut short?)"),
    );
    check(
        &m,
        &server,
        &inline(&m.cert, &m.other_key),
        Err("users[admin].user.client-key-data: is not the private key of the certificate in users[admin].user.client-certificate-data"),
    );
    check(
        &m,
        &server,
        "{client-certificate: client.crt, client-key: client.key}",
        Ok("https://127.0.0.1:6443/"),
    );
    check(
        &m,
        &server,
        "{client-certificate: client.key, client-key: client.key}",
        Err("users[admin].user.client-certificate: {dir}/client.key holds no PEM certificate"),
    );
    check(
        &m,
        &server,
        "{client-certificate: client.crt, client-key: absent.key}",
        Err("users[admin].user.client-key: cannot read {dir}/absent.key: No such file or directory (os error 2)"),
    );
}

/// A server without a scheme is https when there is TLS material, as in client-go;
/// without any it is refused (client-go would use plain http).
#[test]
fn server_urls_are_read_as_kubectl_reads_them() {
    let m = material();
    let ca = b64(m.ca.as_bytes());
    let with_ca =
        |server: &str| format!("{{server: '{server}', certificate-authority-data: {ca}}}");
    let no_scheme =
        "\"127.0.0.1:6443\" has no scheme and the cluster has no certificate-authority: \
         write https://127.0.0.1:6443 and add the API server's CA, or http://127.0.0.1:6443 for a \
         plain-HTTP server";
    for (cluster, user, expected) in [
        (with_ca("127.0.0.1:6443"), "{}", Ok::<_, String>("https://127.0.0.1:6443/")),
        (with_ca("localhost:6443"), "{}", Ok("https://localhost:6443/")),
        (with_ca("[::1]:6443"), "{}", Ok("https://[::1]:6443/")),
        (with_ca("api.example.com"), "{}", Ok("https://api.example.com/")),
        (with_ca("https://h:6443/prefix"), "{}", Ok("https://h:6443/prefix")),
        ("{server: 'http://127.0.0.1:8001'}".into(), "{}", Ok("http://127.0.0.1:8001/")),
        (
            "{server: '127.0.0.1:6443', insecure-skip-tls-verify: true}".into(),
            "{}",
            Ok("https://127.0.0.1:6443/"),
        ),
        ("{server: '127.0.0.1:6443'}".into(), "{}", Err(format!("clusters[c].cluster.server: {no_scheme}"))),
        (
            with_ca(""),
            "{}",
            Err("clusters[c].cluster.server: is not set: write the API server's URL, for example https://127.0.0.1:6443".into()),
        ),
        (
            "{certificate-authority-data: x}".into(),
            "{}",
            Err("clusters[c].cluster.server: is not set: write the API server's URL, for example https://127.0.0.1:6443".into()),
        ),
        (
            with_ca("ftp://h:6443"),
            "{}",
            Err("clusters[c].cluster.server: \"ftp://h:6443\" has the scheme \"ftp\": the API server is reached over https".into()),
        ),
        (
            with_ca("https://"),
            "{}",
            Err("clusters[c].cluster.server: \"https://\" is not a valid URL: empty host".into()),
        ),
        (
            with_ca("h:6443/prefix"),
            "{}",
            Err("clusters[c].cluster.server: \"h:6443/prefix\" is neither a URL nor a host:port: write it as https://HOST:PORT".into()),
        ),
    ] {
        check(&m, &cluster, user, expected.as_deref().map_err(String::as_str));
    }
}

#[test]
fn exec_commands_are_found_as_starting_them_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("plugin");
    std::fs::write(&plugin, "#!/bin/sh\n").expect("write");
    let data = dir.path().join("data");
    std::fs::write(&data, "").expect("write");
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let exec = |command: &Path, hint: Option<&str>| ExecConfig {
        command: command.to_path_buf(),
        args: Vec::new(),
        env: Vec::new(),
        api_version: None,
        provide_cluster_info: false,
        install_hint: hint.map(str::to_owned),
    };
    let path_var = std::env::join_paths(["/nonexistent".as_ref(), dir.path()]).expect("PATH");
    let locate = |command: &str, hint: Option<&str>| {
        exec(Path::new(command), hint).locate_in(Some(&path_var))
    };
    let shown = dir.path().display();
    assert_eq!(locate("plugin", None), Ok(plugin.clone()));
    assert_eq!(
        locate(&plugin.display().to_string(), None),
        Ok(plugin.clone())
    );
    assert_eq!(
        locate(
            "gke-gcloud-auth-plugin",
            Some("Install it with\n  gcloud components install")
        ),
        Err(
            "\"gke-gcloud-auth-plugin\" is not on PATH (Install it with gcloud components install)"
                .into()
        )
    );
    // An empty hint (kubeconfigs write `installHint: ""`) adds nothing.
    assert_eq!(
        locate("absent", Some(" \n")),
        Err("\"absent\" is not on PATH".into())
    );
    // A file that is there but cannot be run is not what PATH lookup finds.
    assert_eq!(locate("data", None), Err("\"data\" is not on PATH".into()));
    assert_eq!(
        locate(&format!("{shown}/absent"), None),
        Err(format!("\"{shown}/absent\" does not exist"))
    );
    assert_eq!(
        locate(&format!("{shown}/data"), None),
        Err(format!("\"{shown}/data\" is not an executable file"))
    );
    assert_eq!(
        exec(Path::new("plugin"), None).locate_in(None),
        Err("\"plugin\" is not on PATH".into())
    );
}
