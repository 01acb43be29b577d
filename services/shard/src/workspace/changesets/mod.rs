//! Changesets: what a session's turns changed in its working directory, over AHP. Each session with a
//! workspace advertises two (`session/changesetsChanged`): *This turn's changes*
//! (`ahp-changeset:/<session>/turn/{turnId}`, kind `turn`) and *All changes* (`ahp-changeset:/<session>/all`,
//! kind `session`), both reviewable. A changeset channel is opened when a client subscribes to it: its state
//! lists each changed file with its `FileEdit` — both sides as `ahp-checkpoint:` content refs any client reads
//! with `resourceRead`, and the added/removed line counts — computed by the tenant's file server
//! ([`relay_runner::files`]). Review marks (`changeset/filesReviewChanged`) are devices' actions, stored with the
//! channel (the session's child in the store, restored with it). `invokeChangesetOperation` reverts a file or
//! all of them (the files are written back as they were) and, where the working directory is a git repository
//! of its own, stages a file or commits everything; the operation's status is shown while it runs, and every
//! open changeset of the session is computed again after it.
//!
//! The working directory is checkpointed (a commit in the tenant's shadow repository) when a turn starts —
//! before its agent gets the prompt — and when it ends; the session's first checkpoint is its base. A turn's
//! changeset lists the files its two checkpoints differ in and that still differ from its start (a reverted
//! file leaves it); *All changes* compares the base with the directory now. The checkpoints' ids are kept in
//! the session's `_meta["ahpRelay/checkpoints"]` (the newest [`MAX_TURNS_KEPT`] turns).
//!
//! Rooms: [`checkpoints`] below [`channels`] (a changeset's channel, computed) below [`operations`]; their URIs
//! are the model's ([`crate::model::changeset_uris`]). Nothing here reads or writes a tenant's files itself:
//! every diff, revert, stage and commit runs in the tenant's file server, outside the host's lock.

mod channels;
mod checkpoints;
mod operations;

pub use crate::model::changeset_uris::*;
pub use channels::*;
pub use checkpoints::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ChangesetScope;
    use relay_runner::files::{ChangeStatus, ChangedFile};

    #[test]
    fn changeset_uris_round_trip_whatever_the_session_is_called() {
        for session in [
            "ahp-session:/plain",
            "ahp-session:/with/slashes and {braces}%",
            "ahp-session:/ü",
        ] {
            for scope in [
                ChangesetScope::All,
                ChangesetScope::Turn {
                    turn_id: "t/1 {x}".into(),
                },
            ] {
                let uri = uri_of(session, &scope);
                assert!(!uri[CHANGESET_SCHEME.len()..].contains(['{', '}']), "{uri}");
                assert_eq!(
                    parse_uri(&uri),
                    Some((session.to_string(), scope.clone())),
                    "{uri}"
                );
            }
            let template = &catalogue(session)[0].uri_template;
            let expanded = template.replace("{turnId}", "t9");
            assert_eq!(
                parse_uri(&expanded),
                Some((session.to_string(), ChangesetScope::Turn { turn_id: "t9".into() }))
            );
        }
        assert_eq!(parse_uri("ahp-changeset:/x/other"), None);
        assert_eq!(parse_uri("ahp-changeset:/%zz/all"), None);
    }

    #[test]
    fn a_checkpoint_uri_names_its_blob_and_path() {
        let changed = ChangedFile {
            path: "src/a b%.rs".into(),
            status: ChangeStatus::Modified,
            added: Some(2),
            removed: Some(1),
            before: Some("c0ffee1".into()),
            after: Some("c0ffee2".into()),
        };
        let file = changeset_file("/w", &changed);
        let before = file.edit.before.expect("before");
        assert_eq!(before.uri, "file:///w/src/a b%.rs");
        assert_eq!(
            parse_checkpoint_uri(&before.content.uri),
            Some(("c0ffee1".into(), "src/a b%.rs".into()))
        );
        let added = changeset_file(
            "/w",
            &ChangedFile {
                status: ChangeStatus::Added,
                before: None,
                ..changed
            },
        );
        assert!(added.edit.before.is_none() && added.edit.after.is_some());
    }
}
