//! Heavy sync scenarios: a 500-object burst with the syncer killed in the middle, and
//! leader failover between two sync replicas. Slower than `e2e_sync`, so kept apart.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use support::*;
use test_support::{kubectl_stdin, KUBECTL_TIMEOUT};

/// The burst size.
const BURST: usize = 500;

fn mirrors(env: &Env) -> Option<Vec<serde_json::Value>> {
    get(&env.host.kubeconfig, &["backup", "-n", "vcluster-client"])?["items"]
        .as_array()
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_500_with_a_syncer_crash_in_the_middle_converges_without_duplicates() -> Result<()>
{
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    ns(&tenant, "burst");
    let first = env.start("client").await?;
    let list: String = (0..BURST)
        .map(|i| backup(&format!("b-{i:03}"), "burst", "@daily"))
        .collect::<Vec<_>>()
        .join("---\n");
    // One kubectl creates the objects one by one while the syncer works.
    let started = std::time::Instant::now();
    let creator = std::thread::spawn(move || {
        kubectl_stdin(
            &tenant,
            &["create", "-f", "-"],
            Some(&list),
            KUBECTL_TIMEOUT * 3,
        )
    });
    // Kill the syncer (no clean shutdown) once part of the burst is mirrored.
    eventually_within(Duration::from_secs(120), "the first mirrors", || {
        mirrors(&env).filter(|m| m.len() >= 20)
    })
    .await;
    first.crash();
    let created_while_down = mirrors(&env).map(|m| m.len()).unwrap_or_default();
    let second = env.start("client").await?;
    let out = tokio::task::spawn_blocking(move || creator.join())
        .await?
        .map_err(|_| anyhow::anyhow!("kubectl thread panicked"))?;
    assert!(out.success(), "kubectl create: {}", out.stderr);
    let tenant_objects =
        get(&env.tenant.kubeconfig, &["backup", "-n", "burst"]).context("tenant list")?;
    let uids: BTreeMap<String, String> = tenant_objects["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(uids.len(), BURST);
    let all = eventually_within(Duration::from_secs(120), "every object mirrored", || {
        mirrors(&env).filter(|m| m.len() >= BURST)
    })
    .await;
    let converged = started.elapsed();
    // Give a duplicate a chance to show up, then look again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all_again = mirrors(&env).context("mirrors")?;
    assert_eq!(all.len(), BURST, "no duplicates");
    assert_eq!(all_again.len(), BURST, "no duplicates later either");
    let mut seen = BTreeSet::new();
    for m in &all_again {
        let a = &m["metadata"]["annotations"];
        let name = a["vcluster.loft.sh/object-name"]
            .as_str()
            .context("object-name")?;
        assert!(seen.insert(name.to_owned()), "two mirrors of {name}");
        assert_eq!(
            a["vcluster.loft.sh/object-uid"].as_str(),
            uids.get(name).map(String::as_str),
            "{name}"
        );
    }
    // A measurement for humans, not an assertion.
    eprintln!(
        "mirrors when the syncer was killed: {created_while_down}; all {} mirrored {:.1} s after the burst started",
        all_again.len(),
        converged.as_secs_f64()
    );
    second.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_syncs_and_a_standby_takes_over_when_it_dies() -> Result<()> {
    let env = Env::new().await;
    let (host, tenant) = (env.host.kubeconfig.clone(), env.tenant.kubeconfig.clone());
    let yaml = crproxy::devsync::sync_only_config("client", &tenant, &host);
    let lease = Duration::from_secs(3);
    let start = |id: &'static str| {
        let yaml = yaml.clone();
        async move {
            Env::start_from_yaml(&yaml, id, lease)
                .await
                .map(|h| h.expect("sync enabled"))
        }
    };
    let a = start("a").await?;
    let b = start("b").await?;
    let a_leads = eventually("exactly one leader", || {
        match (a.is_leader(), b.is_leader()) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    })
    .await;
    let (leader, standby) = if a_leads { (a, b) } else { (b, a) };
    ns(&tenant, "team");
    apply(&tenant, &backup("before", "team", "@daily"));
    eventually("mirror by the leader", || {
        get(
            &host,
            &["backup", "-n", "vcluster-client", "before-x-team-x-client"],
        )
    })
    .await;
    assert!(!standby.is_leader(), "never two leaders");
    leader.crash();
    eventually_within(lease * 4, "the standby leads", || {
        standby.is_leader().then_some(())
    })
    .await;
    apply(&tenant, &backup("after", "team", "@daily"));
    eventually("mirror by the new leader", || {
        get(
            &host,
            &["backup", "-n", "vcluster-client", "after-x-team-x-client"],
        )
    })
    .await;
    standby.stop().await;
    Ok(())
}
