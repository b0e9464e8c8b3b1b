//! `crproxy doctor`: the troubleshooting verdict table of the operations guide,
//! computed instead of read.
//!
//! Given the client cluster (and optionally the proxy's credentials on the target
//! and its metrics URL), every proxied group/version — found by the protection
//! label on its APIService — is checked piece by piece along the path a request
//! takes: APIService, Service and endpoints, protection, leader, discovery, target
//! credentials, peers, quarantines, request outcomes. Each check reports ok, warn
//! or fail with the evidence and the runbook step that applies; any fail makes the
//! command exit non-zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::future::Future;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceCondition,
};
use kube::api::{Api, ListParams, PostParams};
use serde::Serialize;
use serde_json::{json, Value};

use crproxy_core::exposition::{self, Sample};
use crproxy_core::names;
use crproxy_kube::Error as KubeError;

/// How long any single request of the doctor may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `crproxy doctor` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Kubeconfig of the client cluster (admin or read-only view of APIServices,
    /// Services, EndpointSlices, Leases and admission policies).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Kubeconfig the proxy uses for the target (the crproxy-target-kubeconfig
    /// Secret): checks that the target accepts it and what it may do.
    #[arg(long)]
    pub target_kubeconfig: Option<PathBuf>,
    /// The proxy's metrics URL, e.g. http://10.0.0.7:9090/metrics/syncer.
    #[arg(long, value_parser = metrics_url_arg)]
    pub metrics_url: Option<String>,
    /// The client's name (`client.name` in the proxy's configuration): the leader
    /// check then reads the registration Lease by its exact name. Without it, the
    /// check takes the Lease named `crproxy-…` that is not the sync's
    /// `crproxy-sync-…` (so a client named `sync-…` needs this flag).
    #[arg(long, value_parser = client_name_arg)]
    pub client_name: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

/// `--metrics-url`, refused before any check runs when [`fetch_metrics`] could
/// not use it (a failed metrics check would blame the pod instead).
fn metrics_url_arg(url: &str) -> std::result::Result<String, String> {
    metrics_address(url)?;
    Ok(url.to_owned())
}

/// `--client-name`, held to the rule of `client.name` in the configuration, so
/// a typo is named as such instead of as a missing Lease.
fn client_name_arg(name: &str) -> std::result::Result<String, String> {
    if name.is_empty() {
        Err("must not be empty: give client.name from the proxy's configuration".to_owned())
    } else if crproxy_core::config::is_dns_label(name) {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "is not a valid client name (client.name): {}",
            crproxy_core::config::DNS_LABEL_SHAPE
        ))
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// The verdict of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One row of the verdict table.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// `<group>/<version>`, or empty for checks that are not per group/version.
    pub group_version: String,
    /// Which piece was checked (`apiservice`, `service`, `peers`, ...).
    pub check: &'static str,
    pub status: Status,
    /// What was observed.
    pub evidence: String,
    /// What to do about it; empty when there is nothing to do.
    pub runbook: String,
}

/// Everything the doctor found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The worst status of all checks.
    pub status: Status,
    /// The triage verdict of the operations guide that the checks point to.
    pub verdict: String,
    pub checks: Vec<Check>,
    /// Checks that were not run, and why (an optional input was not given).
    pub skipped: Vec<String>,
}

impl Report {
    /// The checks of one kind, for one group/version.
    pub fn find(&self, group_version: &str, check: &str) -> Option<&Check> {
        self.checks
            .iter()
            .find(|c| c.group_version == group_version && c.check == check)
    }

    /// Human-readable table: one line per check, the runbook step under each
    /// check that is not ok.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let scope = if c.group_version.is_empty() {
                "-".to_owned()
            } else {
                c.group_version.clone()
            };
            out.push_str(&format!(
                "{:<4}  {:<22} {:<20} {}\n",
                c.status.as_str(),
                scope,
                c.check,
                c.evidence
            ));
            if c.status != Status::Ok && !c.runbook.is_empty() {
                out.push_str(&format!("      -> {}\n", c.runbook));
            }
        }
        for s in &self.skipped {
            out.push_str(&format!("skip  {s}\n"));
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        out.push_str(&format!(
            "verdict: {} ({} check(s), {} failed): {}\n",
            self.status.as_str(),
            self.checks.len(),
            failed,
            self.verdict
        ));
        out
    }
}

/// What the doctor looks at.
pub struct Inputs {
    pub client: kube::Client,
    pub target: Option<kube::Client>,
    pub metrics_url: Option<String>,
    /// `client.name`; see [`DoctorArgs::client_name`].
    pub client_name: Option<String>,
}

impl Inputs {
    /// Loads the kubeconfigs named by the arguments.
    pub fn from_args(args: &DoctorArgs) -> Result<Inputs> {
        Ok(Inputs {
            client: client_from(&args.kubeconfig).context("--kubeconfig")?,
            target: args
                .target_kubeconfig
                .as_deref()
                .map(client_from)
                .transpose()
                .context("--target-kubeconfig")?,
            metrics_url: args.metrics_url.clone(),
            client_name: args.client_name.clone(),
        })
    }
}

fn client_from(path: &Path) -> Result<kube::Client> {
    // The loader's error names the file already.
    let kubeconfig = crproxy_kube::Kubeconfig::load(path)?;
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&kubeconfig, None)
        .with_context(|| format!("using {}", path.display()))?;
    // No retries: the doctor reports what the cluster answers now, and every request
    // is bounded by REQUEST_TIMEOUT (see `bounded`). Every call names its namespace.
    Ok(crproxy_kube::ClusterAccess::new(cluster)?.kube_client_without_retries()?)
}

