//! The shard's `Runners` gRPC service: a runner registers (its hello names its agents and tenants), gets its work
//! stream, and reports back on its own stream until either ends.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::codegen::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::credential::{CredentialCheck, InternalCredential};
use crate::pb;
use crate::pb::runner_report::Report;
use crate::pb::runners_server::{Runners, RunnersServer};
use crate::placement::*;
use crate::work_queue::WorkQueue;

/// The `Runners` gRPC service: where runners register.
pub struct RunnersService {
    pool: Arc<RunnerPool>,
}

impl RunnersService {
    pub fn new(pool: Arc<RunnerPool>) -> Self {
        Self { pool }
    }

    /// The service behind the internal credential check.
    pub fn into_server(
        self,
        credential: &InternalCredential,
    ) -> InterceptedService<RunnersServer<Self>, CredentialCheck> {
        let server = RunnersServer::new(self)
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::MAX_MESSAGE_BYTES);
        InterceptedService::new(server, credential.check())
    }
}

type WorkStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RunnerWork, Status>> + Send>>;

#[tonic::async_trait]
impl Runners for RunnersService {
    type RegisterStream = WorkStream;

    async fn register(
        &self,
        request: Request<Streaming<pb::RunnerReport>>,
    ) -> Result<Response<WorkStream>, Status> {
        let mut reports = request.into_inner();
        let hello = match reports.message().await? {
            Some(pb::RunnerReport {
                report: Some(Report::Hello(hello)),
            }) => hello,
            _ => {
                return Err(Status::invalid_argument(
                    "a runner's first report must be its RunnerHello",
                ))
            }
        };
        let (work_tx, work_rx) = WorkQueue::new();
        let runner = self.pool.add(hello, work_tx);
        let pool = self.pool.clone();
        tokio::spawn(async move {
            loop {
                match reports.message().await {
                    Ok(Some(pb::RunnerReport { report: Some(report) })) => {
                        // An agent's action waits for its host's room before the next report is read: a host
                        // whose store is behind slows this runner's stream, and so its agents and terminals.
                        let host = match &report {
                            Report::Action(action) => action.host.clone(),
                            _ => None,
                        };
                        pool.report(runner, report);
                        if let Some(room) = pool.sink(runner, host.as_ref()).and_then(|sink| sink.room()) {
                            room.await;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(runner, %error, "agent runner stream failed");
                        break;
                    }
                }
            }
            pool.runner_lost(runner);
        });
        Ok(Response::new(Box::pin(work_rx.map(Ok))))
    }
}
