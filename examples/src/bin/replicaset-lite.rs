//! `replicaset-lite`: kube-controller-manager's ReplicaSet controller (ReplicaSet → Pods) on
//! kinformer, with client-go's expectations.
//!
//! Without `--kubeconfig` it starts envtest in-process with a fake kubelet,
//! runs a scripted scenario (create, scale up and down, a Pod deleted behind the controller's
//! back, a ReplicaSet deleted), checks that no Pod was ever created twice, prints a summary and
//! exits 0 once the cluster converged (non-zero, with the reason, if it did not within
//! `--timeout`). With `--kubeconfig PATH` (not an exported KUBECONFIG alone) it runs against that cluster, with
//! leader election, until SIGINT or SIGTERM.

#![forbid(unsafe_code)]
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use examples::demo::{self, DemoError, Instrumented, Stats};
use examples::replicaset_lite::{self, PodWrites, ReplicaCounts, ReplicaSetController, WriteCounts};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kinformer::controller::Manager;
use kinformer::factory::SharedInformerFactory;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

/// kube-controller-manager's ReplicaSet controller on kinformer: each ReplicaSet gets its Pods.
///
/// Against a cluster (`--kubeconfig`), use one whose kube-controller-manager does not run its own
/// ReplicaSet controller (`--controllers=*,-replicaset`): both would manage every ReplicaSet.
#[derive(Parser, Debug)]
#[command(name = "replicaset-lite", version)]
struct Args {
    #[command(flatten)]
    common: demo::CommonArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    demo::init_tracing();
    let kubeconfig = demo::cluster_kubeconfig(args.common.kubeconfig.as_deref(), args.common.embedded);
    let result = match kubeconfig {
        Some(path) => run_against_cluster(&args, path).await,
        None => run_demo(&args).await,
    };
    demo::exit_code("replicaset-lite", result)
}

/// Against a real cluster: the controller with leader election, until a signal. Its kubelets
/// run the Pods, so no fake kubelet.
async fn run_against_cluster(args: &Args, kubeconfig: PathBuf) -> Result<(), DemoError> {
    let client = demo::client_from_kubeconfig(&kubeconfig).await?;
    let mut manager = demo::cluster_manager(client, &args.common, "replicaset-lite")?;
    let reconciler = ReplicaSetController::new(manager.factory())?;
    let expectations = reconciler.expectations();
    // No per-reconcile lines or figures here (they would grow without end): the controller's
    // logs and /metrics say what it does.
    manager.add(replicaset_lite::controller(&manager, expectations, reconciler)?);
    eprintln!(
        "replicaset-lite: managing every ReplicaSet; make sure kube-controller-manager's replicaset \
         controller is disabled, or both will create Pods"
    );
    println!(
        "replicaset-lite: watching ReplicaSets; metrics on http://{}/metrics",
        demo::display_addr(&manager)
    );
    manager.run(CancellationToken::new()).await?;
    Ok(())
}