/// One API request of the doctor, bounded by [`REQUEST_TIMEOUT`]; its error is
/// crproxy-kube's, whose text the evidence of the checks shows.
async fn bounded<T>(request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, KubeError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(answer) => answer.map_err(KubeError::from),
        Err(_) => Err(KubeError::Timeout(format!(
            "no complete response within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

/// The discovery document of a group/version, as served (the fallback document the
/// proxy serves when the target is away need not be a complete `APIResourceList`).
async fn discovery(client: &kube::Client, gv: &str) -> Result<Value, KubeError> {
    let request = http::Request::get(format!("/apis/{gv}"))
        .body(Vec::new())
        .map_err(|e| KubeError::Transport(format!("invalid request for /apis/{gv}: {e}")))?;
    bounded(client.request::<Value>(request)).await
}

/// The namespace and name of the Service an APIService sends requests to (empty when
/// it has none: served locally).
fn service_of(apiservice: &APIService) -> (&str, &str) {
    let service = apiservice
        .spec
        .as_ref()
        .and_then(|spec| spec.service.as_ref());
    (
        service
            .and_then(|s| s.namespace.as_deref())
            .unwrap_or_default(),
        service.and_then(|s| s.name.as_deref()).unwrap_or_default(),
    )
}

/// `crproxy doctor`: prints the table (or JSON); fails when any check fails.
pub async fn run(args: DoctorArgs) -> Result<()> {
    let inputs = Inputs::from_args(&args)?;
    let report = diagnose(&inputs).await?;
    match args.output {
        Format::Text => print!("{}", report.to_text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    if report.status == Status::Fail {
        let failed: Vec<String> = report
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| format!("{} {}", c.group_version, c.check).trim().to_owned())
            .collect();
        bail!("doctor: failing checks: {}", failed.join(", "));
    }
    Ok(())
}

/// Runs every check that the inputs allow.
pub async fn diagnose(inputs: &Inputs) -> Result<Report> {
    let client = &inputs.client;
    let selector = format!(
        "{}={}",
        names::PROTECTION_LABEL_KEY,
        names::PROTECTION_LABEL_VALUE
    );
    // The proxy's APIServices: labelled by the leader, or (label removed by hand)
    // still pointing at a proxy Service in kube-system.
    let apiservices = bounded(Api::<APIService>::all(client.clone()).list(&ListParams::default()))
        .await
        .context("listing APIServices in the client cluster")?;
    let apiservices: Vec<APIService> = apiservices
        .items
        .into_iter()
        .filter(|a| is_protected(&a.metadata) || points_at_proxy_service(a))
        .collect();
    let mut checks = Vec::new();
    let mut skipped = Vec::new();
    if apiservices.is_empty() {
        checks.push(Check {
            group_version: String::new(),
            check: "apiservice",
            status: Status::Fail,
            evidence: format!(
                "no APIService labelled {selector} or served by {}/proxy-*",
                names::SERVICE_NAMESPACE
            ),
            runbook: "no proxy leader has ever registered here: check that the crproxy pods run \
                      (kubectl -n kube-system get pods -l app.kubernetes.io/name=crproxy) and \
                      their logs for configuration or RBAC errors"
                .into(),
        });
    }
    checks.push(check_protection(client).await);
    checks.push(check_leader(client, inputs.client_name.as_deref()).await);
    let metrics = match &inputs.metrics_url {
        Some(url) => match fetch_metrics(url).await {
            Ok(text) => Some(exposition::parse(&text)),
            Err(error) => {
                checks.push(Check {
                    group_version: String::new(),
                    check: "metrics",
                    status: Status::Fail,
                    evidence: format!("{url}: {error:#}"),
                    runbook: "the proxy's metrics listener does not answer: the pod is down \
                              or proxy.metricsAddress differs"
                        .into(),
                });
                None
            }
        },
        None => {
            skipped.push("metrics checks: no --metrics-url".into());
            None
        }
    };
    match &inputs.target {
        None => skipped.push("target checks: no --target-kubeconfig".into()),
        // The target checks below are per group/version: with none found, the
        // credentials are still worth checking, and the rest is said to be skipped.
        Some(target) if apiservices.is_empty() => {
            checks.push(check_target_accepts(target).await);
            skipped.push(
                "target RBAC checks: no proxied group/version found in the client cluster".into(),
            );
        }
        Some(_) => {}
    }
    for apiservice in &apiservices {
        let spec = apiservice.spec.as_ref();
        let group = spec.and_then(|s| s.group.as_deref()).unwrap_or_default();
        let version = spec.and_then(|s| s.version.as_deref()).unwrap_or_default();
        let gv = format!("{group}/{version}");
        checks.push(check_apiservice(&gv, apiservice));
        checks.push(check_service(client, &gv, apiservice).await);
        checks.push(check_protection_labels(client, &gv, apiservice).await);
        let served = discovery(client, &gv).await;
        checks.push(check_discovery(&gv, &served));
        if let Some(target) = &inputs.target {
            checks.extend(check_target(target, &gv, served_resources(&served)).await);
        }
        if let Some(samples) = &metrics {
            checks.extend(check_metrics(samples, &gv));
        }
    }
    let status = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    Ok(Report {
        status,
        verdict: triage(&checks),
        checks,
        skipped,
    })
}

/// The quick-triage verdict: the first broken piece along a request's path
/// decides, from the registration in the client to the peers on the target.
fn triage(checks: &[Check]) -> String {
    let failing = |name: &str| {
        checks
            .iter()
            .any(|c| c.check == name && c.status == Status::Fail)
    };
    let verdicts: [(&str, &str); 13] = [
        ("apiservice", "registration: the APIService does not reach a proxy"),
        ("service", "registration: the proxy Service has no usable backend"),
        ("leader", "no leader: nothing keeps the registration in place"),
        ("protection", "registration objects are not protected against deletion"),
        (
            "protection-label",
            "registration objects lack the protection label",
        ),
        ("discovery", "the client's aggregation layer does not reach the proxy"),
        ("metrics", "the proxy's metrics are unreachable: the pod is down or misconfigured"),
        (
            "target-credentials",
            "the target is down or refuses the proxy's credentials: fix the target or the Secret",
        ),
        ("target-rbac", "the target's RBAC denies the client identity what the proxy needs"),
        (
            "peer-cache",
            "the proxy has no current peer snapshot: restore its peer source first",
        ),
        (
            "peers",
            "proxy-path degradation: the target's endpoints are stale or unreachable from the proxy",
        ),
        ("peer-list-age", "no peer list has arrived yet"),
        (
            "request-deadline",
            "requests reach the target but its responses do not finish within the proxy's \
             60 s cap: look at the target's response path (API server, storage, webhooks), \
             not the peer path",
        ),
    ];
    if let Some((_, verdict)) = verdicts.iter().find(|(name, _)| failing(name)) {
        return (*verdict).to_owned();
    }
    if checks.iter().any(|c| c.status == Status::Warn) {
        return "serving, with warnings: read the runbook step of each warning".to_owned();
    }
    "healthy".to_owned()
}

fn check(gv: &str, check: &'static str, status: Status, evidence: String, runbook: &str) -> Check {
    Check {
        group_version: gv.to_owned(),
        check,
        status,
        evidence,
        runbook: if status == Status::Ok {
            String::new()
        } else {
            runbook.to_owned()
        },
    }
}

fn condition<'a>(apiservice: &'a APIService, kind: &str) -> Option<&'a APIServiceCondition> {
    apiservice
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
}

// ---------------------------------------------------------------- client side

fn is_protected(metadata: &ObjectMeta) -> bool {
    metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(names::PROTECTION_LABEL_KEY))
        .is_some_and(|value| value == names::PROTECTION_LABEL_VALUE)
}

fn points_at_proxy_service(apiservice: &APIService) -> bool {
    let (namespace, name) = service_of(apiservice);
    namespace == names::SERVICE_NAMESPACE && name.starts_with("proxy-")
}

/// Both registration objects carry the protection label the policy matches.
async fn check_protection_labels(
    client: &kube::Client,
    gv: &str,
    apiservice: &APIService,
) -> Check {
    let (namespace, name) = service_of(apiservice);
    let mut unlabelled = Vec::new();
    if !is_protected(&apiservice.metadata) {
        unlabelled.push(format!(
            "APIService {}",
            apiservice.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    if let Ok(Some(service)) = bounded(services.get_opt(name)).await {
        if !is_protected(&service.metadata) {
            unlabelled.push(format!("Service {namespace}/{name}"));
        }
    }
    let label = format!(
        "{}={}",
        names::PROTECTION_LABEL_KEY,
        names::PROTECTION_LABEL_VALUE
    );
    if unlabelled.is_empty() {
        check(
            gv,
            "protection-label",
            Status::Ok,
            format!("APIService and Service labelled {label}"),
            "",
        )
    } else {
        check(
            gv,
            "protection-label",
            Status::Fail,
            format!("without {label}: {}", unlabelled.join(", ")),
            "these objects can be deleted by mistake; the leader labels them again within \
             seconds, so a lasting absence means no leader (see the leader check)",
        )
    }
}

fn check_apiservice(gv: &str, apiservice: &APIService) -> Check {
    let Some(available) = condition(apiservice, "Available") else {
        return check(
            gv,
            "apiservice",
            Status::Warn,
            "no Available condition yet".into(),
            "the aggregator has not evaluated the APIService yet; run again in a few seconds",
        );
    };
    let reason = available.reason.as_deref().unwrap_or("");
    let message = available.message.as_deref().unwrap_or("");
    if available.status == "True" {
        return check(
            gv,
            "apiservice",
            Status::Ok,
            format!("Available=True ({reason})"),
            "",
        );
    }
    let runbook = match reason {
        "ServiceNotFound" => {
            "the Service the APIService names is missing; the leader re-creates it within \
             seconds, so a lasting absence means no leader (see the leader check)"
        }
        "MissingEndpoints" | "EndpointsNotFound" => {
            "the Service selects no ready proxy pod: the pods must run in kube-system with the \
             label app.kubernetes.io/name=crproxy (deploy/overlays/cluster-ip) and be Ready"
        }
        "FailedDiscoveryCheck" => {
            "the API server reached the Service but the proxy did not answer discovery: check \
             that the pods listen on proxy.basePort, that the serving CA Secret is the one in \
             caBundle, and the proxy logs"
        }
        _ => "read the message; the proxy logs show why it does not serve",
    };
    check(
        gv,
        "apiservice",
        Status::Fail,
        format!("Available=False ({reason}): {message}"),
        runbook,
    )
}

async fn check_service(client: &kube::Client, gv: &str, apiservice: &APIService) -> Check {
    let (namespace, name) = service_of(apiservice);
    let runbook_missing = "the leader re-creates its Service within seconds; a lasting absence \
                           means no leader holds the Lease (see the leader check)";
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    let service = match bounded(services.get_opt(name)).await {
        Ok(Some(service)) => service,
        Ok(None) => {
            return check(
                gv,
                "service",
                Status::Fail,
                format!("Service {namespace}/{name} does not exist"),
                runbook_missing,
            )
        }
        Err(error) => {
            return check(
                gv,
                "service",
                Status::Fail,
                format!("reading Service {namespace}/{name}: {error}"),
                "the doctor's credentials must be able to read Services in kube-system",
            )
        }
    };
    let spec = service.spec.unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        let host = spec.external_name.as_deref().unwrap_or("");
        return check(
            gv,
            "service",
            Status::Ok,
            format!(
                "{namespace}/{name}: ExternalName {host} (the proxy runs beside the API server)"
            ),
            "",
        );
    }
    // The label Kubernetes puts on a Service's EndpointSlices.
    let of_service = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let slices = match bounded(slices.list(&of_service)).await {
        Ok(list) => list.items,
        Err(error) => {
            return check(
                gv,
                "service",
                Status::Fail,
                format!("listing EndpointSlices of {namespace}/{name}: {error}"),
                "the doctor's credentials must be able to list EndpointSlices in kube-system",
            )
        }
    };
    // An endpoint without a ready condition counts as ready, as for Kubernetes.
    let ready = slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .count();
    let selector = serde_json::to_string(&spec.selector).unwrap_or_default();
    if ready == 0 {
        return check(
            gv,
            "service",
            Status::Fail,
            format!("{namespace}/{name}: ClusterIP selecting {selector}, no ready endpoint"),
            "no ready proxy pod matches the selector in the Service's namespace: run the pods \
             in kube-system with app.kubernetes.io/name=crproxy (deploy/overlays/cluster-ip) \
             and check their readiness",
        );
    }
    check(
        gv,
        "service",
        Status::Ok,
        format!("{namespace}/{name}: ClusterIP selecting {selector}, {ready} ready endpoint(s)"),
        "",
    )
}

/// The deletion-protection policy and binding exist and are what the leader
/// installs: the readable problems first (missing, bound elsewhere, not denying,
/// not selecting the label), then any other difference by the registrar's own
/// rule (`crproxy_wiring::{policy,binding}_drifted`), since anything added to either spec (a
/// `matchConditions` entry that never holds, an `excludeResourceRules`, an extra
/// selector label, `failurePolicy: Ignore`) can switch the protection off.
async fn check_protection(client: &kube::Client) -> Check {
    let runbook = "the leader re-creates a missing policy or binding, and restores a changed \
                   one, on its next registration pass (within seconds); a lasting absence or \
                   difference means no leader (see the leader check), missing RBAC on \
                   validatingadmissionpolicies(bindings) (deploy/base/rbac.yaml), or something \
                   else (a GitOps tool, an operator) rewriting them after each repair";
    let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    let policy = bounded(policies.get_opt(names::POLICY_NAME)).await;
    let binding = bounded(bindings.get_opt(names::POLICY_BINDING_NAME)).await;
    let differs = |what: &str, name: &str| {
        format!(
            "{what} {name} differs from the one crproxy installs (a changed spec can switch \
             the protection off)"
        )
    };
    let mut problems = Vec::new();
    match &policy {
        Ok(Some(policy)) => match serde_json::to_value(policy) {
            Ok(live) if crproxy_wiring::policy_drifted(&live) => {
                problems.push(differs("policy", names::POLICY_NAME));
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("comparing policy {}: {e}", names::POLICY_NAME)),
        },
        Ok(None) => problems.push(format!("policy {} missing", names::POLICY_NAME)),
        Err(e) => problems.push(format!("reading policy {}: {e}", names::POLICY_NAME)),
    }
    match binding {
        Ok(Some(binding)) => {
            // Judged before the spec is taken apart below.
            let drifted =
                serde_json::to_value(&binding).map(|live| crproxy_wiring::binding_drifted(&live));
            let before = problems.len();
            let spec = binding.spec.unwrap_or_default();
            if spec.policy_name.as_deref() != Some(names::POLICY_NAME) {
                // As JSON: quoted, or null when the binding names none.
                problems.push(format!(
                    "binding {} points at policy {}",
                    names::POLICY_BINDING_NAME,
                    json!(spec.policy_name)
                ));
            }
            let denies = spec
                .validation_actions
                .as_ref()
                .is_some_and(|a| a.iter().any(|v| v == "Deny"));
            if !denies {
                problems.push(format!(
                    "binding {} does not Deny",
                    names::POLICY_BINDING_NAME
                ));
            }
            let selects_label = spec
                .match_resources
                .as_ref()
                .and_then(|m| m.object_selector.as_ref())
                .and_then(|s| s.match_labels.as_ref())
                .and_then(|labels| labels.get(names::PROTECTION_LABEL_KEY))
                .is_some_and(|value| value == names::PROTECTION_LABEL_VALUE);
            if !selects_label {
                problems.push(format!(
                    "binding {} does not select {}={}",
                    names::POLICY_BINDING_NAME,
                    names::PROTECTION_LABEL_KEY,
                    names::PROTECTION_LABEL_VALUE
                ));
            }
            // Any other difference, unless one named above already explains it.
            match drifted {
                Ok(true) if problems.len() == before => {
                    problems.push(differs("binding", names::POLICY_BINDING_NAME));
                }
                Ok(_) => {}
                Err(e) => problems.push(format!(
                    "comparing binding {}: {e}",
                    names::POLICY_BINDING_NAME
                )),
            }
        }
        Ok(None) => problems.push(format!("binding {} missing", names::POLICY_BINDING_NAME)),
        Err(e) => problems.push(format!(
            "reading binding {}: {e}",
            names::POLICY_BINDING_NAME
        )),
    }
    let evidence = if problems.is_empty() {
        format!(
            "policy {} bound by {} to {}={}",
            names::POLICY_NAME,
            names::POLICY_BINDING_NAME,
            names::PROTECTION_LABEL_KEY,
            names::PROTECTION_LABEL_VALUE
        )
    } else {
        problems.join("; ")
    };
    let status = if problems.is_empty() {
        Status::Ok
    } else {
        Status::Fail
    };
    check("", "protection", status, evidence, runbook)
}

async fn check_leader(client: &kube::Client, client_name: Option<&str>) -> Check {
    let runbook = "no replica holds the registration Lease: check that the crproxy pods run \
                   and may update leases in kube-system (deploy/base/rbac.yaml)";
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-system");
    let lease = match client_name {
        Some(client_name) => {
            let name = names::registration_lease_name(client_name);
            match bounded(leases.get_opt(&name)).await {
                Ok(lease) => lease,
                Err(error) => {
                    return check(
                        "",
                        "leader",
                        Status::Fail,
                        format!("reading Lease kube-system/{name}: {error}"),
                        "the doctor's credentials must be able to get Leases in kube-system",
                    )
                }
            }
        }
        None => match bounded(leases.list(&ListParams::default())).await {
            Ok(list) => {
                let mut candidates: Vec<Lease> = list
                    .items
                    .into_iter()
                    .filter(|lease| {
                        names::is_registration_lease_name(
                            lease.metadata.name.as_deref().unwrap_or_default(),
                        )
                    })
                    .collect();
                // Several candidates (say a stale Lease left by a renamed client):
                // picking one would report on a client that may no longer exist.
                if candidates.len() > 1 {
                    let mut found: Vec<&str> = candidates
                        .iter()
                        .map(|lease| lease.metadata.name.as_deref().unwrap_or_default())
                        .collect();
                    found.sort_unstable();
                    return check(
                        "",
                        "leader",
                        Status::Fail,
                        format!(
                            "{} Leases could be the registration Lease: {}",
                            found.len(),
                            found
                                .iter()
                                .map(|name| format!("kube-system/{name}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        "pass --client-name <client.name> (from the proxy's configuration) so \
                         the doctor reads that client's Lease; a Lease left by a renamed \
                         client can then be deleted",
                    );
                }
                candidates.pop()
            }
            Err(error) => {
                return check(
                    "",
                    "leader",
                    Status::Fail,
                    format!("listing Leases in kube-system: {error}"),
                    "the doctor's credentials must be able to list Leases in kube-system",
                )
            }
        },
    };
    let Some(lease) = lease else {
        let evidence = match client_name {
            Some(client_name) => format!(
                "no Lease kube-system/{}",
                names::registration_lease_name(client_name)
            ),
            None => "no Lease kube-system/crproxy-<client name> (a client named sync-... is \
                     found only with --client-name)"
                .to_owned(),
        };
        return check("", "leader", Status::Fail, evidence, runbook);
    };
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    let age = spec
        .renew_time
        .map(|renewed| Timestamp::now().duration_since(renewed.0).as_secs());
    match (holder.is_empty(), age) {
        (false, Some(age)) if age <= duration => check(
            "",
            "leader",
            Status::Ok,
            format!("Lease kube-system/{name} held by {holder}, renewed {age}s ago"),
            "",
        ),
        (true, _) => check(
            "",
            "leader",
            Status::Fail,
            format!("Lease kube-system/{name} has no holder"),
            runbook,
        ),
        (false, age) => check(
            "",
            "leader",
            Status::Fail,
            format!(
                "Lease kube-system/{name} held by {holder} but not renewed for {}s (duration {duration}s)",
                age.map(|a| a.to_string()).unwrap_or_else(|| "?".into())
            ),
            runbook,
        ),
    }
}

/// Whether a discovery document looks like the proxy's fallback: every resource
/// has only `get`, or there are none.
fn is_fallback(document: &Value) -> bool {
    let resources = document["resources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    resources.is_empty()
        || resources
            .iter()
            .all(|r| r["verbs"].as_array().is_some_and(|v| v == &[json!("get")]))
}

/// The resources the proxy serves, by the client's discovery (the target's list
/// cut down to the enabled keys). `None` when that list cannot say: discovery
/// failed, or it is the fallback document.
fn served_resources(discovery: &Result<Value, KubeError>) -> Option<Vec<String>> {
    let document = discovery.as_ref().ok().filter(|d| !is_fallback(d))?;
    Some(resource_names(document))
}

/// The resources (not subresources) a discovery document lists.
fn resource_names(document: &Value) -> Vec<String> {
    document["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .filter(|n| !n.contains('/'))
        .map(str::to_owned)
        .collect()
}

fn check_discovery(gv: &str, discovery: &Result<Value, KubeError>) -> Check {
    match discovery {
        Ok(document) if is_fallback(document) => check(
            gv,
            "discovery",
            Status::Warn,
            "served from the fallback document (resources with only get, or none)".into(),
            "the proxy cannot reach the target right now; real requests fail with 503: \
             triage with the peers and target checks",
        ),
        Ok(document) => {
            let count = document["resources"].as_array().map(Vec::len).unwrap_or(0);
            check(
                gv,
                "discovery",
                Status::Ok,
                format!("{count} resource(s) from the target"),
                "",
            )
        }
        Err(error) => check(
            gv,
            "discovery",
            Status::Fail,
            format!("GET /apis/{gv} through the client: {error}"),
            "the aggregation layer does not reach the proxy: see the apiservice and service checks",
        ),
    }
}

// ---------------------------------------------------------------- target side

/// The target's side of `gv`: the proxy's credentials, and what its RBAC lets
/// the identity do with each resource the proxy serves (`served`, or every
/// resource the target lists when the client's discovery cannot say).
async fn check_target(target: &kube::Client, gv: &str, served: Option<Vec<String>>) -> Vec<Check> {
    let document = match discovery(target, gv).await {
        Ok(document) => document,
        Err(error) => {
            let runbook = match error.status() {
                Some(401) => {
                    "the target rejected the proxy's credentials: renew the client identity's \
                     certificate or token and update the crproxy-target-kubeconfig Secret"
                }
                Some(403) => {
                    "the target denies discovery to the client identity: check its RBAC \
                     (deploy/target/rbac.yaml)"
                }
                Some(404) => "the group/version is not served on the target: install its CRD there",
                _ => {
                    "the target's API server is unreachable with these credentials: check the \
                     server URL and CA in the crproxy-target-kubeconfig Secret and the network"
                }
            };
            return vec![check(
                gv,
                "target-credentials",
                Status::Fail,
                format!("GET /apis/{gv} on the target: {error}"),
                runbook,
            )];
        }
    };
    let mut checks = vec![check(
        gv,
        "target-credentials",
        Status::Ok,
        "the target accepts the proxy's credentials".into(),
        "",
    )];
    let (group, _) = gv.split_once('/').unwrap_or((gv, ""));
    let resources: Vec<String> = resource_names(&document)
        .into_iter()
        .filter(|name| served.as_ref().is_none_or(|served| served.contains(name)))
        .collect();
    let mut denied = Vec::new();
    for resource in &resources {
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            match can_i(target, group, resource, verb).await {
                Ok(true) => {}
                Ok(false) => denied.push(format!("{verb} {resource}")),
                Err(error) => denied.push(format!("{verb} {resource} ({error})")),
            }
        }
    }
    for verb in ["get", "create"] {
        match can_i(target, "", "namespaces", verb).await {
            Ok(true) => {}
            Ok(false) => denied.push(format!("{verb} namespaces")),
            Err(error) => denied.push(format!("{verb} namespaces ({error})")),
        }
    }
    checks.push(if denied.is_empty() {
        check(
            gv,
            "target-rbac",
            Status::Ok,
            format!("the identity may use {}", resources.join(", ")),
            "",
        )
    } else {
        check(
            gv,
            "target-rbac",
            Status::Fail,
            format!("denied on the target: {}", denied.join(", ")),
            "grant the client identity the proxied verbs and namespaces get/create on the \
             target (deploy/target/rbac.yaml)",
        )
    });
    checks
}

/// Whether the target accepts the credentials at all, by a SelfSubjectReview
/// (which every authenticated user may create): for when no group/version says
/// what else to check there.
async fn check_target_accepts(target: &kube::Client) -> Check {
    let reviews = Api::<SelfSubjectReview>::all(target.clone());
    let answer =
        bounded(reviews.create(&PostParams::default(), &SelfSubjectReview::default())).await;
    let runbook_rejected = "the target rejected the proxy's credentials: renew the client \
                            identity's certificate or token and update the \
                            crproxy-target-kubeconfig Secret";
    match answer {
        Ok(review) => {
            let user = review
                .status
                .and_then(|s| s.user_info)
                .and_then(|u| u.username)
                .unwrap_or_default();
            if user.is_empty() || user == "system:anonymous" {
                check(
                    "",
                    "target-credentials",
                    Status::Fail,
                    format!("the target sees these credentials as anonymous ({user:?})"),
                    runbook_rejected,
                )
            } else {
                check(
                    "",
                    "target-credentials",
                    Status::Ok,
                    format!("the target accepts the proxy's credentials as {user}"),
                    "",
                )
            }
        }
        Err(error) => check(
            "",
            "target-credentials",
            Status::Fail,
            format!("SelfSubjectReview on the target: {error}"),
            match error.status() {
                Some(401) => runbook_rejected,
                Some(403) => {
                    "the target refuses these credentials a SelfSubjectReview: they carry no \
                     token or certificate (anonymous), or the target's RBAC lacks \
                     system:basic-user"
                }
                _ => {
                    "the target's API server is unreachable with these credentials: check the \
                     server URL and CA in the crproxy-target-kubeconfig Secret and the network"
                }
            },
        ),
    }
}

async fn can_i(client: &kube::Client, group: &str, resource: &str, verb: &str) -> Result<bool> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                verb: Some(verb.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let reviews = Api::<SelfSubjectAccessReview>::all(client.clone());
    let answer = bounded(reviews.create(&PostParams::default(), &review)).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

// ---------------------------------------------------------------- metrics

/// The text exposition at a plain-HTTP metrics `url` (`http://host:port[/path]`,
/// `/metrics` when no path is given): the body of a 200 answer, or an error
/// naming what went wrong, within [`REQUEST_TIMEOUT`].
pub async fn fetch_metrics(url: &str) -> Result<String> {
    let (host, path) = metrics_address(url).map_err(|error| anyhow!(error))?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        // HTTP/1.0: the body ends with the connection, no chunked encoding.
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("no answer within {}s", REQUEST_TIMEOUT.as_secs()))??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        bail!("answered {status}");
    }
    Ok(body.to_owned())
}

/// The `host:port` and path a metrics URL names (`/metrics` when it names no
/// path), or why [`fetch_metrics`] cannot use it.
fn metrics_address(url: &str) -> std::result::Result<(&str, String), String> {
    const EXAMPLE: &str = "e.g. http://10.0.0.7:9090/metrics";
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("only http:// metrics URLs are supported, {EXAMPLE}"))?;
    let (host, path) = match rest.split_once('/') {
        Some((host, path)) => (host, format!("/{path}")),
        None => (rest, "/metrics".to_owned()),
    };
    let port = host
        .rsplit_once(':')
        .map(|(name, port)| (name, port.parse::<u16>()));
    match port {
        Some((name, Ok(port))) if !name.is_empty() && port != 0 => Ok((host, path)),
        _ => Err(format!(
            "{host:?} is not a host and port: the URL must name both, {EXAMPLE}"
        )),
    }
}

fn sum(samples: &[Sample], name: &str, filter: impl Fn(&Sample) -> bool) -> Option<f64> {
    let matching: Vec<f64> = samples
        .iter()
        .filter(|s| s.name == name && filter(s))
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

fn check_metrics(samples: &[Sample], gv: &str) -> Vec<Check> {
    let of_gv = |s: &Sample| s.labels.get("group_version").map(String::as_str) == Some(gv);
    let mut checks = Vec::new();

    // Peer snapshot: the condition that fails requests outright.
    checks.push(match sum(samples, "vcluster_proxy_peer_cache_synced", of_gv) {
        Some(v) if v >= 1.0 => check(gv, "peer-cache", Status::Ok, "peer list synced".into(), ""),
        Some(_) => check(
            gv,
            "peer-cache",
            Status::Fail,
            "vcluster_proxy_peer_cache_synced is 0: no trusted peer list".into(),
            "resource requests fail with 503 and discovery is the fallback: restore the peer \
             source (the target's EndpointSlices, DNS or file) and look for 'peer cache did \
             not sync in time' or 'peer watch subscription is down' in the logs",
        ),
        None => check(
            gv,
            "peer-cache",
            Status::Fail,
            "this proxy serves no such group/version".into(),
            "the metrics URL belongs to a proxy without this group/version in its configuration",
        ),
    });

    let state = |st: &'static str| {
        move |s: &Sample| of_gv(s) && s.labels.get("state").map(String::as_str) == Some(st)
    };
    let healthy = sum(samples, "vcluster_proxy_peers", state("healthy")).unwrap_or(0.0);
    let quarantined = sum(samples, "vcluster_proxy_peers", state("quarantined")).unwrap_or(0.0);
    let half_open = sum(samples, "vcluster_proxy_peers", state("half_open")).unwrap_or(0.0);
    let evidence = format!("healthy={healthy} quarantined={quarantined} half_open={half_open}");
    checks.push(
        if healthy >= 1.0 && quarantined == 0.0 && half_open == 0.0 {
            check(gv, "peers", Status::Ok, evidence, "")
        } else if healthy >= 1.0 {
            check(
                gv,
                "peers",
                Status::Warn,
                evidence,
                "some target endpoints fail their dials and are out of rotation; normal during a \
             target restart, otherwise check reachability of those endpoints",
            )
        } else {
            check(
                gv,
                "peers",
                Status::Fail,
                evidence,
                "no healthy peer: if the target's API servers are up, the endpoints are stale or \
             unreachable from the proxy (network, firewall, peer publication); if they are \
             down, fix the target and the proxy recovers on its own",
            )
        },
    );

    let age = sum(samples, "vcluster_proxy_peer_list_age_seconds", of_gv);
    checks.push(match age {
        Some(age) => check(
            gv,
            "peer-list-age",
            Status::Ok,
            format!("last peer list {age:.0}s ago (event-driven, high values are normal)"),
            "",
        ),
        None => check(
            gv,
            "peer-list-age",
            Status::Warn,
            "no peer list published yet".into(),
            "the peer source has not delivered a list: check the source's configuration and \
             its RBAC on the target",
        ),
    });

    // Both counters are labelled by target only: count this group/version's target,
    // not every target the proxy serves.
    let targets = targets_of(samples, gv);
    let of_target = |s: &Sample| {
        s.labels
            .get("target")
            .is_some_and(|t| targets.contains(t.as_str()))
    };
    let quarantines =
        sum(samples, "vcluster_proxy_peer_quarantines_total", of_target).unwrap_or(0.0);
    let all_quarantined = sum(
        samples,
        "vcluster_proxy_target_all_peers_quarantined_total",
        of_target,
    )
    .unwrap_or(0.0);
    let evidence = format!(
        "{quarantines} quarantine(s), {all_quarantined} time(s) no peer left (since start)"
    );
    checks.push(if all_quarantined > 0.0 {
        check(
            gv,
            "quarantines",
            Status::Warn,
            evidence,
            "at some point every peer was quarantined; if the peers check is not ok now, \
             triage as proxy-path degradation",
        )
    } else if quarantines > 0.0 {
        check(
            gv,
            "quarantines",
            Status::Warn,
            evidence,
            "peers failed 3 dials in a row at some point; expected during target restarts",
        )
    } else {
        check(gv, "quarantines", Status::Ok, evidence, "")
    });

    let mut failures: BTreeMap<String, f64> = BTreeMap::new();
    for s in samples.iter().filter(|s| {
        s.name == "vcluster_proxy_request_total"
            && of_gv(s)
            && s.labels.get("code").is_some_and(|c| c.starts_with('5'))
    }) {
        let reason = s.labels.get("reason").cloned().unwrap_or_default();
        *failures.entry(reason).or_default() += s.value;
    }
    let fallbacks = sum(samples, "vcluster_proxy_discovery_fallbacks_total", of_gv).unwrap_or(0.0);
    checks.push(if failures.is_empty() && fallbacks == 0.0 {
        check(
            gv,
            "request-reasons",
            Status::Ok,
            "no 5xx and no fallback discovery since start".into(),
            "",
        )
    } else {
        let list: Vec<String> = failures.iter().map(|(r, n)| format!("{r}={n}")).collect();
        let runbook = if failures.contains_key("no_peer") || failures.contains_key("stale_peers") {
            "no_peer/stale_peers: the proxy has no usable peer list; restore the peer source"
        } else if failures.contains_key("all_quarantined") {
            "all_quarantined: every peer failed 3 dials; see the peers check"
        } else if failures.contains_key("timeout") || failures.contains_key("error") {
            "timeout/error: dials to the target fail; check network reachability of the peers"
        } else if failures.contains_key("upstream") {
            "upstream: the target answered 5xx (or an unclassified proxy failure); check the \
             target API server and the proxy logs"
        } else {
            "look up each reason in the runbook table of docs/operations.md"
        };
        check(
            gv,
            "request-reasons",
            Status::Warn,
            format!(
                "5xx by reason since start: {}; discovery fallbacks: {fallbacks}",
                if list.is_empty() {
                    "none".to_owned()
                } else {
                    list.join(", ")
                }
            ),
            runbook,
        )
    });
    checks.extend(check_request_deadline(samples, gv));
    checks
}

/// The targets `gv` is routed to, taken from its own series (those carrying both
/// labels), to scope the series that are labelled by target only. Empty when this
/// proxy does not serve `gv`, which the peer-cache check reports.
fn targets_of<'a>(samples: &'a [Sample], gv: &str) -> std::collections::BTreeSet<&'a str> {
    samples
        .iter()
        .filter(|s| s.labels.get("group_version").map(String::as_str) == Some(gv))
        .filter_map(|s| s.labels.get("target").map(String::as_str))
        .collect()
}

/// The upper bound of the request duration bucket just below the 60 s cap
/// ([`REQUEST_DURATION_BUCKETS`]): what lies above it took half the cap or more,
/// and a request ended by the deadline lands there too.
const SLOW_REQUEST_SECONDS: f64 = 30.0;

/// The upper bound of the dial duration bucket just below the 5 s dial timeout
/// ([`DIAL_DURATION_BUCKETS`]): dials above it were close to timing out.
const SLOW_DIAL_SECONDS: f64 = 2.5;

/// Requests the proxy cut off at its 60 s cap: the troubleshooting row "requests
/// consistently take about 60 seconds, then fail".
///
/// The rule is the termination counter alone: any `deadline` termination on the
/// target of this group/version fails the check, because each one is a caller
/// that got an error after waiting the whole cap. The histograms do not decide;
/// they are evidence to tell the two slow paths apart: requests above
/// [`SLOW_REQUEST_SECONDS`] with dials below [`SLOW_DIAL_SECONDS`] point to a
/// quick dial and a slow target response, while dials near the 5 s dial timeout
/// belong to the peer path (both are counted since the proxy started, so they
/// show where time went overall, not request by request). Both series are
/// labelled by target, not group/version, so the target is taken from this
/// group/version's own series; none means this proxy does not serve it, which
/// the peer-cache check already reports.
///
/// [`REQUEST_DURATION_BUCKETS`]: crproxy_proxy::metrics::REQUEST_DURATION_BUCKETS
/// [`DIAL_DURATION_BUCKETS`]: crproxy_proxy::metrics::DIAL_DURATION_BUCKETS
fn check_request_deadline(samples: &[Sample], gv: &str) -> Option<Check> {
    let targets = targets_of(samples, gv);
    if targets.is_empty() {
        return None;
    }
    let of_target = |s: &Sample| {
        s.labels
            .get("target")
            .is_some_and(|t| targets.contains(t.as_str()))
    };
    let deadline = sum(samples, "vcluster_proxy_request_terminations_total", |s| {
        of_target(s) && s.labels.get("reason").map(String::as_str) == Some("deadline")
    })
    .unwrap_or(0.0);
    let above = |family: &str, bound: f64| {
        let total = sum(samples, &format!("{family}_count"), of_target)?;
        let below = sum(samples, &format!("{family}_bucket"), |s| {
            of_target(s)
                && s.labels
                    .get("le")
                    .and_then(|le| le.parse::<f64>().ok())
                    .is_some_and(|le| le == bound)
        })?;
        Some(format!("{} of {total}", total - below))
    };
    let slow_requests = above(
        "vcluster_proxy_request_duration_seconds",
        SLOW_REQUEST_SECONDS,
    )
    .unwrap_or_else(|| "none timed".into());
    let slow_dials = above(
        "vcluster_proxy_peer_dial_duration_seconds",
        SLOW_DIAL_SECONDS,
    )
    .unwrap_or_else(|| "none timed".into());
    let targets = targets.into_iter().collect::<Vec<_>>().join(", ");
    let evidence = format!(
        "target {targets} since start: {deadline} request(s) ended at the 60s deadline; \
         requests over {SLOW_REQUEST_SECONDS}s: {slow_requests}; dials over \
         {SLOW_DIAL_SECONDS}s: {slow_dials}"
    );
    Some(if deadline > 0.0 {
        check(
            gv,
            "request-deadline",
            Status::Fail,
            evidence,
            "a dial gives up after 5 s, so a request that ran the full 60 s had usually \
             connected and was waiting on the target: look at the slow target response path \
             (the target API server's latency, its storage, its admission webhooks). Dials \
             near the 5 s timeout, if the evidence counts any, are a separate peer-path \
             problem (see the peers and request-reasons checks)",
        )
    } else {
        check(gv, "request-deadline", Status::Ok, evidence, "")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shot HTTP server on 127.0.0.1 that reads a request head and
    /// answers `answer` as it is; returns its address and the head it read.
    async fn answer_once(answer: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address").to_string();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("one connection");
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            // A request head is a few dozen bytes: a few reads at most.
            for _ in 0..16 {
                let n = stream.read(&mut buf).await.expect("read the request");
                head.extend_from_slice(&buf[..n]);
                if n == 0 || head.ends_with(b"\r\n\r\n") {
                    break;
                }
            }
            stream.write_all(answer.as_bytes()).await.expect("answer");
            String::from_utf8_lossy(&head).into_owned()
        });
        (addr, server)
    }

    #[tokio::test]
    async fn fetch_metrics_returns_the_body_of_a_200_answer() {
        let (addr, server) = answer_once("HTTP/1.0 200 OK\r\n\r\nup 1\n").await;
        let body = fetch_metrics(&format!("http://{addr}"))
            .await
            .expect("fetched");
        assert_eq!(body, "up 1\n");
        let head = server.await.expect("server task");
        assert!(head.starts_with("GET /metrics HTTP/1.0\r\n"), "{head}");
    }

    #[tokio::test]
    async fn fetch_metrics_names_a_refusal_and_a_foreign_scheme() {
        let (addr, _server) = answer_once("HTTP/1.0 503 Service Unavailable\r\n\r\nno").await;
        let error = fetch_metrics(&format!("http://{addr}/metrics/syncer"))
            .await
            .expect_err("a 503 is no exposition");
        assert_eq!(
            error.to_string(),
            "answered HTTP/1.0 503 Service Unavailable"
        );
        let error = fetch_metrics("https://127.0.0.1:1/metrics")
            .await
            .expect_err("https is not spoken");
        assert!(
            error
                .to_string()
                .starts_with("only http:// metrics URLs are supported"),
            "{error}"
        );
    }

    #[test]
    fn an_unsynced_peer_cache_fails_and_decides_the_verdict() {
        let gv = "example.com/v1";
        let samples = exposition::parse(&format!(
            "vcluster_proxy_peer_cache_synced{{group_version=\"{gv}\",target=\"p/t\"}} 0\n\
             vcluster_proxy_peers{{group_version=\"{gv}\",target=\"p/t\",state=\"healthy\"}} 1\n\
             vcluster_proxy_peer_list_age_seconds{{group_version=\"{gv}\",target=\"p/t\"}} 3\n"
        ));
        let checks = check_metrics(&samples, gv);
        let cache = checks
            .iter()
            .find(|c| c.check == "peer-cache")
            .expect("a peer-cache check");
        assert_eq!(cache.status, Status::Fail);
        assert_eq!(
            cache.evidence,
            "vcluster_proxy_peer_cache_synced is 0: no trusted peer list"
        );
        assert!(
            cache.runbook.contains("peer cache did not sync in time"),
            "{}",
            cache.runbook
        );
        // The other metrics checks are fine: the cache alone decides the verdict.
        let others: Vec<_> = checks
            .iter()
            .filter(|c| c.check != "peer-cache" && c.status == Status::Fail)
            .map(|c| c.check)
            .collect();
        assert!(others.is_empty(), "{others:?}");
        assert_eq!(
            triage(&checks),
            "the proxy has no current peer snapshot: restore its peer source first"
        );
    }

    const DEADLINE_VERDICT: &str = "requests reach the target but its responses do not \
        finish within the proxy's 60 s cap: look at the target's response path (API server, \
        storage, webhooks), not the peer path";

    /// A healthy peer snapshot for `example.com/v1` of target `p/t`, then `extra`
    /// exposition lines; returns the request-deadline check and the verdict.
    fn deadline_check(extra: &str) -> (Check, String) {
        let gv = "example.com/v1";
        let samples = exposition::parse(&format!(
            "vcluster_proxy_peer_cache_synced{{group_version=\"{gv}\",target=\"p/t\"}} 1\n\
             vcluster_proxy_peers{{group_version=\"{gv}\",target=\"p/t\",state=\"healthy\"}} 1\n\
             vcluster_proxy_peer_list_age_seconds{{group_version=\"{gv}\",target=\"p/t\"}} 3\n\
             {extra}"
        ));
        let checks = check_metrics(&samples, gv);
        let deadline = checks
            .iter()
            .find(|c| c.check == "request-deadline")
            .expect("a request-deadline check")
            .clone();
        (deadline, triage(&checks))
    }

    /// Request durations of target `p/t`: `fast` under 30 s, `slow` in (30, 60],
    /// `capped` past 60 s; dials: `dials` under 2.5 s, `slow_dials` in (2.5, 5].
    fn histograms(fast: u32, slow: u32, capped: u32, dials: u32, slow_dials: u32) -> String {
        let requests = fast + slow + capped;
        let all_dials = dials + slow_dials;
        format!(
            "vcluster_proxy_request_duration_seconds_bucket{{target=\"p/t\",verb=\"get\",le=\"5.0\"}} {fast}\n\
             vcluster_proxy_request_duration_seconds_bucket{{target=\"p/t\",verb=\"get\",le=\"30.0\"}} {fast}\n\
             vcluster_proxy_request_duration_seconds_bucket{{target=\"p/t\",verb=\"get\",le=\"60.0\"}} {}\n\
             vcluster_proxy_request_duration_seconds_bucket{{target=\"p/t\",verb=\"get\",le=\"+Inf\"}} {requests}\n\
             vcluster_proxy_request_duration_seconds_count{{target=\"p/t\",verb=\"get\"}} {requests}\n\
             vcluster_proxy_peer_dial_duration_seconds_bucket{{target=\"p/t\",le=\"2.5\"}} {dials}\n\
             vcluster_proxy_peer_dial_duration_seconds_bucket{{target=\"p/t\",le=\"5.0\"}} {all_dials}\n\
             vcluster_proxy_peer_dial_duration_seconds_bucket{{target=\"p/t\",le=\"+Inf\"}} {all_dials}\n\
             vcluster_proxy_peer_dial_duration_seconds_count{{target=\"p/t\"}} {all_dials}\n",
            fast + slow
        )
    }

    #[test]
    fn deadline_terminations_fail_and_decide_the_verdict() {
        let (check, verdict) = deadline_check(&format!(
            "{}vcluster_proxy_request_terminations_total{{target=\"p/t\",reason=\"deadline\"}} 3\n\
             vcluster_proxy_request_terminations_total{{target=\"p/t\",reason=\"upgrade_rejected\"}} 2\n\
             vcluster_proxy_request_terminations_total{{target=\"other/t\",reason=\"deadline\"}} 5\n",
            histograms(7, 0, 3, 4, 0)
        ));
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            check.evidence,
            "target p/t since start: 3 request(s) ended at the 60s deadline; requests over 30s: \
             3 of 10; dials over 2.5s: 0 of 4"
        );
        assert!(
            check.runbook.contains("slow target response path"),
            "{}",
            check.runbook
        );
        assert_eq!(verdict, DEADLINE_VERDICT);
    }

    #[test]
    fn no_deadline_termination_is_ok() {
        let (check, verdict) = deadline_check(&histograms(10, 0, 0, 4, 0));
        assert_eq!(check.status, Status::Ok, "{}", check.evidence);
        assert_eq!(
            check.evidence,
            "target p/t since start: 0 request(s) ended at the 60s deadline; requests over 30s: \
             0 of 10; dials over 2.5s: 0 of 4"
        );
        assert_eq!(verdict, "healthy");

        // Before any request or dial, there is nothing to count.
        let (check, _) = deadline_check("");
        assert_eq!(check.status, Status::Ok);
        assert!(
            check
                .evidence
                .ends_with("requests over 30s: none timed; dials over 2.5s: none timed"),
            "{}",
            check.evidence
        );
    }

    #[test]
    fn dial_timeouts_near_5s_are_not_the_deadline_verdict() {
        // Three dials ran into the 5 s dial timeout and their requests failed with
        // 503 `timeout` after about 5 s: the peer path, not a slow response.
        let (check, verdict) = deadline_check(&format!(
            "{}vcluster_proxy_peer_dial_failures_total{{target=\"p/t\",reason=\"timeout\"}} 3\n\
             vcluster_proxy_request_total{{group_version=\"example.com/v1\",target=\"p/t\",verb=\"get\",code=\"503\",reason=\"timeout\"}} 3\n",
            histograms(10, 0, 0, 4, 3)
        ));
        assert_eq!(check.status, Status::Ok, "{}", check.evidence);
        assert!(
            check.evidence.ends_with("dials over 2.5s: 3 of 7"),
            "{}",
            check.evidence
        );
        assert_ne!(verdict, DEADLINE_VERDICT);
    }

    /// Quarantines count against the group/version whose target had them: the
    /// counters are labelled by target only, and another target's quarantines say
    /// nothing about this group/version.
    #[test]
    fn quarantines_are_scoped_to_the_group_versions_target() {
        let samples = exposition::parse(
            "vcluster_proxy_peer_cache_synced{group_version=\"a.example.com/v1\",target=\"p/a\"} 1\n\
             vcluster_proxy_peer_cache_synced{group_version=\"b.example.com/v1\",target=\"p/b\"} 1\n\
             vcluster_proxy_peer_quarantines_total{target=\"p/a\"} 0\n\
             vcluster_proxy_target_all_peers_quarantined_total{target=\"p/a\"} 0\n\
             vcluster_proxy_peer_quarantines_total{target=\"p/b\"} 4\n\
             vcluster_proxy_target_all_peers_quarantined_total{target=\"p/b\"} 1\n",
        );
        let quarantines = |gv: &str| {
            check_metrics(&samples, gv)
                .into_iter()
                .find(|c| c.check == "quarantines")
                .expect("a quarantines check")
        };
        let a = quarantines("a.example.com/v1");
        assert_eq!(a.status, Status::Ok, "{}", a.evidence);
        assert_eq!(
            a.evidence,
            "0 quarantine(s), 0 time(s) no peer left (since start)"
        );
        let b = quarantines("b.example.com/v1");
        assert_eq!(b.status, Status::Warn, "{}", b.evidence);
        assert_eq!(
            b.evidence,
            "4 quarantine(s), 1 time(s) no peer left (since start)"
        );
    }

    /// The request-reasons check of `example.com/v1` after the proxy answered
    /// `code` with `reason` `count` times for each of `answers`, and served
    /// `fallbacks` fallback discovery documents.
    fn request_reasons(answers: &[(&str, &str, u32)], fallbacks: u32) -> Check {
        let gv = "example.com/v1";
        let mut text = format!(
            "vcluster_proxy_peer_cache_synced{{group_version=\"{gv}\",target=\"p/t\"}} 1\n\
             vcluster_proxy_discovery_fallbacks_total{{group_version=\"{gv}\",target=\"p/t\"}} {fallbacks}\n"
        );
        for (code, reason, count) in answers {
            text.push_str(&format!(
                "vcluster_proxy_request_total{{group_version=\"{gv}\",target=\"p/t\",verb=\"get\",code=\"{code}\",reason=\"{reason}\"}} {count}\n"
            ));
        }
        check_metrics(&exposition::parse(&text), gv)
            .into_iter()
            .find(|c| c.check == "request-reasons")
            .expect("a request-reasons check")
    }

    /// Each 5xx reason of the troubleshooting table points at its own runbook
    /// step, word for word: an operator acts on that line. When several reasons
    /// occurred, the one nearest the peer source decides (a target that went away
    /// leaves `error` and then `all_quarantined`: the peers check says more).
    #[test]
    fn each_5xx_reason_gets_its_own_runbook_step() {
        const NO_PEER: &str =
            "no_peer/stale_peers: the proxy has no usable peer list; restore the peer source";
        const ALL_QUARANTINED: &str =
            "all_quarantined: every peer failed 3 dials; see the peers check";
        const DIALS: &str =
            "timeout/error: dials to the target fail; check network reachability of the peers";
        const UPSTREAM: &str = "upstream: the target answered 5xx (or an unclassified proxy \
                                failure); check the target API server and the proxy logs";
        const TABLE: &str = "look up each reason in the runbook table of docs/operations.md";
        let check = |answers: &[(&str, &str, u32)], fallbacks: u32, runbook: &str| {
            let reasons = request_reasons(answers, fallbacks);
            assert_eq!(reasons.status, Status::Warn, "{answers:?}");
            assert_eq!(reasons.runbook, runbook, "{answers:?}");
        };
        check(&[("503", "no_peer", 2)], 0, NO_PEER);
        check(&[("503", "stale_peers", 1)], 0, NO_PEER);
        check(&[("503", "all_quarantined", 1)], 0, ALL_QUARANTINED);
        check(&[("503", "timeout", 3)], 0, DIALS);
        check(&[("503", "error", 3)], 0, DIALS);
        check(&[("503", "upstream", 1)], 0, UPSTREAM);
        check(&[("500", "upstream", 1)], 0, UPSTREAM);
        // Reasons without a step of their own, and fallbacks without any 5xx.
        check(&[("504", "deadline", 1)], 0, TABLE);
        check(&[("503", "peer_departed", 1)], 0, TABLE);
        check(&[], 2, TABLE);
        // Several at once.
        check(
            &[
                ("503", "upstream", 1),
                ("503", "error", 1),
                ("503", "all_quarantined", 1),
                ("503", "stale_peers", 1),
            ],
            0,
            NO_PEER,
        );
        check(
            &[
                ("503", "upstream", 1),
                ("503", "error", 3),
                ("503", "all_quarantined", 1),
            ],
            0,
            ALL_QUARANTINED,
        );
        check(&[("503", "upstream", 1), ("503", "timeout", 1)], 0, DIALS);

        // The evidence counts every reason; a 4xx is no failure of the proxy path.
        let reasons = request_reasons(
            &[
                ("503", "error", 3),
                ("503", "all_quarantined", 1),
                ("404", "upstream", 5),
            ],
            1,
        );
        assert_eq!(
            reasons.evidence,
            "5xx by reason since start: all_quarantined=1, error=3; discovery fallbacks: 1"
        );
        let reasons = request_reasons(&[("404", "upstream", 5)], 0);
        assert_eq!(reasons.status, Status::Ok, "{}", reasons.evidence);
        assert_eq!(reasons.runbook, "");
    }

    #[test]
    fn fallback_discovery_is_recognised() {
        assert!(is_fallback(&json!({"resources": []})));
        assert!(is_fallback(
            &json!({"resources": [{"name": "widgets", "verbs": ["get"]}]})
        ));
        assert!(!is_fallback(
            &json!({"resources": [{"name": "widgets", "verbs": ["get", "list"]}]})
        ));
    }
}
