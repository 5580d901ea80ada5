//! Chaos for a controller: a ConfigMap controller with 4 workers over envtest while a writer
//! churns objects and a seeded fault schedule closes watches, expires resumes, bursts
//! 500/503/429 (with Retry-After), adds latency, compacts and restarts the watch cache, and
//! restarts the server on an older backup of its store. At the
//! end (writer stopped, faults cleared, bounded settle time):
//! - no key was ever reconciled by two workers at once;
//! - the last reconcile of every key saw its final state: the server's value, or gone.
//!
//! A short run (two seeds) is part of `cargo test`; `KINFORMER_CHAOS_SEED=<n>` replays one seed,
//! `KINFORMER_CHAOS_SECS` sets the chaos time.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::random_write;
use controller::{Action, Context, Controller, Request, reconciler_fn};
use factory::SharedInformerFactory;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio_util::sync::CancellationToken;

const NAMES: usize = 30;

#[derive(Default)]
struct Witness {
    in_flight: Mutex<HashSet<String>>,
    /// key → the value the last reconcile saw (None: the object was gone).
    last_seen: Mutex<HashMap<String, Option<String>>>,
    violations: Mutex<Vec<String>>,
}

fn value(cm: &ConfigMap) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get("v")).cloned()
}

async fn writer(client: kube::Client, seed: u64, stop: CancellationToken) -> HashSet<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut touched = HashSet::new();
    while !stop.is_cancelled() {
        let name = random_write(&api, &mut rng, NAMES).await;
        touched.insert(format!("default/{name}"));
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    touched
}

async fn run_seed(seed: u64, chaos: Duration) {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    // A server restored from a backup (one of the schedule's faults) is found within 250 ms,
    // well before the writer carries it envtest::chaos::RESTORE_MIN_BEHIND revisions on.
    let factory = SharedInformerFactory::builder(client.clone())
        .server_behind_check(Duration::from_millis(250))
        .build();
    let witness = Arc::new(Witness::default());
    let reconciler = {
        let witness = witness.clone();
        reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
            let witness = witness.clone();
            async move {
                let key = req.to_string();
                if !witness.in_flight.lock().unwrap().insert(key.clone()) {
                    witness
                        .violations
                        .lock()
                        .unwrap()
                        .push(format!("{key} reconciled concurrently"));
                }
                let seen = ctx.get(&req).expect("decodes").and_then(|cm| value(&cm));
                // Stay inside a moment so overlapping reconciles of one key would be caught.
                tokio::time::sleep(Duration::from_millis(1)).await;
                witness.last_seen.lock().unwrap().insert(key.clone(), seen);
                witness.in_flight.lock().unwrap().remove(&key);
                Ok::<_, kube::Error>(Action::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("chaos", &factory)
            .for_resource::<ConfigMap>()
            .workers(4)
            .run(reconciler, shutdown.clone()),
    );

    let stop = CancellationToken::new();
    let writes = tokio::spawn(writer(client.clone(), seed, stop.clone()));
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(chaos).await;
            stop.cancel();
        })
    };
    envtest::chaos::inject_faults(
        &env.faults(),
        "/api/v1/namespaces/default/configmaps",
        seed,
        stop.clone(),
    )
    .await;
    timer.await.unwrap();
    let touched = writes.await.unwrap();
    env.faults().clear();

    let server: HashMap<String, Option<String>> = env
        .objects_of("/api/v1/namespaces/default/configmaps")
        .unwrap()
        .into_iter()
        .map(|o| {
            let cm: ConfigMap = serde_json::from_value(o).unwrap();
            (
                format!("default/{}", cm.metadata.name.clone().unwrap_or_default()),
                value(&cm),
            )
        })
        .collect();
    let expected: HashMap<String, Option<String>> = touched
        .iter()
        .map(|k| (k.clone(), server.get(k).cloned().flatten()))
        .collect();
    let settle = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let last = witness.last_seen.lock().unwrap().clone();
        // Keys created and deleted before the controller ever saw them may never be reconciled.
        let converged = expected
            .iter()
            .all(|(k, v)| last.get(k).cloned().unwrap_or(None) == *v && (v.is_none() || last.contains_key(k)));
        if converged {
            break;
        }
        assert!(
            tokio::time::Instant::now() < settle,
            "seed {seed}: the last reconciles did not see the final state within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let violations = witness.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "seed {seed}: {violations:?}");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    eprintln!(
        "controller chaos seed {seed}: {} keys, {} on the server, {} restores from a backup",
        expected.len(),
        server.len(),
        env.faults().restores()
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_chaos_short() {
    for seed in envtest::chaos::seeds(&[11, 12]) {
        run_seed(seed, envtest::chaos::chaos_time(4)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long chaos run: cargo test -p kinformer-controller --test chaos -- --ignored"]
async fn controller_chaos_long() {
    for seed in envtest::chaos::seeds(&(200..220).collect::<Vec<_>>()) {
        run_seed(seed, envtest::chaos::chaos_time(15)).await;
    }
}
