//! `sample-controller`: Kubernetes' sample-controller (Foo → Deployment) on kinformer, with a
//! finalizer that removes a deleted Foo's entry from the shared index ConfigMap `foo-index`.
//!
//! Without `--kubeconfig` it starts envtest in-process, serves Foo's
//! webhooks from the Manager (validating, mutating, and the `v1alpha1` ↔ `v1` conversion; see
//! `sample_controller::webhooks`) and installs the Foo CRD and the webhook configurations, runs
//! a scripted scenario against the controller (one write denied by the validating webhook
//! among them), prints a summary and exits 0 once the cluster converged (every Deployment,
//! status and index entry as wanted, the deleted Foo gone) (non-zero, with the reason, if it
//! did not within `--timeout`). With `--kubeconfig PATH` it runs against that cluster, with
//! leader election, until SIGINT or SIGTERM; there it serves no webhooks (the cluster cannot
//! reach this process) and installs Foo in `v1` only. With `--in-cluster` it runs so in a pod,
//! as the manifests of `cargo xtask manifests` deploy it (which install the CRD). An exported KUBECONFIG alone never sends
//! it to a real cluster: it keeps the embedded server and prints a line saying so.

#![forbid(unsafe_code)]
// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::time::{Duration, Instant};

use clap::Parser;
use examples::demo::{self, DemoError, Instrumented, Stats};
use examples::sample_controller::webhooks::{self, DemoCertificates};
use examples::sample_controller::{self, Foo, FooSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer::controller::webhook::WebhookServerConfig;
use kinformer::controller::{Manager, has_finalizer, runnable_fn};
use kinformer::factory::SharedInformerFactory;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

/// Kubernetes' sample-controller on kinformer: each Foo gets a Deployment it owns.
///
/// Against a cluster (`--kubeconfig`), it installs the Foo CRD if missing.
#[derive(Parser, Debug)]
#[command(name = "sample-controller", version)]
struct Args {
    #[command(flatten)]
    common: demo::CommonArgs,
    /// After the demo, keep the embedded server and controller running and print the
    /// kubeconfig for kubectl; stop with Ctrl-C.
    #[arg(long)]
    keep_running: bool,
    /// Run in a pod, as the manifests of `cargo xtask manifests` deploy it: the pod's
    /// ServiceAccount (in-cluster config), leader election in `--namespace`, until SIGTERM. The
    /// manifests install the Foo CRD, so this installs nothing (and needs no access to CRDs).
    #[arg(long, conflicts_with_all = ["kubeconfig", "embedded"])]
    in_cluster: bool,
    /// Against a cluster (`--kubeconfig` or `--in-cluster`): run sharded, this replica one shard
    /// of the ring `foo` (its id `--shard-id`, else the hostname). Each replica caches and
    /// reconciles only the Foos labelled for it; the leader labels them. The demo stays
    /// unsharded.
    #[arg(long)]
    shards: bool,
    /// This replica's shard id with `--shards` (default: the hostname, a pod's name).
    #[arg(long, requires = "shards")]
    shard_id: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    demo::init_tracing();
    let kubeconfig = demo::cluster_kubeconfig(args.common.kubeconfig.as_deref(), args.common.embedded);
    let result = match kubeconfig {
        _ if args.in_cluster => run_in_cluster(&args).await,
        Some(path) => run_against_cluster(&args, path).await,
        None => {
            if args.shards {
                println!("sample-controller: --shards applies against a cluster; the demo runs unsharded");
            }
            run_demo(&args).await
        }
    };
    demo::exit_code("sample-controller", result)
}

/// Against a real cluster: the controller with leader election, until a signal.
async fn run_against_cluster(args: &Args, kubeconfig: PathBuf) -> Result<(), DemoError> {
    let client = demo::client_from_kubeconfig(&kubeconfig).await?;
    demo::install_crds(&client, &[sample_controller::crd()]).await?;
    println!("sample-controller: no webhooks (the cluster cannot reach this process); Foo installed in v1 only");
    run_controller(args, client).await
}

/// In a pod: the ServiceAccount's in-cluster config; the manifests installed the CRD.
async fn run_in_cluster(args: &Args) -> Result<(), DemoError> {
    let config = kube::Config::incluster().map_err(|e| {
        format!("--in-cluster: no in-cluster configuration (run it in a pod with a ServiceAccount): {e}")
    })?;
    run_controller(args, kinformer::cache::client::from_config(config)?).await
}

/// The controller with leader election, until a signal.
async fn run_controller(args: &Args, client: Client) -> Result<(), DemoError> {
    // No per-reconcile lines or figures here (they would grow without end): the controller's
    // logs and /metrics say what it does.
    let manager = if args.shards {
        let shard_id = args.shard_id.clone().unwrap_or_else(kinformer::controller::hostname);
        println!(
            "sample-controller: shard {shard_id} of the ring {}",
            sample_controller::RING
        );
        sample_controller::deploy::sharded_manager(client, &args.common, &shard_id, |inner| inner)?
    } else {
        sample_controller::deploy::manager(client, &args.common)?
    };
    println!(
        "sample-controller: watching Foos; metrics on http://{}/metrics",
        demo::display_addr(&manager)
    );
    manager.run(CancellationToken::new()).await?;
    Ok(())
}

/// The scripted demo on an embedded envtest.
async fn run_demo(args: &Args) -> Result<(), DemoError> {
    let started = Instant::now();
    println!("sample-controller demo: Foo → Deployment on an in-process API server");
    let embedded = demo::start_embedded("sample-controller").await?;
    let client = embedded.server.client();
    println!("▸ API server on {}", embedded.server.base_url());
    let certificates = DemoCertificates::generate(
        std::env::temp_dir().join(format!("sample-controller-{}-serving-certs", std::process::id())),
    )?;

    let factory = SharedInformerFactory::builder(client.clone())
        .strip_managed_fields(true)
        .build();
    let mut manager = Manager::builder(client.clone())
        .factory(factory.clone())
        .metrics_addr(
            args.common
                .metrics_addr
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .health_probe_addr(
            args.common
                .health_probe_addr
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .webhook_server(
            WebhookServerConfig::default()
                .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
                .cert_dir(certificates.dir()),
        )
        .handle_signals(true)
        .build()
        .map_err(demo::manager_error)?;
    let webhook_server = manager.webhook_server().ok_or("the Manager has no webhook server")?;
    webhooks::register(webhook_server)?;
    webhooks::install(&client, webhook_server, certificates.ca_bundle()).await?;
    println!(
        "▸ webhooks on https://{}: replicas within 0..={}, label {}, conversion v1alpha1 ↔ v1",
        webhook_server.local_addr(),
        webhooks::MAX_REPLICAS,
        webhooks::MANAGED_BY_LABEL
    );
    println!("▸ installed CRD foos.samplecontroller.k8s.io (v1 stored, v1alpha1 converted by the webhook)");
    let stats = Stats::default();
    let verbose = !args.common.quiet;
    manager.add(sample_controller::controller(&manager, |inner| Instrumented {
        inner,
        stats: stats.clone(),
        verbose,
    })?);
    // envtest runs no kube-controller-manager: this stands in for the deployment controller and
    // reports every Deployment's replicas as available.
    let deployments = factory.apps().v1().deployments()?.lister();
    let status_client = client.clone();
    manager.add(runnable_fn(
        "fake-deployment-controller",
        false,
        move |stop| async move {
            fake_deployment_controller(status_client, deployments, stop).await;
            Ok(())
        },
    ));
    println!("▸ metrics on http://{}/metrics", demo::display_addr(&manager));
    let status = manager.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));

    let deadline = started + Duration::from_secs(args.common.timeout);
    let outcome = async {
        demo::wait_until(deadline, "the caches to sync", || {
            let ready = status.is_ready();
            async move { Ok(ready) }
        })
        .await?;
        println!("▸ caches synced in {:.0?}", started.elapsed());
        scenario(&client, &args.common.namespace, deadline).await
    }
    .await;

    let report = match outcome {
        Ok(report) => report,
        Err(e) => {
            shutdown.cancel();
            let _ = run.await;
            return Err(format!("did not converge: {e}").into());
        }
    };
    let foos = Api::<Foo>::namespaced(client.clone(), &args.common.namespace)
        .list(&ListParams::default())
        .await?
        .items
        .len();
    let deployment_count = Api::<Deployment>::namespaced(client.clone(), &args.common.namespace)
        .list(&ListParams::default())
        .await?
        .items
        .len();
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &args.common.namespace)
        .list(&ListParams::default())
        .await?
        .items
        .len();
    stats.print_summary(&[
        ("Foos", foos),
        ("Deployments", deployment_count),
        ("Index entries", report.indexed.len()),
        ("Events", events),
    ]);
    println!(
        "converged: {} Foos ({}), each with its Deployment scaled and available",
        report.converged.len(),
        report.converged.join(", ")
    );
    println!(
        "recreated: Deployment {} (deleted behind the controller's back)",
        report.recreated
    );
    println!(
        "conflict: Foo {} reported with Event ErrResourceExists; Deployment {} left untouched",
        report.conflict_foo, report.conflict_deployment
    );
    let entries: Vec<String> = report
        .indexed
        .iter()
        .map(|(foo, entry)| format!("{foo} ({entry})"))
        .collect();
    println!(
        "index: ConfigMap {} holds {}; none for {} (removed by its finalizer before it went away) or {} (no Deployment of its own)",
        sample_controller::INDEX,
        entries.join(", "),
        report.deleted,
        report.conflict_foo
    );
    println!("RESULT: converged in {:.1?}", started.elapsed());

    if args.keep_running {
        println!();
        println!("KUBECONFIG={}", embedded.kubeconfig.display());
        let kubectl = format!("kubectl --kubeconfig {}", embedded.kubeconfig.display());
        println!("try: {kubectl} get foos,deployments,events.events.k8s.io");
        println!("try: {kubectl} get foos.v1alpha1.samplecontroller.k8s.io   # converted by the webhook");
        println!(
            "try: echo '{}' | {kubectl} apply -f -   # denied by the webhook",
            serde_json::json!({
                "apiVersion": "samplecontroller.k8s.io/v1", "kind": "Foo", "metadata": {"name": "too-big"},
                "spec": {"deploymentName": "too-big", "replicas": 11},
            })
        );
        println!("(Ctrl-C to stop)");
        let _ = run.await;
    } else {
        // Foo conflict is still being retried with backoff, by design: the controller reports
        // its key as dropped when it stops (a warning on stderr), as it does for any key it
        // accepted and did not finish.
        println!("stopping (Foo conflict's retry is pending: its key is reported as dropped)");
        shutdown.cancel();
        run.await??;
    }
    let _ = std::fs::remove_file(&embedded.kubeconfig);
    embedded.server.shutdown().await;
    drop(certificates);
    Ok(())
}

