//! Health: tonic-health's service, with a replica's readiness followed into it (pushed when the
//! progress moves and every second, for watchers) and read again at each Check, so that a
//! replica whose knowledge of the log has aged past `max_lag_seconds` (it was paused, or cannot
//! reach the log) never answers SERVING in between.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

use super::LatheService;
use crate::service::{Engine, ReplicaProgress};

/// A replica's progress and the lag past which it is not ready, once replication has started.
pub(super) type ReplicaReadiness =
    Arc<OnceLock<(tokio::sync::watch::Receiver<ReplicaProgress>, Duration)>>;

/// The reporter, and the service over it that answers Checks of the Lathe service with the
/// replica's readiness at that moment.
pub(super) fn health() -> (
    HealthReporter,
    HealthServer<ReadinessHealth>,
    ReplicaReadiness,
) {
    let reporter = HealthReporter::new();
    let replica = ReplicaReadiness::default();
    let service = ReadinessHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        replica: Arc::clone(&replica),
    };
    (reporter, HealthServer::new(service), replica)
}

/// Another Check answerer over the same reporter and replica readiness: the HTTP port's
/// `/v1/health` asks it as a probe asks the health service.
pub(super) fn checker(reporter: &HealthReporter, replica: &ReplicaReadiness) -> ReadinessHealth {
    ReadinessHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        replica: Arc::clone(replica),
    }
}

pub(super) struct ReadinessHealth {
    inner: HealthService,
    replica: ReplicaReadiness,
}

impl ReadinessHealth {
    /// Whether `lathe.v1.Lathe` answers SERVING now, as a probe would be told.
    pub(super) async fn lathe_serving(&self) -> bool {
        let service = <LatheService as tonic::server::NamedService>::NAME.to_string();
        let answer = self
            .check(Request::new(HealthCheckRequest { service }))
            .await;
        answer.is_ok_and(|answer| answer.get_ref().status == ServingStatus::Serving as i32)
    }
}

#[tonic::async_trait]
impl Health for ReadinessHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let lathe =
            request.get_ref().service == <LatheService as tonic::server::NamedService>::NAME;
        let mut response = self.inner.check(request).await?;
        let serving = response.get_ref().status == ServingStatus::Serving as i32;
        if let (true, true, Some((progress, max_lag))) = (lathe, serving, self.replica.get()) {
            if !progress.borrow().ready(*max_lag, SystemTime::now()) {
                response.get_mut().status = ServingStatus::NotServing as i32;
            }
        }
        Ok(response)
    }

    type WatchStream = <HealthService as Health>::WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.inner.watch(request).await
    }
}

/// Indexes and models are loaded: a single node is ready; a replica once it has caught up with
/// the log, and not while it lags.
pub(super) async fn report_ready(
    engine: &Engine,
    health_reporter: &tonic_health::server::HealthReporter,
    draining: &Arc<std::sync::atomic::AtomicBool>,
    replica: &ReplicaReadiness,
) {
    match engine.replica_progress() {
        None => health_reporter.set_serving::<LatheService>().await,
        Some((progress, max_lag)) => {
            let _ = replica.set((progress.clone(), max_lag));
            spawn_replica_readiness(
                progress,
                max_lag,
                health_reporter.clone(),
                Arc::clone(draining),
            )
        }
    }
}

/// Follows a replica's progress into its health: SERVING while [`ReplicaProgress::ready`],
/// re-checked when the progress moves and every second (lag grows with time alone).
///
/// [`ReplicaProgress::ready`]: crate::service::ReplicaProgress::ready
fn spawn_replica_readiness(
    mut progress: tokio::sync::watch::Receiver<crate::service::ReplicaProgress>,
    max_lag: Duration,
    health_reporter: tonic_health::server::HealthReporter,
    draining: Arc<std::sync::atomic::AtomicBool>,
) {
    tokio::spawn(async move {
        let mut serving = None;
        loop {
            let ready = progress
                .borrow_and_update()
                .ready(max_lag, std::time::SystemTime::now());
            if draining.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            if serving != Some(ready) {
                if ready {
                    health_reporter.set_serving::<LatheService>().await;
                } else {
                    health_reporter.set_not_serving::<LatheService>().await;
                }
                tracing::info!(ready, "replica readiness");
                serving = Some(ready);
            }
            tokio::select! {
                changed = progress.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
}
