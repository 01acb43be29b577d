//! Who dispatched an action, and which actions clients may dispatch at all (and on which channel kind).

use ahp_types::actions::StateAction;
use relay_core::Role;

use crate::model::ChannelKind;

/// Who dispatched an action.
pub struct Dispatcher<'a> {
    pub client_id: &'a str,
    pub role: Role,
    /// The user (the token's `sub`).
    pub subject: &'a str,
}

/// The channel kind an action belongs to, or `None` for action families the relay does not host.
pub(super) fn family(action: &StateAction) -> Option<ChannelKind> {
    use StateAction::*;
    Some(match action {
        RootConfigChanged(_)
        | RootAgentsChanged(_)
        | RootActiveSessionsChanged(_)
        | RootTerminalsChanged(_) => ChannelKind::Root,
        SessionReady(_)
        | SessionCreationFailed(_)
        | SessionChatAdded(_)
        | SessionChatRemoved(_)
        | SessionChatUpdated(_)
        | SessionChatsReordered(_)
        | SessionDefaultChatChanged(_)
        | SessionTitleChanged(_)
        | SessionIsReadChanged(_)
        | SessionIsArchivedChanged(_)
        | SessionActivityChanged(_)
        | SessionChangesetsChanged(_)
        | SessionServerToolsChanged(_)
        | SessionActiveClientSet(_)
        | SessionActiveClientRemoved(_)
        | SessionWorkingDirectorySet(_)
        | SessionWorkingDirectoryRemoved(_)
        | SessionWorkingDirectoryReplaced(_)
        | SessionInputNeededSet(_)
        | SessionInputNeededRemoved(_)
        | SessionCustomizationsChanged(_)
        | SessionCustomizationToggled(_)
        | SessionCustomizationUpdated(_)
        | SessionCustomizationRemoved(_)
        | SessionMcpServerStateChanged(_)
        | SessionMcpServerStartRequested(_)
        | SessionMcpServerStopRequested(_)
        | SessionMcpServerBackgroundRequested(_)
        | SessionConfigChanged(_)
        | SessionMetaChanged(_) => ChannelKind::Session,
        ChatTurnStarted(_)
        | ChatDelta(_)
        | ChatResponsePart(_)
        | ChatToolCallStart(_)
        | ChatToolCallDelta(_)
        | ChatToolCallReady(_)
        | ChatToolCallConfirmed(_)
        | ChatToolCallComplete(_)
        | ChatToolCallResultConfirmed(_)
        | ChatToolCallContentChanged(_)
        | ChatToolCallAuthRequired(_)
        | ChatToolCallAuthResolved(_)
        | ChatTurnComplete(_)
        | ChatTurnCancelled(_)
        | ChatError(_)
        | ChatTurnResume(_)
        | ChatActivityChanged(_)
        | ChatBackgroundWorkSet(_)
        | ChatBackgroundWorkRemoved(_)
        | ChatMovableChanged(_)
        | ChatChangesetsChanged(_)
        | ChatCanvasesChanged(_)
        | ChatUsage(_)
        | ChatReasoning(_)
        | ChatWorkingDirectorySet(_)
        | ChatWorkingDirectoryRemoved(_)
        | ChatPendingMessageSet(_)
        | ChatPendingMessageRemoved(_)
        | ChatQueuedMessagesReordered(_)
        | ChatDraftChanged(_)
        | ChatIsReadChanged(_)
        | ChatIsArchivedChanged(_)
        | ChatInputRequested(_)
        | ChatInputAnswerChanged(_)
        | ChatInputCompleted(_)
        | ChatTruncated(_)
        | ChatTurnsLoaded(_) => ChannelKind::Chat,
        TerminalData(_)
        | TerminalInput(_)
        | TerminalResized(_)
        | TerminalClaimed(_)
        | TerminalTitleChanged(_)
        | TerminalCwdChanged(_)
        | TerminalExited(_)
        | TerminalCleared(_)
        | TerminalCommandDetectionAvailable(_)
        | TerminalCommandExecuted(_)
        | TerminalCommandFinished(_) => ChannelKind::Terminal,
        ChangesetStatusChanged(_)
        | ChangesetFileSet(_)
        | ChangesetFileRemoved(_)
        | ChangesetFilesReviewChanged(_)
        | ChangesetContentChanged(_)
        | ChangesetOperationsChanged(_)
        | ChangesetOperationStatusChanged(_)
        | ChangesetCleared(_) => ChannelKind::Changeset,
        _ => return None,
    })
}

/// Whether clients may dispatch this action at all (the spec's `IS_CLIENT_DISPATCHABLE`, restricted to the
/// channel kinds this relay hosts).
pub fn is_client_dispatchable(action: &StateAction) -> bool {
    use StateAction::*;
    matches!(
        action,
        RootConfigChanged(_)
            | SessionTitleChanged(_)
            | SessionIsReadChanged(_)
            | SessionIsArchivedChanged(_)
            | SessionActiveClientSet(_)
            | SessionActiveClientRemoved(_)
            | SessionWorkingDirectorySet(_)
            | SessionWorkingDirectoryRemoved(_)
            | SessionWorkingDirectoryReplaced(_)
            | SessionCustomizationToggled(_)
            | SessionMcpServerStartRequested(_)
            | SessionMcpServerStopRequested(_)
            | SessionMcpServerBackgroundRequested(_)
            | SessionConfigChanged(_)
            | SessionDefaultChatChanged(_)
            | ChatTurnStarted(_)
            | ChatTurnCancelled(_)
            | ChatTurnResume(_)
            | ChatTruncated(_)
            | ChatToolCallConfirmed(_)
            | ChatToolCallComplete(_)
            | ChatToolCallContentChanged(_)
            | ChatToolCallResultConfirmed(_)
            | ChatPendingMessageSet(_)
            | ChatPendingMessageRemoved(_)
            | ChatQueuedMessagesReordered(_)
            | ChatDraftChanged(_)
            | ChatInputAnswerChanged(_)
            | ChatInputCompleted(_)
            | ChatWorkingDirectorySet(_)
            | ChatWorkingDirectoryRemoved(_)
            | ChatIsReadChanged(_)
            | ChatIsArchivedChanged(_)
            | TerminalInput(_)
            | TerminalResized(_)
            | TerminalClaimed(_)
            | TerminalTitleChanged(_)
            | TerminalCleared(_)
            | ChangesetFilesReviewChanged(_)
    )
}

/// The action's `type` string, for messages.
pub fn action_type(action: &StateAction) -> String {
    serde_json::to_value(action)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}
