//! The demo agent as a provider: how it is listed, its sessions (with a workspace when it has one) and its turns.

use std::sync::Arc;
use std::time::Instant;

use ahp_types::actions::StateAction;
use ahp_types::state::{
    AgentCapabilities, AgentInfo, MultipleChatsCapability, MultipleWorkingDirectoriesCapability,
};
use tokio::sync::mpsc;

use crate::provider::{ChatSink, Provider, SessionStart, TurnHandle, TurnRequest};

use super::turn::DemoTurn;
use super::workspace::{DemoPace, DemoWorkspace};

/// The `demo` provider.
#[derive(Debug, Clone, Default)]
pub struct DemoProvider {
    pace: DemoPace,
    workspace: Option<DemoWorkspace>,
}

impl DemoProvider {
    pub const ID: &'static str = "demo";

    pub fn new(pace: DemoPace) -> Self {
        Self {
            pace,
            workspace: None,
        }
    }

    /// The demo agent, working in `workspace`.
    pub fn with_workspace(mut self, workspace: DemoWorkspace) -> Self {
        self.workspace = Some(workspace);
        self
    }
}

impl Provider for DemoProvider {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: Self::ID.into(),
            display_name: "Demo agent".into(),
            description:
                "Built-in deterministic agent: streams a reply, asks before running a tool when the \
                          prompt mentions \"tool\", and asks for input when it mentions \"input\"."
                    .into(),
            models: vec![],
            protected_resources: None,
            customizations: None,
            // It works in any number of working directories (the first stays its primary) and chats (each
            // turn its own task; it keeps no memory between turns, so a fork or side chat needs nothing more).
            capabilities: Some(AgentCapabilities {
                multiple_working_directories: Some(MultipleWorkingDirectoriesCapability {
                    immutable_primary: Some(true),
                    primary_replacement: None,
                }),
                multiple_chats: Some(MultipleChatsCapability {
                    fork: Some(true),
                    side_chat: Some(true),
                }),
            }),
        }
    }

    fn can_steer(&self) -> bool {
        true
    }

    fn workspace_root(&self) -> Option<std::path::PathBuf> {
        self.workspace.as_ref().map(|workspace| workspace.root.clone())
    }

    fn create_session(
        &self,
        request: crate::provider::SessionRequest,
        sink: Arc<dyn ChatSink>,
    ) -> SessionStart {
        let Some(workspace) = self.workspace.clone() else {
            return SessionStart::Ready;
        };
        let dir = match workspace.session_dir(
            &request.tenant,
            &request.host,
            &request.session,
            request.working_directory.as_deref(),
        ) {
            Ok(dir) => dir,
            Err(why) => return SessionStart::Refused(why),
        };
        // Its directory is made by the tenant's file server (in its sandbox), then the session is ready.
        tokio::spawn(async move {
            let made = workspace
                .files
                .call(&request.tenant, crate::files::FileOp::Mkdir { path: dir })
                .await;
            let action = match made {
                Ok(_) => StateAction::SessionReady(ahp_types::actions::SessionReadyAction {}),
                Err(error) => {
                    StateAction::SessionCreationFailed(ahp_types::actions::SessionCreationFailedAction {
                        error: ahp_types::state::ErrorInfo {
                            error_type: "workspaceUnavailable".into(),
                            message: format!("the demo agent's directory could not be made: {error}"),
                            stack: None,
                            meta: None,
                        },
                    })
                }
            };
            sink.emit(&request.session, action);
        });
        SessionStart::Pending
    }

    fn start_turn(&self, turn: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let pace = self.pace;
        let workspace = self.workspace.clone();
        tokio::spawn(async move {
            let mut run = DemoTurn {
                turn,
                sink,
                control: rx,
                pace,
                started: Instant::now(),
                output_words: 0,
                steering: Default::default(),
                workspace,
            };
            if run.run().await.is_none() {
                tracing::debug!(chat = %run.turn.chat, turn = %run.turn.turn_id, "demo turn stopped early");
            }
        });
        TurnHandle::new(tx)
    }
}
