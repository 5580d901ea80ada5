//! Membership of a ring: each shard's own Lease (held and renewed here, on the shard), and
//! which shards are live (read by the sharder from its Lease cache).
//!
//! Where it sits: a sharded [`BuiltController`](crate::BuiltController) joins before its
//! workers start and leaves after they stopped; the [`Sharder`](super::Sharder) reads
//! [`live_shards`] whenever it assigns an object.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{RING_LABEL, ShardingConfig};
use crate::leader_election::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
use crate::leadership::Leadership;
use crate::reconciler::BoxError;

/// Whether this replica's shard is ready: it holds its shard Lease, by its own clock. Plug it
/// into the Manager's `/readyz` with `manager.add_readyz_check("shard", move ||
/// readiness.check())`. Cheap to clone; every clone sees the same state.
#[derive(Clone, Default)]
pub struct ShardReadiness(Arc<Mutex<Option<Leadership>>>);

impl std::fmt::Debug for ShardReadiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShardReadiness").field(&self.check().is_ok()).finish()
    }
}

impl ShardReadiness {
    /// `Ok` while the shard has joined and its Lease's term is valid (renewed within
    /// `renew_deadline`): its workers may reconcile.
    pub fn check(&self) -> Result<(), BoxError> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(term) if term.is_valid() => Ok(()),
            Some(_) => Err("the shard lease could not be renewed".into()),
            None => Err("the shard does not hold its shard lease".into()),
        }
    }

    fn set(&self, term: Option<Leadership>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = term;
    }
}

/// The shards among `leases` of `ring` that are live at `now` (wall clock), each named by its
/// Lease (`<ring>-<shard>`): their Lease names a holder and was renewed less than `leaseDurationSeconds` ago by its `renewTime`. Sorted, without
/// duplicates. Like kubernetes-controller-sharding, this trusts the shards' clocks to agree
/// with the sharder's within the lease duration's margin over the renew deadline (client-go's
/// leader election instead times a lease from when it saw it change, which a sharder that just
/// started could not do for the shards' leases).
pub fn live_shards(leases: &[Arc<Lease>], ring: &str, now: jiff::Timestamp) -> Vec<String> {
    let prefix = format!("{ring}-");
    let mut live: Vec<String> = leases
        .iter()
        .filter_map(|lease| {
            // The shard is named by its Lease (`<ring>-<shard>`), not by the holder: a Lease
            // another holder took keeps its shard live until it expires, by which time the
            // shard that lost it has stopped (its term ended `renew_deadline` after its last
            // renewal).
            let shard = lease.metadata.name.as_deref()?.strip_prefix(&prefix)?;
            let spec = lease.spec.as_ref()?;
            spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
            let renewed = spec.renew_time.as_ref()?.0;
            let duration = jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds?));
            (renewed.checked_add(duration).ok()? > now).then(|| shard.to_owned())
        })
        .collect();
    live.sort_unstable();
    live.dedup();
    live
}

/// What the sharder remembers of each shard's Lease: when it expires, by its last renewal seen.
/// A Lease deleted by someone (its shard's elector may even recreate it, unlabelled) keeps its
/// shard live until then, as if it had not been renewed since, so the shard has time to notice
/// and stop ([`ShardMembership::join`] checks its Lease) before its objects move.
#[derive(Default)]
pub(crate) struct LeaseMemory(Mutex<std::collections::HashMap<String, jiff::Timestamp>>);

impl LeaseMemory {
    /// [`live_shards`] of `leases`, plus the shards whose Lease vanished from `leases` before
    /// its last known expiry.
    pub(crate) fn live(&self, leases: &[Arc<Lease>], ring: &str, now: jiff::Timestamp) -> Vec<String> {
        let prefix = format!("{ring}-");
        let mut memory = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = std::collections::HashSet::new();
        for lease in leases {
            let Some(shard) = lease.metadata.name.as_deref().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            present.insert(shard.to_owned());
            let spec = lease.spec.as_ref();
            let held = spec
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty());
            let expiry = spec.and_then(|s| {
                let duration = jiff::SignedDuration::from_secs(i64::from(s.lease_duration_seconds?));
                s.renew_time.as_ref()?.0.checked_add(duration).ok()
            });
            match (held, expiry) {
                (true, Some(expiry)) => {
                    memory.insert(shard.to_owned(), expiry);
                }
                // Released (after its workers stopped) or malformed: gone at once.
                _ => {
                    memory.remove(shard);
                }
            }
        }
        memory.retain(|_, expiry| *expiry > now);
        let mut live = live_shards(leases, ring, now);
        live.extend(memory.keys().filter(|shard| !present.contains(*shard)).cloned());
        live.sort_unstable();
        live.dedup();
        live
    }
}

/// The earliest instant one of the live `leases` expires, if none is renewed before.
pub(crate) fn next_expiry(leases: &[Arc<Lease>], now: jiff::Timestamp) -> Option<Duration> {
    leases
        .iter()
        .filter_map(|lease| {
            let spec = lease.spec.as_ref()?;
            spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
            let expires = spec
                .renew_time
                .as_ref()?
                .0
                .checked_add(jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds?)))
                .ok()?;
            let left = now.duration_until(expires);
            (left.is_positive()).then(|| Duration::try_from(left).ok()).flatten()
        })
        .min()
}