/// What the scenario showed.
struct Report {
    converged: Vec<String>,
    recreated: String,
    /// The Foo deleted: gone, and without an index entry.
    deleted: String,
    conflict_foo: String,
    conflict_deployment: String,
    /// The index ConfigMap's entries at the end, in key order.
    indexed: Vec<(String, String)>,
}

fn foo(name: &str, deployment: &str, replicas: i32) -> Foo {
    Foo::new(
        name,
        FooSpec {
            deployment_name: deployment.into(),
            replicas: Some(replicas),
        },
    )
}

async fn scenario(client: &Client, namespace: &str, deadline: Instant) -> Result<Report, DemoError> {
    let foos: Api<Foo> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let apis = (&foos, &deployments, &configmaps);
    let pp = PostParams::default();

    println!("▸ creating five Foos");
    let mut wanted: Vec<(String, i32)> = (1..=5).map(|i| (format!("foo-{i}"), i)).collect();
    for (name, replicas) in &wanted {
        foos.create(&pp, &foo(name, name, *replicas)).await?;
    }
    converge(apis, &wanted, deadline).await?;
    println!(
        "✓ five Deployments created and available; each Foo has its entry in ConfigMap {}",
        sample_controller::INDEX
    );
    webhooks_at_work(client, &foos, namespace).await?;

    println!("▸ scaling foo-2 to 7 replicas");
    let patch = serde_json::json!({"spec": {"replicas": 7}});
    foos.patch("foo-2", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wanted[1].1 = 7;
    converge(apis, &wanted, deadline).await?;
    println!("✓ foo-2 scaled");

    println!("▸ deleting Deployment foo-3 behind the controller's back");
    let old_uid = deployments.get("foo-3").await?.uid();
    deployments.delete("foo-3", &DeleteParams::default()).await?;
    demo::wait_until(deadline, "Deployment foo-3 to be recreated", || {
        let deployments = deployments.clone();
        let old_uid = old_uid.clone();
        async move { Ok(deployments.get_opt("foo-3").await?.is_some_and(|d| d.uid() != old_uid)) }
    })
    .await?;
    converge(apis, &wanted, deadline).await?;
    println!("✓ foo-3's Deployment recreated");

    println!("▸ deleting Foo foo-4 (its finalizer holds it until its index entry is removed)");
    foos.delete("foo-4", &DeleteParams::default()).await?;
    wanted.retain(|(name, _)| name != "foo-4");
    demo::wait_until(deadline, "Foo foo-4 to be gone (its finalizer removed)", || {
        let foos = foos.clone();
        async move { Ok(foos.get_opt("foo-4").await?.is_none()) }
    })
    .await?;
    demo::wait_until(deadline, "Deployment foo-4 to be garbage-collected", || {
        let deployments = deployments.clone();
        async move { Ok(deployments.get_opt("foo-4").await?.is_none()) }
    })
    .await?;
    converge(apis, &wanted, deadline).await?;
    println!("✓ foo-4 gone after its finalizer removed its index entry; its Deployment garbage-collected");

    println!("▸ creating Foo conflict, whose deploymentName 'taken' belongs to someone else");
    let mut taken = sample_controller::new_deployment(&foo("someone-else", "taken", 1));
    taken.metadata.owner_references = None;
    deployments.create(&pp, &taken).await?;
    foos.create(&pp, &foo("conflict", "taken", 3)).await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    demo::wait_until(deadline, "an ErrResourceExists Event on Foo conflict", || {
        let events = events.clone();
        async move {
            Ok(events.list(&ListParams::default()).await?.items.iter().any(|e| {
                e.reason.as_deref() == Some("ErrResourceExists")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("conflict")
            }))
        }
    })
    .await?;
    let untouched = deployments.get("taken").await?;
    if !untouched.owner_references().is_empty() || untouched.spec.as_ref().and_then(|s| s.replicas) != Some(1) {
        return Err("the controller modified Deployment 'taken', which it does not own".into());
    }
    println!("✓ conflict reported with an Event; Deployment 'taken' untouched");
    converge(apis, &wanted, deadline).await?;
    // The final check: converge saw the index hold exactly the live, synced Foos' entries; the
    // deleted Foo stays gone and the conflicting one never got an entry.
    if foos.get_opt("foo-4").await?.is_some() {
        return Err("Foo foo-4 is still there: its finalizer was not removed".into());
    }
    let indexed: Vec<(String, String)> = configmaps
        .get(sample_controller::INDEX)
        .await?
        .data
        .unwrap_or_default()
        .into_iter()
        .collect();
    if indexed.iter().any(|(foo, _)| foo == "foo-4" || foo == "conflict") {
        return Err(format!("the index holds an entry it must not: {indexed:?}").into());
    }
    Ok(Report {
        converged: wanted.into_iter().map(|(name, _)| name).collect(),
        recreated: "foo-3".into(),
        deleted: "foo-4".into(),
        conflict_foo: "conflict".into(),
        conflict_deployment: "taken".into(),
        indexed,
    })
}

/// Shows the three webhooks: a Foo with 11 replicas denied, the label the mutating webhook
/// set, and a Foo read in `v1alpha1` through the conversion webhook.
async fn webhooks_at_work(client: &Client, foos: &Api<Foo>, namespace: &str) -> Result<(), DemoError> {
    println!("▸ creating Foo too-big with 11 replicas");
    match foos
        .create(&PostParams::default(), &foo("too-big", "too-big", 11))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 403 => println!("✓ denied: {}", status.message),
        Err(e) => return Err(e.into()),
        Ok(_) => return Err("Foo too-big (11 replicas) was admitted: the validating webhook did not deny it".into()),
    }
    let label = foos
        .get("foo-1")
        .await?
        .labels()
        .get(webhooks::MANAGED_BY_LABEL)
        .cloned();
    if label.as_deref() != Some(webhooks::MANAGED_BY) {
        return Err(format!("Foo foo-1 has label {}={label:?}", webhooks::MANAGED_BY_LABEL).into());
    }
    let alpha = Api::<webhooks::v1alpha1::Foo>::namespaced(client.clone(), namespace)
        .get("foo-2")
        .await?;
    println!(
        "✓ foo-1 labelled {}={} by the mutating webhook; foo-2 read as v1alpha1: spec.size={}",
        webhooks::MANAGED_BY_LABEL,
        webhooks::MANAGED_BY,
        alpha.spec.size.map_or("unset".into(), |n| n.to_string())
    );
    Ok(())
}