/// The scripted demo on an embedded envtest.
async fn run_demo(args: &Args) -> Result<(), DemoError> {
    let started = Instant::now();
    println!("replicaset-lite demo: ReplicaSet → Pods on an in-process API server");
    let embedded = demo::start_embedded("replicaset-lite").await?;
    let client = embedded.server.client();
    println!("▸ API server on {}", embedded.server.base_url());

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
        .handle_signals(true)
        .build()
        .map_err(demo::manager_error)?;
    let inner = ReplicaSetController::new(&factory)?;
    let writes = inner.writes();
    let stats = Stats::default();
    let expectations = inner.expectations();
    manager.add(replicaset_lite::controller(
        &manager,
        expectations,
        Instrumented {
            inner,
            stats: stats.clone(),
            verbose: !args.common.quiet,
        },
    )?);
    // envtest runs no kubelet: this one reports every Pod Running and Ready.
    manager.add(replicaset_lite::fake_kubelet(&factory)?);
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
        scenario(&client, &args.common.namespace, &writes, deadline).await
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
    let lp = ListParams::default();
    let replicasets = Api::<ReplicaSet>::namespaced(client.clone(), &args.common.namespace)
        .list(&lp)
        .await?
        .items
        .len();
    let pods = Api::<Pod>::namespaced(client.clone(), &args.common.namespace)
        .list(&lp)
        .await?
        .items
        .len();
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &args.common.namespace)
        .list(&lp)
        .await?
        .items
        .len();
    let total = writes.total();
    let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    demo::print_summary(
        &[
            ("ReplicaSets", replicasets),
            ("Pods", pods),
            ("Pods created", as_usize(total.created)),
            ("Pods deleted", as_usize(total.deleted)),
            ("Events", events),
        ],
        &stats.summary(),
    );
    println!(
        "converged: {} ReplicaSets ({}), every Pod Running and Ready, status reported",
        report.converged.len(),
        report
            .converged
            .iter()
            .map(|(name, replicas)| format!("{name} ×{replicas}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "replaced: Pod {} (deleted behind the controller's back) by {}",
        report.deleted_pod, report.replacement
    );
    println!(
        "garbage-collected: the Pods of ReplicaSet {}",
        report.deleted_replicaset
    );
    println!(
        "pods: {} created for {} needed, {} deleted for {} needed; never more Pods than replicas",
        total.created, report.needed.created, total.deleted, report.needed.deleted
    );
    println!("RESULT: converged in {:.1?}", started.elapsed());

    shutdown.cancel();
    run.await??;
    let _ = std::fs::remove_file(&embedded.kubeconfig);
    embedded.server.shutdown().await;
    Ok(())
}

/// What the scenario showed.
struct Report {
    /// The ReplicaSets left, with their replicas.
    converged: Vec<(String, i32)>,
    deleted_pod: String,
    replacement: String,
    deleted_replicaset: String,
    /// The fewest writes that could have done it.
    needed: WriteCounts,
}

/// One ReplicaSet the scenario waits for: its replicas, and the most live Pods it may ever
/// have in this step (the larger of its replicas before and after, so a scale-down may pass
/// through its old count, but nothing may overshoot).
struct Wanted {
    name: String,
    replicas: i32,
    ceiling: i32,
}

fn wanted(list: &[(&str, i32)]) -> Vec<Wanted> {
    list.iter()
        .map(|(name, replicas)| Wanted {
            name: (*name).into(),
            replicas: *replicas,
            ceiling: *replicas,
        })
        .collect()
}

async fn scenario(
    client: &Client,
    namespace: &str,
    writes: &PodWrites,
    deadline: Instant,
) -> Result<Report, DemoError> {
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pp = PostParams::default();

    println!("▸ creating ReplicaSets rs-1, rs-2, rs-3 with 1, 2 and 3 replicas");
    for (name, replicas) in [("rs-1", 1), ("rs-2", 2), ("rs-3", 3)] {
        replicasets
            .create(&pp, &replicaset_lite::example_replicaset(name, replicas))
            .await?;
    }
    let mut step = wanted(&[("rs-1", 1), ("rs-2", 2), ("rs-3", 3)]);
    converge(&replicasets, &pods, &step, deadline).await?;
    println!("✓ 6 Pods Running and Ready; every ReplicaSet's status reports its replicas");

    println!("▸ scaling rs-1 up to 4 and rs-3 down to 1");
    for (name, replicas) in [("rs-1", 4), ("rs-3", 1)] {
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        replicasets
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    step = vec![
        Wanted {
            name: "rs-1".into(),
            replicas: 4,
            ceiling: 4,
        },
        Wanted {
            name: "rs-2".into(),
            replicas: 2,
            ceiling: 2,
        },
        Wanted {
            name: "rs-3".into(),
            replicas: 1,
            ceiling: 3,
        },
    ];
    converge(&replicasets, &pods, &step, deadline).await?;
    println!("✓ rs-1 has 4 Pods, rs-3 has 1");

    let rs2 = replicasets.get("rs-2").await?;
    let before: Vec<String> = owned_pods(&pods, &rs2).await?.iter().map(|p| p.name_any()).collect();
    let deleted_pod = before.first().cloned().ok_or("rs-2 has no Pod to delete")?;
    println!("▸ deleting Pod {deleted_pod} of rs-2 behind the controller's back");
    pods.delete(&deleted_pod, &DeleteParams::default()).await?;
    step = wanted(&[("rs-1", 4), ("rs-2", 2), ("rs-3", 1)]);
    converge(&replicasets, &pods, &step, deadline).await?;
    let replacement = owned_pods(&pods, &rs2)
        .await?
        .into_iter()
        .map(|p| p.name_any())
        .find(|name| !before.contains(name))
        .ok_or("rs-2 converged without a new Pod")?;
    println!("✓ replaced by {replacement}");

    println!("▸ deleting ReplicaSet rs-3");
    let rs3 = replicasets.get("rs-3").await?;
    replicasets.delete("rs-3", &DeleteParams::default()).await?;
    demo::wait_until(deadline, "the Pods of rs-3 to be garbage-collected", || {
        let (pods, rs3) = (pods.clone(), rs3.clone());
        async move { Ok(owned_pods(&pods, &rs3).await?.is_empty()) }
    })
    .await?;
    step = wanted(&[("rs-1", 4), ("rs-2", 2)]);
    converge(&replicasets, &pods, &step, deadline).await?;
    println!("✓ rs-3 is gone and so are its Pods");

    // The fewest writes that do it: 1 + 2 + 3 initial Pods, 3 for the scale-up and 1
    // replacement; 2 deletions for the scale-down. A double create would show here even if
    // the surplus was deleted again before a poll saw it.
    let needed = [("rs-1", 4, 0), ("rs-2", 3, 0), ("rs-3", 3, 2)];
    for (name, created, deleted) in needed {
        let got = writes.get(&format!("{namespace}/{name}"));
        let want = WriteCounts { created, deleted };
        if got != want {
            return Err(format!("{name}: the controller made {got:?}, the minimum is {want:?}").into());
        }
    }
    Ok(Report {
        converged: step.into_iter().map(|w| (w.name, w.replicas)).collect(),
        deleted_pod,
        replacement,
        deleted_replicaset: "rs-3".into(),
        needed: WriteCounts {
            created: 10,
            deleted: 2,
        },
    })
}

/// The live Pods `rs` controls, from the API server.
async fn owned_pods(pods: &Api<Pod>, rs: &ReplicaSet) -> Result<Vec<Pod>, DemoError> {
    let uid = rs.uid();
    Ok(pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
        })
        .collect())
}

/// Waits until every ReplicaSet of `step` has exactly its replicas of Running and Ready Pods
/// and a status saying so for its current generation. Fails at once if one ever has more live
/// Pods than its ceiling: the controller created some twice.
async fn converge(
    replicasets: &Api<ReplicaSet>,
    pods: &Api<Pod>,
    step: &[Wanted],
    deadline: Instant,
) -> Result<(), DemoError> {
    demo::wait_until(deadline, "every ReplicaSet to converge", || async move {
        let mut converged = true;
        for wanted in step {
            let Some(rs) = replicasets.get_opt(&wanted.name).await? else {
                return Ok(false);
            };
            let owned = owned_pods(pods, &rs).await?;
            let live = i32::try_from(owned.len()).unwrap_or(i32::MAX);
            if live > wanted.ceiling {
                return Err(format!(
                    "ReplicaSet {} has {live} Pods but never wanted more than {}: a Pod was created twice",
                    wanted.name, wanted.ceiling
                )
                .into());
            }
            let running = owned.iter().all(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && replicaset_lite::is_ready(p)
            });
            let r = wanted.replicas;
            let expected = ReplicaCounts {
                replicas: r,
                fully_labeled_replicas: r,
                ready_replicas: r,
                available_replicas: r,
                observed_generation: rs.metadata.generation.unwrap_or(0),
            };
            converged &= live == r && running && ReplicaCounts::reported(&rs) == Some(expected);
        }
        Ok(converged)
    })
    .await
}
