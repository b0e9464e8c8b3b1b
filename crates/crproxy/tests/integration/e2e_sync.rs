//! Custom resource sync end to end: two devclusters (host and tenant), the sync as
//! `crproxy run` starts it, and every check through the real kubectl.

use crate::support;

use std::time::Duration;

use anyhow::{Context, Result};
use crproxy::devsync;
use serde_json::json;
use support::*;

/// Sets the schedule of the tenant's `team/db` Backup and waits for its mirror in
/// `vcluster-client` to carry it.
async fn db_schedule_reaches_the_host(
    tenant: &std::path::Path,
    host: &std::path::Path,
    schedule: &str,
) {
    let patch = json!({"spec": {"schedule": schedule}}).to_string();
    run(
        tenant,
        &[
            "patch",
            "backup",
            "-n",
            "team",
            "db",
            "--type=merge",
            "-p",
            &patch,
        ],
    );
    eventually("the schedule on the host", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
        .filter(|m| m["spec"]["schedule"] == schedule)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_host_mirrors_spec_down_status_up_and_deletes_both_ways() -> Result<()> {
    let env = Env::new().await;
    let sync = env.start("client").await?;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    // The CRD was copied into the tenant, without a conversion webhook.
    let crd = get(tenant, &["crd", "backups.example.org"]).context("CRD copied")?;
    assert_eq!(
        crd["spec"]["versions"][0]["subresources"],
        json!({"status": {}})
    );
    assert_eq!(
        crd["spec"]["versions"][0]["additionalPrinterColumns"][0]["name"],
        "Schedule"
    );
    assert_eq!(crd["spec"]["conversion"]["strategy"], "None");

    ns(tenant, "team");
    apply(tenant, &backup("db", "team", "@daily"));
    let uid =
        get(tenant, &["backup", "-n", "team", "db"]).context("created")?["metadata"]["uid"].clone();
    let mirror = eventually("mirror on the host", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    let a = &mirror["metadata"]["annotations"];
    assert_eq!(a["vcluster.loft.sh/object-name"], "db");
    assert_eq!(a["vcluster.loft.sh/object-namespace"], "team");
    assert_eq!(a["vcluster.loft.sh/object-uid"], uid);
    assert_eq!(
        a["vcluster.loft.sh/object-kind"],
        "example.org/v1, Kind=Backup"
    );
    assert_eq!(a["vcluster.loft.sh/object-host-name"], "db-x-team-x-client");
    assert_eq!(
        a["vcluster.loft.sh/object-host-namespace"],
        "vcluster-client"
    );
    let l = &mirror["metadata"]["labels"];
    assert_eq!(l["vcluster.loft.sh/managed-by"], "client");
    assert_eq!(l["vcluster.loft.sh/namespace"], "team");
    assert_eq!(l["app"], "db");
    assert_eq!(mirror["spec"]["schedule"], "@daily");
    // The patch rewrote the Secret reference to its host name.
    assert_eq!(mirror["spec"]["secretRef"]["name"], "creds-x-team-x-client");

    // Spec flows down.
    db_schedule_reaches_the_host(tenant, host, "@hourly").await;

    // Status flows up through the status subresource.
    run(
        host,
        &[
            "patch",
            "backup",
            "-n",
            "vcluster-client",
            "db-x-team-x-client",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Done"}}"#,
        ],
    );
    eventually("status in the tenant", || {
        get(tenant, &["backup", "-n", "team", "db"]).filter(|t| t["status"]["phase"] == "Done")
    })
    .await;
    // A tenant's edit of status is overwritten by the host's.
    run(
        tenant,
        &[
            "patch",
            "backup",
            "-n",
            "team",
            "db",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Faked"}}"#,
        ],
    );
    eventually("host status restored in the tenant", || {
        get(tenant, &["backup", "-n", "team", "db"]).filter(|t| t["status"]["phase"] == "Done")
    })
    .await;

    // Deleting the tenant object deletes the mirror.
    run(tenant, &["delete", "backup", "-n", "team", "db"]);
    eventually("mirror deleted", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
        .is_none()
        .then_some(())
    })
    .await;

    // Deleting the mirror on the host deletes the tenant object.
    apply(tenant, &backup("web", "team", "@weekly"));
    eventually("second mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "web-x-team-x-client"],
        )
    })
    .await;
    eventually("second mirror recorded", || {
        get(tenant, &["backup", "-n", "team", "web"])
            .filter(|o| !o["metadata"]["annotations"]["crproxy.dev/host-mirror"].is_null())
    })
    .await;
    run(
        host,
        &[
            "delete",
            "backup",
            "-n",
            "vcluster-client",
            "web-x-team-x-client",
        ],
    );
    eventually("tenant object deleted after its mirror", || {
        get(tenant, &["backup", "-n", "team", "web"])
            .is_none()
            .then_some(())
    })
    .await;
    // ... and it is not recreated.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(get(
        host,
        &["backup", "-n", "vcluster-client", "web-x-team-x-client"]
    )
    .is_none());

    // An object carrying a mirror record copied from another object is mirrored, not
    // mistaken for one whose mirror the host deleted.
    apply(
        tenant,
        &backup("copied", "team", "@daily").replace(
            "  labels: {app: db}\n",
            "  labels: {app: db}\n  annotations: {crproxy.dev/host-mirror: \"some-other-uid/some-mirror\"}\n",
        ),
    );
    eventually("mirror of the copied object", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "copied-x-team-x-client"],
        )
    })
    .await;
    assert!(get(tenant, &["backup", "-n", "team", "copied"]).is_some());
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_name_gets_a_stable_hash_suffix() -> Result<()> {
    let env = Env::new().await;
    let sync = env.start("client").await?;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    let namespace = "a-namespace-with-quite-a-long-name";
    ns(tenant, namespace);
    let name = "a-backup-whose-name-alone-is-already-fairly-long";
    apply(tenant, &backup(name, namespace, "@daily"));
    let expected = crproxy_sync::names::host_name(name, namespace, "client");
    assert_eq!(expected.len(), 63);
    // 52 characters of the full name, '-', 10 hex digits of its hash.
    assert!(expected.starts_with(&format!("{name}-x-a-")), "{expected}");
    assert!(
        expected[53..].chars().all(|c| c.is_ascii_hexdigit()),
        "{expected}"
    );
    let mirror = eventually("hashed mirror", || {
        get(host, &["backup", "-n", "vcluster-client", &expected])
    })
    .await;
    assert_eq!(
        mirror["metadata"]["annotations"]["vcluster.loft.sh/object-name"],
        name
    );
    assert_eq!(
        mirror["metadata"]["annotations"]["vcluster.loft.sh/object-host-name"],
        expected.as_str()
    );
    // Exactly one mirror.
    let list = get(host, &["backup", "-n", "vcluster-client"]).context("list")?;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    run(tenant, &["delete", "backup", "-n", namespace, name]);
    eventually("hashed mirror deleted", || {
        get(host, &["backup", "-n", "vcluster-client", &expected])
            .is_none()
            .then_some(())
    })
    .await;
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_host_copies_merge_tenant_edits_and_remove_tenant_objects() -> Result<()> {
    let env = Env::new().await;
    let sync = env.start("client").await?;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    assert!(
        get(tenant, &["crd", "sharedstores.example.org"]).is_some(),
        "CRD copied"
    );

    apply(host, &store("main", "eu", 1));
    eventually("copy in the tenant", || {
        get(tenant, &["sharedstore", "main"]).filter(|s| s["spec"]["region"] == "eu")
    })
    .await;

    // A tenant edit of a field stays while the host leaves that field alone...
    run(
        tenant,
        &[
            "patch",
            "sharedstore",
            "main",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":9}}"#,
        ],
    );
    run(
        host,
        &[
            "patch",
            "sharedstore",
            "main",
            "--type=merge",
            "-p",
            r#"{"spec":{"region":"us"}}"#,
        ],
    );
    let copy = eventually("host region in the tenant", || {
        get(tenant, &["sharedstore", "main"]).filter(|s| s["spec"]["region"] == "us")
    })
    .await;
    assert_eq!(copy["spec"]["size"], 9, "tenant edit kept: {copy}");
    // ... and is overwritten once the host changes the same field.
    run(
        host,
        &[
            "patch",
            "sharedstore",
            "main",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":2}}"#,
        ],
    );
    eventually("host size wins", || {
        get(tenant, &["sharedstore", "main"]).filter(|s| s["spec"]["size"] == 2)
    })
    .await;

    // A tenant-created object of the type disappears.
    apply(tenant, &store("mine", "eu", 1));
    eventually("tenant-created store removed", || {
        get(tenant, &["sharedstore", "mine"])
            .is_none()
            .then_some(())
    })
    .await;

    // A tenant-deleted copy comes back.
    run(tenant, &["delete", "sharedstore", "main"]);
    eventually("copy recreated", || {
        get(tenant, &["sharedstore", "main"]).filter(|s| s["spec"]["size"] == 2)
    })
    .await;

    // A host object that is some tenant's toHost mirror is not offered as a copy.
    apply(
        host,
        &store("mirrored", "eu", 1).replace(
            "metadata:\n",
            "metadata:\n  labels: {vcluster.loft.sh/managed-by: other}\n",
        ),
    );
    apply(host, &store("after-mirrored", "eu", 1));
    eventually("a later store copied", || {
        get(tenant, &["sharedstore", "after-mirrored"])
    })
    .await;
    assert!(
        get(tenant, &["sharedstore", "mirrored"]).is_none(),
        "mirrors are skipped"
    );

    // A host delete removes the copy.
    run(host, &["delete", "sharedstore", "main"]);
    eventually("copy deleted", || {
        get(tenant, &["sharedstore", "main"])
            .is_none()
            .then_some(())
    })
    .await;
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_from_host_follows_mappings() -> Result<()> {
    let env = Env::new().await;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    // A namespaced fromHost type: the Backup type, from host namespace "shared".
    let yaml = format!(
        "client: {{name: client, project: default, kubeconfig: {}}}\nsync:\n  host: {{kubeconfig: {}, namespace: vcluster-client}}\n  fromHost:\n    customResources:\n      backups.example.org:\n        enabled: true\n        scope: Namespaced\n        mappings:\n          byName:\n            \"shared/*\": team\n            \"shared/special\": \"ops/renamed\"\n",
        tenant.display(),
        host.display()
    );
    let sync = env
        .start_with("client", tenant, "vcluster-client", Some(yaml))
        .await?;
    ns(host, "shared");
    ns(host, "unmapped");
    apply(host, &backup("db", "shared", "@daily"));
    apply(host, &backup("special", "shared", "@daily"));
    apply(host, &backup("other", "unmapped", "@daily"));
    let copy = eventually("copy in team (namespace created)", || {
        get(tenant, &["backup", "-n", "team", "db"])
    })
    .await;
    assert_eq!(
        copy["metadata"]["annotations"]["vcluster.loft.sh/object-host-namespace"],
        "shared"
    );
    eventually("renamed copy", || {
        get(tenant, &["backup", "-n", "ops", "renamed"])
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get(tenant, &["backup", "-n", "team", "special"]).is_none(),
        "mapped one by one only"
    );
    assert!(get(tenant, &["backup", "-A"]).context("list")?["items"]
        .as_array()
        .is_some_and(|i| i.len() == 2));
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_on_one_host_namespace_never_touch_each_others_mirrors() -> Result<()> {
    let env = Env::new().await;
    let second = test_support::devcluster("tenant-b").await;
    let host = &env.host.kubeconfig;
    let (a, b) = (&env.tenant.kubeconfig, &second.kubeconfig);
    // Tenant names chosen so that two different objects translate to the same host
    // name: "a-x-b" in namespace "c" of tenant "d", and "a" in namespace "b" of
    // tenant "c-x-d" are both "a-x-b-x-c-x-d".
    let sync_a = env.start_with("d", a, "shared-tenants", None).await?;
    // A tenant name with "-x-" is refused beside `patches` (its references could
    // name another tenant's host objects): tenant c-x-d syncs Backups without
    // them, which is all this test needs of it.
    let patches = "        patches:\n          - path: spec.secretRef.name\n            reference: {apiVersion: v1, kind: Secret}\n";
    let config = env.config_text("c-x-d", b, "shared-tenants");
    anyhow::ensure!(config.contains(patches), "the dev config's patches moved");
    let sync_b = env
        .start_with(
            "c-x-d",
            b,
            "shared-tenants",
            Some(config.replace(patches, "")),
        )
        .await?;
    ns(a, "c");
    ns(b, "b");
    apply(a, &backup("a-x-b", "c", "@daily"));
    let mirror = eventually("tenant d's mirror", || {
        get(host, &["backup", "-n", "shared-tenants", "a-x-b-x-c-x-d"])
    })
    .await;
    assert_eq!(
        mirror["metadata"]["labels"]["vcluster.loft.sh/managed-by"],
        "d"
    );
    apply(b, &backup("a", "b", "@hourly"));
    // Ordinary objects of both tenants sync side by side.
    ns(a, "team");
    ns(b, "team");
    apply(a, &backup("app", "team", "@daily"));
    apply(b, &backup("app", "team", "@hourly"));
    eventually("both ordinary mirrors", || {
        let x = get(host, &["backup", "-n", "shared-tenants", "app-x-team-x-d"])?;
        let y = get(
            host,
            &["backup", "-n", "shared-tenants", "app-x-team-x-c-x-d"],
        )?;
        Some((x, y))
    })
    .await;
    // Tenant c-x-d never overwrote tenant d's object under the shared name.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still =
        get(host, &["backup", "-n", "shared-tenants", "a-x-b-x-c-x-d"]).context("still there")?;
    assert_eq!(
        still["metadata"]["labels"]["vcluster.loft.sh/managed-by"],
        "d"
    );
    assert_eq!(still["spec"]["schedule"], "@daily");
    assert_eq!(still["metadata"]["uid"], mirror["metadata"]["uid"]);
    // Tenant c-x-d deleting its object does not delete tenant d's mirror; tenant d's
    // status never reaches tenant c-x-d.
    run(
        host,
        &[
            "patch",
            "backup",
            "-n",
            "shared-tenants",
            "a-x-b-x-c-x-d",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Done"}}"#,
        ],
    );
    eventually("status reaches d", || {
        get(a, &["backup", "-n", "c", "a-x-b"]).filter(|o| o["status"]["phase"] == "Done")
    })
    .await;
    assert!(get(b, &["backup", "-n", "b", "a"]).context("b's object")?["status"].is_null());
    run(b, &["delete", "backup", "-n", "b", "a"]);
    run(b, &["delete", "backup", "-n", "team", "app"]);
    eventually("b's ordinary mirror deleted", || {
        get(
            host,
            &["backup", "-n", "shared-tenants", "app-x-team-x-c-x-d"],
        )
        .is_none()
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get(host, &["backup", "-n", "shared-tenants", "a-x-b-x-c-x-d"]).is_some(),
        "d's mirror survives"
    );
    assert!(get(host, &["backup", "-n", "shared-tenants", "app-x-team-x-d"]).is_some());
    // A host object carrying neither tenant's identity is never touched either.
    apply(
        host,
        &backup("stranger-x-team-x-d", "shared-tenants", "@yearly"),
    );
    apply(a, &backup("stranger", "team", "@daily"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stranger = get(
        host,
        &["backup", "-n", "shared-tenants", "stranger-x-team-x-d"],
    )
    .context("stranger")?;
    assert_eq!(stranger["spec"]["schedule"], "@yearly");
    assert!(stranger["metadata"]["annotations"]
        .get("vcluster.loft.sh/object-uid")
        .is_none());
    sync_a.stop().await;
    sync_b.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_while_the_syncer_is_down_converge_on_restart_and_a_vanished_mirror_is_recreated(
) -> Result<()> {
    let env = Env::new().await;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    let sync = env.start("client").await?;
    ns(tenant, "team");
    for name in ["gone-in-tenant", "gone-on-host", "kept", "recreated"] {
        apply(tenant, &backup(name, "team", "@daily"));
    }
    apply(host, &store("hosted", "eu", 1));
    eventually("four mirrors and a copy", || {
        let n = get(host, &["backup", "-n", "vcluster-client"])?["items"]
            .as_array()?
            .len();
        let copied = get(tenant, &["sharedstore", "hosted"]).is_some();
        (n == 4 && copied).then_some(())
    })
    .await;
    // Wait until the mirror uids are remembered in the tenant.
    eventually("mirror uid recorded", || {
        get(tenant, &["backup", "-n", "team", "gone-on-host"])
            .filter(|o| !o["metadata"]["annotations"]["crproxy.dev/host-mirror"].is_null())
    })
    .await;
    sync.stop().await;

    run(
        tenant,
        &["delete", "backup", "-n", "team", "gone-in-tenant"],
    );
    run(
        host,
        &[
            "delete",
            "backup",
            "-n",
            "vcluster-client",
            "gone-on-host-x-team-x-client",
        ],
    );
    run(host, &["delete", "sharedstore", "hosted"]);
    // Deleted and created again under the same name: a new uid.
    run(tenant, &["delete", "backup", "-n", "team", "recreated"]);
    apply(tenant, &backup("recreated", "team", "@weekly"));
    let new_uid = get(tenant, &["backup", "-n", "team", "recreated"]).context("recreated")?
        ["metadata"]["uid"]
        .clone();

    let sync = env.start("client").await?;
    eventually("orphaned mirror collected", || {
        get(
            host,
            &[
                "backup",
                "-n",
                "vcluster-client",
                "gone-in-tenant-x-team-x-client",
            ],
        )
        .is_none()
        .then_some(())
    })
    .await;
    // A mirror that vanished while no syncer watched is indistinguishable from one
    // the host lost (a restored backup): the tenant object is kept and mirrored again.
    let recreated_mirror = eventually("the vanished mirror created again", || {
        get(
            host,
            &[
                "backup",
                "-n",
                "vcluster-client",
                "gone-on-host-x-team-x-client",
            ],
        )
    })
    .await;
    let kept =
        get(tenant, &["backup", "-n", "team", "gone-on-host"]).context("tenant object kept")?;
    assert_eq!(
        recreated_mirror["metadata"]["annotations"]["vcluster.loft.sh/object-uid"],
        kept["metadata"]["uid"]
    );
    eventually("the new mirror recorded", || {
        get(tenant, &["backup", "-n", "team", "gone-on-host"]).filter(|o| {
            o["metadata"]["annotations"]["crproxy.dev/host-mirror"]
                .as_str()
                .is_some_and(|r| {
                    r.ends_with(recreated_mirror["metadata"]["uid"].as_str().unwrap_or("-"))
                })
        })
    })
    .await;
    eventually("copy of the deleted host store removed", || {
        get(tenant, &["sharedstore", "hosted"])
            .is_none()
            .then_some(())
    })
    .await;
    assert!(get(
        host,
        &["backup", "-n", "vcluster-client", "kept-x-team-x-client"]
    )
    .is_some());
    assert!(get(tenant, &["backup", "-n", "team", "kept"]).is_some());
    // The mirror of the old incarnation was replaced by one of the new.
    let mirror = eventually("mirror of the new incarnation", || {
        get(
            host,
            &[
                "backup",
                "-n",
                "vcluster-client",
                "recreated-x-team-x-client",
            ],
        )
        .filter(|m| m["metadata"]["annotations"]["vcluster.loft.sh/object-uid"] == new_uid)
    })
    .await;
    assert_eq!(mirror["spec"]["schedule"], "@weekly");
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_the_host_does_not_serve_fails_start_up_naming_it() -> Result<()> {
    let env = Env::new().await;
    let yaml = format!(
        "client: {{name: client, project: default, kubeconfig: {}}}\nsync:\n  host: {{kubeconfig: {}, namespace: vcluster-client}}\n  toHost:\n    customResources:\n      widgets.nowhere.example/v1:\n        enabled: true\n",
        env.tenant.kubeconfig.display(),
        env.host.kubeconfig.display()
    );
    let err = match env
        .start_with(
            "client",
            &env.tenant.kubeconfig,
            "vcluster-client",
            Some(yaml),
        )
        .await
    {
        Ok(_) => panic!("start-up must fail"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("sync.toHost.customResources[\"widgets.nowhere.example/v1\"]"),
        "{err}"
    );
    assert!(
        err.contains("does not serve widgets.nowhere.example"),
        "{err}"
    );
    assert!(!err.contains('\n'), "one line: {err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_entry_stops_its_syncer_at_the_next_start_and_deletes_nothing() -> Result<()> {
    let env = Env::new().await;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    let sync = env.start("client").await?;
    ns(tenant, "team");
    apply(tenant, &backup("db", "team", "@daily"));
    eventually("mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    sync.stop().await;

    let yaml = env
        .config_text("client", tenant, "vcluster-client")
        .replacen(
            "      backups.example.org/v1:\n        enabled: true",
            "      backups.example.org/v1:\n        enabled: false",
            1,
        );
    assert!(yaml.contains("enabled: false"));
    let sync = env
        .start_with("client", tenant, "vcluster-client", Some(yaml))
        .await?;
    // The dev configuration's other types (SharedStores, Gateways) stay synced.
    assert!(
        sync.resolved
            .iter()
            .all(|t| t.resource.key != "backups.example.org/v1"),
        "Backups are no longer synced"
    );
    run(tenant, &["delete", "backup", "-n", "team", "db"]);
    apply(tenant, &backup("new", "team", "@daily"));
    // The SharedStore syncer runs; use it to know the sync is up.
    apply(host, &store("marker", "eu", 1));
    eventually("fromHost still syncing", || {
        get(tenant, &["sharedstore", "marker"])
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"]
        )
        .is_some(),
        "nothing deleted"
    );
    assert!(
        get(
            host,
            &["backup", "-n", "vcluster-client", "new-x-team-x-client"]
        )
        .is_none(),
        "no longer synced"
    );
    assert!(
        get(tenant, &["crd", "backups.example.org"]).is_some(),
        "the CRD stays"
    );
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_upgrade_adds_the_version_and_moves_storage() -> Result<()> {
    let env = Env::new().await;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    let sync = env.start("client").await?;
    ns(tenant, "team");
    apply(tenant, &backup("db", "team", "@daily"));
    eventually("mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    sync.stop().await;

    // The host gains v2 as its storage version.
    let mut crd = get(host, &["crd", "backups.example.org"]).context("host CRD")?;
    let mut v2 = crd["spec"]["versions"][0].clone();
    v2["name"] = json!("v2");
    crd["spec"]["versions"][0]["storage"] = json!(false);
    crd["spec"]["versions"]
        .as_array_mut()
        .context("versions")?
        .push(v2);
    apply(host, &serde_json::to_string(&crd)?);

    let yaml = env
        .config_text("client", tenant, "vcluster-client")
        .replace("backups.example.org/v1:", "backups.example.org/v2:");
    let sync = env
        .start_with("client", tenant, "vcluster-client", Some(yaml))
        .await?;
    let copied = get(tenant, &["crd", "backups.example.org"]).context("tenant CRD")?;
    let versions = copied["spec"]["versions"].as_array().context("versions")?;
    let by_name = |n: &str| {
        versions
            .iter()
            .find(|v| v["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(versions.len(), 2, "{copied}");
    assert_eq!(by_name("v2")["storage"], true);
    assert_eq!(by_name("v1")["storage"], false);
    assert_eq!(by_name("v1")["served"], true, "served left as it was");
    // Objects still sync, now through v2.
    apply(
        tenant,
        &backup("db2", "team", "@daily").replace("example.org/v1", "example.org/v2"),
    );
    let mirror = eventually("v2 mirror", || {
        get(
            host,
            &[
                "backup.v2.example.org",
                "-n",
                "vcluster-client",
                "db2-x-team-x-client",
            ],
        )
    })
    .await;
    assert_eq!(
        mirror["metadata"]["annotations"]["vcluster.loft.sh/object-kind"],
        "example.org/v2, Kind=Backup"
    );
    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_clients_work_with_token_and_certificate_kubeconfigs() -> Result<()> {
    let cluster = test_support::devcluster("host").await;
    let cert = cluster.kubeconfig_with_cert("sync-user", &["system:masters"])?;
    for kubeconfig in [&cluster.kubeconfig, &cert] {
        let client = crate::support::access(kubeconfig)?.kube_client()?;
        let versions = client.list_core_api_versions().await?;
        assert!(
            versions.versions.contains(&"v1".to_owned()),
            "{kubeconfig:?}"
        );
    }

    // A token file rotated under a running client: the next recheck sends the new
    // token, so revoking the old one costs no request.
    let token_file = cluster.dir.path().join("sync.token");
    let old_token = cluster
        .cluster
        .issue_token("sync-rotating", &["system:masters"])?;
    std::fs::write(&token_file, &old_token)?;
    let mut config = crproxy_kube::ClusterConfig::from_kubeconfig(
        &crproxy_kube::Kubeconfig::load(&cluster.kubeconfig)?,
        None,
    )?;
    config.auth = crproxy_kube::Auth::TokenFile(token_file.clone());
    let credentials = crproxy_kube::Credentials::new(config.auth.clone(), json!(null))?
        .with_file_recheck(Duration::from_millis(200));
    let client = crproxy_kube::kube_client(&config, std::sync::Arc::new(credentials), "default")?;
    client.list_core_api_versions().await?;
    let new_token = cluster
        .cluster
        .issue_token("sync-rotating", &["system:masters"])?;
    std::fs::write(token_file.with_extension("new"), &new_token)?;
    std::fs::rename(token_file.with_extension("new"), &token_file)?;
    for _ in 0..20 {
        client.list_core_api_versions().await?;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    cluster.cluster.revoke_token(&old_token)?;
    client
        .list_core_api_versions()
        .await
        .context("the rotated token is in use")?;

    // A kubeconfig whose CA does not match is refused.
    let other = test_support::devcluster("other").await;
    let wrong_ca = cluster.dir.path().join("wrong-ca.kubeconfig");
    std::fs::write(
        &wrong_ca,
        other
            .cluster
            .admin_kubeconfig()
            .replace(&other.cluster.url(), &cluster.cluster.url()),
    )?;
    let client = crate::support::access(&wrong_ca)?.kube_client()?;
    let err = match client.list_core_api_versions().await {
        Ok(_) => panic!("TLS must fail with the wrong CA"),
        Err(e) => format!("{e:?}"),
    };
    assert!(
        err.contains("UnknownIssuer") || err.to_lowercase().contains("certificate"),
        "{err}"
    );
    Ok(())
}

/// A Backup whose spec nests `levels` objects deep, as JSON for kubectl.
fn deep_backup(name: &str, namespace: &str, levels: usize) -> String {
    let spec = format!("{}1{}", r#"{"a":"#.repeat(levels), "}".repeat(levels));
    format!(
        r#"{{"apiVersion":"example.org/v1","kind":"Backup","metadata":{{"name":"{name}","namespace":"{namespace}"}},"spec":{spec}}}"#
    )
}

/// One tenant object nested deeper than kube-rs reads in a list (kube stores
/// such objects) once failed the syncer's list, so no Backup of the tenant
/// synced at all. Now it is left alone and reported, and the others sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_nested_too_deeply_is_reported_and_the_rest_of_its_type_syncs() -> Result<()> {
    let env = Env::new().await;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    // A first start copies the CRD into the tenant.
    let first = env.start("client").await?;
    eventually("the CRD in the tenant", || {
        get(tenant, &["crd", "backups.example.org"])
    })
    .await;
    first.stop().await;
    ns(tenant, "team");
    // 126 levels: the spec's 125 plus the object; in a list, 128.
    let deep = deep_backup("deep", "team", 125);
    let out = test_support::kubectl_stdin(
        tenant,
        &["create", "-f", "-"],
        Some(&deep),
        test_support::KUBECTL_TIMEOUT,
    );
    assert!(out.success(), "kubectl create: {}", out.stderr);
    apply(tenant, &backup("db", "team", "@daily"));
    // The next start lists both.
    let metrics = crproxy_sync::SyncMetrics::new();
    let sync = env
        .start_full(
            "client",
            tenant,
            devsync::HOST_NAMESPACE,
            None,
            std::sync::Arc::clone(&metrics),
        )
        .await?;
    eventually("the shallow Backup's mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let too_deep = r#"vcluster_syncer_errors_total{resource="backups.example.org/v1",direction="toHost",reason="too_deep"}"#;
    eventually("the deep Backup reported", || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).ok()?;
        text.lines()
            .any(|l| l.starts_with(too_deep) && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    assert!(
        get(
            host,
            &["backup", "-n", "vcluster-client", "deep-x-team-x-client"]
        )
        .is_none(),
        "the deep Backup was mirrored from its stand-in"
    );
    // A change to another object still syncs: the syncer is not stuck.
    db_schedule_reaches_the_host(tenant, host, "@hourly").await;
    sync.stop().await;
    Ok(())
}
