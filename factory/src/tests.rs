//! The factory's ownership of its tasks, with stand-in informers (no API server).

use std::sync::atomic::{AtomicBool, Ordering};

use envtest::logs::Logs;
use envtest::tasks::{alive_tasks, until_alive};

use super::*;

/// A stand-in informer: runs until its token fires, or panics at once if told to.
struct Fake {
    panics: bool,
    synced: Arc<AtomicBool>,
    /// What a real informer that never ran reports.
    stats: InformerStats,
}

impl Runnable for Fake {
    fn run(&self, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        let panics = self.panics;
        Box::pin(async move {
            assert!(!panics, "informer boom");
            shutdown.cancelled().await;
        })
    }

    fn wait_for_cache_sync(&self, shutdown: CancellationToken) -> BoxFuture<'static, bool> {
        let synced = self.synced.clone();
        Box::pin(async move {
            shutdown.cancelled().await;
            synced.load(Ordering::SeqCst)
        })
    }

    fn stats(&self) -> InformerStats {
        self.stats.clone()
    }
}

/// A factory whose client points nowhere (nothing here talks to a server), with `fakes`.
fn factory_with(fakes: &[(&str, bool)]) -> SharedInformerFactory {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let never_run = SharedIndexInformer::new(
        ApiListerWatcher::new(kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::all(client.clone())),
        InformerConfig::default(),
    )
    .stats();
    let factory = SharedInformerFactory::new(client, Duration::ZERO);
    let mut state = factory.state();
    for &(name, panics) in fakes {
        let key = InformerKey::Dynamic {
            group: String::new(),
            version: "v1".into(),
            kind: name.into(),
        };
        let entry = Entry {
            name: name.into(),
            informer: Box::new(()),
            runnable: Arc::new(Fake {
                panics,
                synced: Arc::new(AtomicBool::new(false)),
                stats: never_run.clone(),
            }),
            task: None,
        };
        state.informers.insert(key, entry);
    }
    drop(state);
    factory
}

#[tokio::test(flavor = "current_thread")]
async fn shutdown_joins_every_task_the_factory_spawned() {
    let factory = factory_with(&[("A", false), ("B", false)]);
    let before = alive_tasks();
    let callers: Vec<CancellationToken> = (0..3).map(|_| CancellationToken::new()).collect();
    callers.iter().for_each(|token| factory.start(token));
    assert_eq!(alive_tasks(), before + 2 + 3, "two informers, one link per start call");
    factory.shutdown().await;
    assert_eq!(alive_tasks(), before);
}

#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_start_token_stops_the_factory_and_its_link_ends() {
    let factory = factory_with(&[("A", false)]);
    let before = alive_tasks();
    let caller = CancellationToken::new();
    factory.start(&caller);
    caller.cancel();
    assert_eq!(until_alive(before).await, before);
    factory.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn wait_for_cache_sync_spawns_nothing_that_outlives_it() {
    let factory = factory_with(&[("A", false)]);
    let caller = CancellationToken::new();
    factory.start(&caller);
    let before = alive_tasks();
    {
        let wait = factory.wait_for_cache_sync(&caller);
        tokio::pin!(wait);
        assert!(futures::poll!(wait.as_mut()).is_pending());
        // Dropped mid-wait, as `wait_for_cache_sync_timeout` drops it when its time is up.
    }
    assert_eq!(alive_tasks(), before);
    caller.cancel();
    let synced = factory.wait_for_cache_sync(&caller).await;
    assert_eq!(synced, BTreeMap::from([("A".to_owned(), false)]));
    factory.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_panicking_informer_is_logged_with_its_name_and_joined() {
    let logs = Logs::default();
    let _default = logs.set_default(tracing::Level::INFO);
    let factory = factory_with(&[("Bomb", true), ("A", false)]);
    let before = alive_tasks();
    factory.start(&CancellationToken::new());
    assert_eq!(
        until_alive(before + 2).await,
        before + 2,
        "the panicked informer's task ended"
    );
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("informer task panicked"))
        .expect(&text);
    assert!(
        line.contains("ERROR") && line.contains("informer=Bomb") && line.contains("informer boom"),
        "{line}"
    );
    factory.shutdown().await;
    assert_eq!(alive_tasks(), before);
}