/// This shard's Lease: joined (acquired and labelled) before the workers start, renewed while
/// they run, released after they stopped.
pub(crate) struct ShardMembership {
    elector: LeaderElector,
    leases: Api<Lease>,
    config: ShardingConfig,
}

/// The renewal of a joined shard's Lease: a task, stopped (and the Lease released) by
/// [`ShardMembership::leave`], aborted (the Lease then expires) if dropped.
pub(crate) struct Renewing {
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), String>>>,
}

impl Drop for Renewing {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl ShardMembership {
    /// The membership of `config`'s shard; checks the Lease timing. Makes no request.
    pub(crate) fn new(client: kube::Client, config: &ShardingConfig) -> Result<Self, LeaderElectionError> {
        let election = LeaderElectionConfig::new(&config.namespace, config.lease_name(), &config.shard_id)
            .lease_duration(config.lease_duration)
            .renew_deadline(config.renew_deadline)
            .retry_period(config.retry_period)
            .release_on_cancel(true);
        Ok(ShardMembership {
            elector: LeaderElector::new(client.clone(), election)?,
            leases: Api::namespaced(client, &config.namespace),
            config: config.clone(),
        })
    }

    /// Acquires the shard's Lease and labels it with the ring (retried every `retry_period`),
    /// then renews it in a task. `None` if `shutdown` fired first (a Lease acquired meanwhile
    /// is released).
    pub(crate) async fn join(&self, shutdown: &CancellationToken) -> Option<(Leadership, Renewing)> {
        if !self.elector.acquire(shutdown).await {
            return None;
        }
        // The run's term: the Lease's, ended early if the Lease is found deleted or taken.
        let term = self.elector.leadership().narrowed();
        let stop = CancellationToken::new();
        let labelled = CancellationToken::new();
        let task = tokio::spawn({
            let (elector, stop, labelled, term) = (self.elector.clone(), stop.clone(), labelled.clone(), term.clone());
            let (leases, config) = (self.leases.clone(), self.config.clone());
            async move {
                tokio::select! {
                    renewed = elector.renew(&stop) => renewed.map_err(|e| e.to_string()),
                    reason = watch_lease(leases, config, stop.clone(), labelled) => {
                        term.token().cancel();
                        Err(reason)
                    }
                }
            }
        });
        let renewing = Renewing { stop, task: Some(task) };
        let label = serde_json::json!({"metadata": {"labels": {RING_LABEL: self.config.ring}}});
        loop {
            match self
                .leases
                .patch(
                    &self.config.lease_name(),
                    &PatchParams::default(),
                    &Patch::Merge(&label),
                )
                .await
            {
                Ok(_) => break,
                Err(e) => {
                    warn!(ring = %self.config.ring, shard = %self.config.shard_id, error = %e,
                        "failed to label the shard lease: retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => {
                            self.leave(renewing).await;
                            return None;
                        }
                        () = tokio::time::sleep(self.config.retry_period) => {}
                    }
                }
            }
        }
        labelled.cancel();
        info!(ring = %self.config.ring, shard = %self.config.shard_id, lease = %self.config.lease_name(),
            "joined the ring");
        self.config.readiness.set(Some(term.clone()));
        Some((term, renewing))
    }

    /// Stops renewing and releases the Lease (if still held): the sharder moves this shard's
    /// objects at once. Returns why the Lease was lost, if the renewal had failed before.
    pub(crate) async fn leave(&self, mut renewing: Renewing) -> Option<String> {
        self.config.readiness.set(None);
        renewing.stop.cancel();
        let mut lost = None;
        if let Some(task) = renewing.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(ring = %self.config.ring, shard = %self.config.shard_id, error = %e,
                        "the shard lease was lost before leaving");
                    lost = Some(e);
                }
                Err(e) if e.is_panic() => {
                    warn!(ring = %self.config.ring, shard = %self.config.shard_id,
                        "the shard lease renewal panicked");
                    lost = Some("the shard lease renewal panicked".into());
                }
                Err(_) => {}
            }
        }
        info!(ring = %self.config.ring, shard = %self.config.shard_id, "left the ring");
        lost
    }
}

/// Reads the shard's Lease every `retry_period` once `labelled` fired, until `stop`; returns why
/// the shard lost it: the Lease was deleted (its elector would recreate it, without the ring's
/// label, unseen by the sharder) or lost the ring's label, or another holder took it. A failed
/// read proves nothing (the renewal's deadline covers an unreachable server). Never returns
/// once `stop` fired.
async fn watch_lease(
    leases: Api<Lease>,
    config: ShardingConfig,
    stop: CancellationToken,
    labelled: CancellationToken,
) -> String {
    tokio::select! {
        () = labelled.cancelled() => {}
        () = stop.cancelled() => std::future::pending::<()>().await,
    }
    let name = config.lease_name();
    loop {
        tokio::select! {
            () = stop.cancelled() => std::future::pending::<()>().await,
            () = tokio::time::sleep(config.retry_period) => {}
        }
        let lease = match leases.get_opt(&name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return format!("shard lease {name} was deleted"),
            Err(_) => continue,
        };
        if lease.metadata.labels.as_ref().and_then(|l| l.get(RING_LABEL)) != Some(&config.ring) {
            return format!("shard lease {name} lost its {RING_LABEL} label (deleted and recreated?)");
        }
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        if holder != config.shard_id {
            return format!("shard lease {name} is held by {holder:?}");
        }
    }
}