/// Waits until every `(name, replicas)` Foo carries the controller's finalizer and has its
/// Deployment, owned, scaled, and reported available in the Foo's status, and the index
/// ConfigMap holds exactly these Foos' entries (none for a deleted Foo or a conflicting one).
async fn converge(
    (foos, deployments, configmaps): (&Api<Foo>, &Api<Deployment>, &Api<ConfigMap>),
    wanted: &[(String, i32)],
    deadline: Instant,
) -> Result<(), DemoError> {
    demo::wait_until(deadline, "every Foo to converge", || async move {
        let index = configmaps
            .get_opt(sample_controller::INDEX)
            .await?
            .and_then(|cm| cm.data)
            .unwrap_or_default();
        let expected: std::collections::BTreeMap<String, String> = wanted
            .iter()
            .map(|(name, replicas)| (name.clone(), sample_controller::index_entry(name, Some(*replicas))))
            .collect();
        if index != expected {
            return Ok(false);
        }
        for (name, replicas) in wanted {
            let Some(foo) = foos.get_opt(name).await? else {
                return Ok(false);
            };
            if !has_finalizer(&foo, sample_controller::FINALIZER) {
                return Ok(false);
            }
            let Some(deployment) = deployments.get_opt(name).await? else {
                return Ok(false);
            };
            let owned = deployment
                .owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && Some(&r.uid) == foo.uid().as_ref());
            let scaled = deployment.spec.as_ref().and_then(|s| s.replicas) == Some(*replicas);
            let reported = foo.status.as_ref().map(|s| s.available_replicas) == Some(*replicas);
            if !(owned && scaled && reported) {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

/// Stands in for kube-controller-manager's deployment controller: reports each Deployment's
/// desired replicas as available (envtest runs no controllers and no kubelet).
async fn fake_deployment_controller(
    client: Client,
    deployments: kinformer::factory::generated::apps::v1::DeploymentLister,
    stop: CancellationToken,
) {
    let all = kinformer::cache::Selector::default();
    while !stop.is_cancelled() {
        for deployment in deployments.list(&all) {
            let replicas = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let available = deployment.status.as_ref().and_then(|s| s.available_replicas);
            if available == Some(replicas) {
                continue;
            }
            let (Some(namespace), name) = (deployment.namespace(), deployment.name_any()) else {
                continue;
            };
            let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
            let status = serde_json::json!({"status": {
                "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                "updatedReplicas": replicas, "observedGeneration": deployment.metadata.generation,
            }});
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                tracing::debug!(deployment = %name, error = %e, "fake deployment controller: status update failed");
            }
        }
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}
