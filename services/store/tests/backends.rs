//! The store's behaviour, written once and run against both backends: each behaviour is an async fn taking a
//! freshly migrated [`TestDb`], and `on_both_backends!` turns it into one test on SQLite (a file in a temp
//! directory) and one on Postgres (a database of its own, created in the server `DATABASE_URL` points at;
//! without `DATABASE_URL` the Postgres variant prints "skipped: DATABASE_URL not set" and passes —
//! `scripts/with-postgres cargo test -p relay-store` provides one).

// The behaviours are plain async fns rather than `#[test]`s, which clippy's allow-unwrap-in-tests misses.
#![allow(clippy::unwrap_used)]

use std::time::{SystemTime, UNIX_EPOCH};

use relay_store::{
    ArchivedTurn, Backend, CatalogChange, CatalogCursor, CatalogEntry, CommitBatch, HostRecord, Lease,
    LogEntry, SnapshotEntry, Store, StoreError,
};
use sqlx::{Connection, Executor};

/// A migrated store of its own, and what it takes to reopen and then remove it.
struct TestDb {
    store: Store,
    url: String,
    /// Keeps the SQLite file's directory alive for the test.
    _dir: Option<tempfile::TempDir>,
    /// For Postgres: the server's URL and the name of the database to drop afterwards.
    postgres: Option<(String, String)>,
}

impl TestDb {
    async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("relay.db").display());
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(store.backend(), Backend::Sqlite);
        TestDb {
            store,
            url,
            _dir: Some(dir),
            postgres: None,
        }
    }

    /// `None` when `DATABASE_URL` is not set.
    async fn postgres(behaviour: &str) -> Option<TestDb> {
        let server = std::env::var("DATABASE_URL").ok().filter(|url| !url.is_empty())?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name: String = format!(
            "rs_{}_{}_{nanos}",
            &behaviour[..behaviour.len().min(30)],
            std::process::id()
        );
        sqlx::any::install_default_drivers();
        let mut admin = sqlx::AnyConnection::connect(&server).await.unwrap();
        admin
            .execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .unwrap();
        admin.close().await.unwrap();
        let url = with_database(&server, &name);
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(store.backend(), Backend::Postgres);
        Some(TestDb {
            store,
            url,
            _dir: None,
            postgres: Some((server, name)),
        })
    }

    /// Closes the store and drops a Postgres test database (a failed test leaves its database behind).
    async fn finish(self) {
        self.store.close().await;
        if let Some((server, name)) = self.postgres {
            let mut admin = sqlx::AnyConnection::connect(&server).await.unwrap();
            admin
                .execute(format!("DROP DATABASE {name} WITH (FORCE)").as_str())
                .await
                .unwrap();
            admin.close().await.unwrap();
        }
    }
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let authority_end = base[authority_start..]
        .find('/')
        .map_or(base.len(), |at| authority_start + at);
    format!("{}/{name}{query}", &base[..authority_end])
}

macro_rules! on_both_backends {
    ($($behaviour:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $behaviour() {
                    let db = super::TestDb::sqlite().await;
                    super::$behaviour(&db).await;
                    db.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $behaviour() {
                    let Some(db) = super::TestDb::postgres(stringify!($behaviour)).await else {
                        eprintln!("skipped: DATABASE_URL not set");
                        return;
                    };
                    super::$behaviour(&db).await;
                    db.finish().await;
                }
            )*
        }
    };
}

on_both_backends!(
    commit_then_load_channel_returns_the_snapshot_and_the_tail_after_it,
    the_latest_snapshot_wins,
    last_seq_only_grows_and_counts_unlogged_seqs,
    log_after_pages_through_the_requested_channels_in_seq_order,
    log_range_reads_every_channel_between_two_seqs,
    list_sessions_pages_newest_first_without_duplicates_under_concurrent_creates,
    removed_sessions_leave_the_list_and_their_numbers_are_not_reused,
    compaction_keeps_channels_restorable_and_raises_the_log_floor,
    tenants_and_hosts_are_isolated,
    migrate_is_idempotent_and_keeps_data,
    ten_thousand_log_rows_commit_in_one_call,
    a_failing_batch_writes_nothing,
    raw_log_inserts_write_only_the_log,
    leases_are_acquired_renewed_released_and_expire,
    the_epoch_grows_at_every_change_of_owner_and_never_otherwise,
    a_deposed_owner_cannot_commit_and_writes_nothing,
    concurrent_acquirers_of_one_host_have_exactly_one_winner,
    an_acquire_cannot_slip_between_the_fencing_check_and_the_writes,
    orphaned_hosts_lists_released_and_expired_leases_only,
    leases_are_isolated_between_tenants_and_hosts,
    renewing_an_owners_leases_renews_exactly_what_it_still_holds,
    ping_answers_while_the_store_is_reachable,
    a_channel_disposed_then_created_again_in_one_batch_stays_loadable,
    a_client_id_keeps_its_first_subject,
    stored_bytes_count_a_tenants_log_snapshots_and_client_bindings,
    bindings_unused_past_the_retention_are_pruned_and_used_ones_kept,
    archived_turns_are_read_by_range_and_found_by_id_and_go_with_their_key,
    a_store_a_newer_release_migrated_further_still_opens,
    every_write_waits_while_writes_are_held_and_reads_go_on,
);

const T: &str = "acme";
const H: &str = "default";
const SESSION: &str = "ahp-session:/s1";
const CHAT: &str = "ahp-chat:/c1";

fn entry(seq: u64, channel: &str) -> LogEntry {
    LogEntry {
        seq,
        channel: channel.into(),
        envelope: format!(r#"{{"channel":"{channel}","serverSeq":{seq}}}"#),
        at_ms: 1_000 + i64::try_from(seq).unwrap(),
    }
}

fn snapshot(channel: &str, parent: Option<&str>, seq: u64) -> SnapshotEntry {
    SnapshotEntry {
        channel: channel.into(),
        parent: parent.map(Into::into),
        seq,
        state: format!(r#"{{"channel":"{channel}","at":{seq}}}"#),
    }
}

fn upsert(uri: &str, catalog_no: u64) -> CatalogChange {
    CatalogChange::Upsert {
        uri: uri.into(),
        catalog_no,
        created_at: format!("2025-01-01T00:00:{catalog_no:02}Z"),
        modified_at: format!("2025-01-01T00:00:{catalog_no:02}Z"),
        summary: format!(r#"{{"resource":"{uri}","title":"session {catalog_no}"}}"#),
    }
}

fn log_batch(last_seq: u64, log: Vec<LogEntry>) -> CommitBatch {
    CommitBatch {
        last_seq,
        log,
        ..CommitBatch::default()
    }
}

fn seqs(entries: &[LogEntry]) -> Vec<u64> {
    entries.iter().map(|entry| entry.seq).collect()
}

fn uris(entries: &[CatalogEntry]) -> Vec<&str> {
    entries.iter().map(|entry| entry.uri.as_str()).collect()
}

async fn commit_then_load_channel_returns_the_snapshot_and_the_tail_after_it(db: &TestDb) {
    let store = &db.store;
    let first = CommitBatch {
        last_seq: 5,
        log: vec![
            entry(1, SESSION),
            entry(2, CHAT),
            entry(3, CHAT),
            entry(4, SESSION),
            entry(5, CHAT),
        ],
        snapshots: vec![snapshot(SESSION, None, 1), snapshot(CHAT, Some(SESSION), 2)],
        ..CommitBatch::default()
    };
    store.commit(T, H, &first).await.unwrap();
    store
        .commit(T, H, &log_batch(7, vec![entry(6, CHAT), entry(7, SESSION)]))
        .await
        .unwrap();

    let chat = store.load_channel(T, H, CHAT).await.unwrap().unwrap();
    assert_eq!(chat.snapshot_seq, 2);
    assert_eq!(chat.state, snapshot(CHAT, None, 2).state);
    assert_eq!(chat.tail, [entry(3, CHAT), entry(5, CHAT), entry(6, CHAT)]);
    let session = store.load_channel(T, H, SESSION).await.unwrap().unwrap();
    assert_eq!((session.snapshot_seq, seqs(&session.tail)), (1, vec![4, 7]));
    assert_eq!(store.load_channel(T, H, "ahp-chat:/unknown").await.unwrap(), None);
    assert_eq!(store.chats_of(T, H, SESSION).await.unwrap(), [CHAT]);

    // A newer snapshot leaves an empty tail; a disposed channel has no record.
    let third = CommitBatch {
        last_seq: 8,
        log: vec![entry(8, SESSION)],
        snapshots: vec![snapshot(CHAT, Some(SESSION), 6)],
        disposed: vec![SESSION.into()],
        ..CommitBatch::default()
    };
    store.commit(T, H, &third).await.unwrap();
    assert_eq!(store.load_channel(T, H, SESSION).await.unwrap(), None);
    let chat = store.load_channel(T, H, CHAT).await.unwrap().unwrap();
    assert_eq!((chat.snapshot_seq, chat.tail.len()), (6, 0));

    // Disposed alone: gone, and no longer listed under its session.
    let disposed = CommitBatch {
        last_seq: 9,
        disposed: vec![CHAT.into()],
        ..CommitBatch::default()
    };
    store.commit(T, H, &disposed).await.unwrap();
    assert_eq!(store.load_channel(T, H, CHAT).await.unwrap(), None);
    assert!(store.chats_of(T, H, SESSION).await.unwrap().is_empty());
}

async fn the_latest_snapshot_wins(db: &TestDb) {
    let store = &db.store;
    let other_chat = "ahp-chat:/c2";
    let batch = CommitBatch {
        last_seq: 5,
        snapshots: vec![
            snapshot(CHAT, Some(SESSION), 5),
            snapshot(other_chat, Some(SESSION), 1),
            snapshot(CHAT, Some(SESSION), 3),
        ],
        ..CommitBatch::default()
    };
    store.commit(T, H, &batch).await.unwrap();
    let snapshot_seq = |channel: &'static str| async move {
        store
            .load_channel(T, H, channel)
            .await
            .unwrap()
            .unwrap()
            .snapshot_seq
    };
    assert_eq!(snapshot_seq(CHAT).await, 5);
    // An older snapshot never replaces a newer one; a newer one does.
    store
        .commit(
            T,
            H,
            &CommitBatch {
                snapshots: vec![snapshot(CHAT, None, 4)],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(snapshot_seq(CHAT).await, 5);
    store
        .commit(
            T,
            H,
            &CommitBatch {
                snapshots: vec![snapshot(CHAT, None, 9)],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(snapshot_seq(CHAT).await, 9);
    // The new snapshot no longer names the session.
    assert_eq!(store.chats_of(T, H, SESSION).await.unwrap(), [other_chat]);
}

async fn last_seq_only_grows_and_counts_unlogged_seqs(db: &TestDb) {
    let store = &db.store;
    let fresh = HostRecord {
        last_seq: 0,
        log_floor: 0,
        next_catalog_no: 1,
    };
    assert_eq!(store.load_host(T, H).await.unwrap(), fresh);
    assert_eq!(store.load_host(T, H).await.unwrap(), fresh);

    // Seqs 4..=10 were rejections: assigned, never logged.
    store
        .commit(
            T,
            H,
            &log_batch(10, vec![entry(1, SESSION), entry(2, SESSION), entry(3, CHAT)]),
        )
        .await
        .unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 10);
    store.commit(T, H, &log_batch(4, vec![])).await.unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 10);
    store.commit(T, H, &CommitBatch::default()).await.unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 10);
    store.commit(T, H, &log_batch(11, vec![])).await.unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 11);
    // A logged seq counts even if the batch's last_seq understates it.
    store
        .commit(T, H, &log_batch(0, vec![entry(12, CHAT)]))
        .await
        .unwrap();
    assert_eq!(
        store.load_host(T, H).await.unwrap(),
        HostRecord {
            last_seq: 12,
            ..fresh
        }
    );

    // Reopening the store changes nothing.
    let reopened = Store::connect(&db.url).await.unwrap();
    assert_eq!(reopened.load_host(T, H).await.unwrap().last_seq, 12);
    reopened.close().await;

    // Counters the database cannot hold are refused, not wrapped.
    let too_big = store.commit(T, H, &log_batch(u64::MAX, vec![])).await;
    assert!(
        matches!(too_big, Err(StoreError::OutOfRange { what: "last_seq", .. })),
        "{too_big:?}"
    );
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 12);
}

async fn log_range_reads_every_channel_between_two_seqs(db: &TestDb) {
    let store = &db.store;
    let channels = ["ahp-session:/a", "ahp-session:/b", "ahp-chat:/c"];
    let log: Vec<LogEntry> = (1..=12)
        .filter(|seq| seq % 5 != 0) // unlogged numbers (rejections) leave holes
        .map(|seq| entry(seq, channels[(seq % 3) as usize]))
        .collect();
    store.commit(T, H, &log_batch(12, log.clone())).await.unwrap();

    let all = store.log_range(T, H, 2, 11, 100).await.unwrap();
    assert_eq!(seqs(&all), [3, 4, 6, 7, 8, 9, 11]);
    let expected: Vec<LogEntry> = log.iter().filter(|e| e.seq > 2 && e.seq <= 11).cloned().collect();
    assert_eq!(all, expected);
    assert_eq!(seqs(&store.log_range(T, H, 2, 11, 3).await.unwrap()), [3, 4, 6]);
    assert!(store.log_range(T, H, 4, 4, 100).await.unwrap().is_empty());
    assert!(store.log_range(T, H, 0, 12, 0).await.unwrap().is_empty());
    assert!(store
        .log_range(T, "other-host", 0, 12, 100)
        .await
        .unwrap()
        .is_empty());
}

async fn log_after_pages_through_the_requested_channels_in_seq_order(db: &TestDb) {
    let store = &db.store;
    let channels = ["ahp-session:/a", "ahp-session:/b", "ahp-chat:/c"];
    let log: Vec<LogEntry> = (1..=30)
        .map(|seq| entry(seq, channels[(seq % 3) as usize]))
        .collect();
    store.commit(T, H, &log_batch(30, log.clone())).await.unwrap();

    let wanted = vec![channels[0].to_owned(), channels[2].to_owned()];
    let expected: Vec<LogEntry> = log
        .iter()
        .filter(|entry| wanted.contains(&entry.channel))
        .cloned()
        .collect();
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let page = store.log_after(T, H, after, &wanted, 7).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 7);
        assert!(page.windows(2).all(|pair| pair[0].seq < pair[1].seq));
        after = page.last().unwrap().seq;
        pages.push(page);
    }
    assert_eq!(pages.len(), 3); // 20 rows in pages of 7
    assert_eq!(pages.concat(), expected);

    assert_eq!(
        seqs(&store.log_after(T, H, 25, &wanted, 100).await.unwrap()),
        [26, 27, 29, 30]
    );
    assert!(store.log_after(T, H, 0, &[], 100).await.unwrap().is_empty());
    assert!(store.log_after(T, H, 0, &wanted, 0).await.unwrap().is_empty());
    assert!(store.log_after(T, H, 30, &wanted, 100).await.unwrap().is_empty());

    // A long channel list (read in slices) still yields the first rows overall.
    let mut many: Vec<String> = (0..1_200).map(|i| format!("ahp-chat:/absent-{i}")).collect();
    many.insert(0, channels[1].to_owned());
    many.push(channels[0].to_owned());
    let page = store.log_after(T, H, 3, &many, 5).await.unwrap();
    assert_eq!(seqs(&page), [4, 6, 7, 9, 10]);
}

async fn list_sessions_pages_newest_first_without_duplicates_under_concurrent_creates(db: &TestDb) {
    let store = &db.store;
    let first: Vec<CatalogChange> = (1..=5)
        .map(|no| upsert(&format!("ahp-session:/{no}"), no))
        .collect();
    store
        .commit(
            T,
            H,
            &CommitBatch {
                catalog: first,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();

    let page1 = store.list_sessions(T, H, None, 2).await.unwrap();
    assert_eq!(uris(&page1), ["ahp-session:/5", "ahp-session:/4"]);
    assert_eq!(
        page1[0],
        CatalogEntry {
            uri: "ahp-session:/5".into(),
            catalog_no: 5,
            created_at: "2025-01-01T00:00:05Z".into(),
            modified_at: "2025-01-01T00:00:05Z".into(),
            summary: r#"{"resource":"ahp-session:/5","title":"session 5"}"#.into(),
        }
    );

    // Two sessions are created between pages; numbering continues from the host's counter.
    let next = store.load_host(T, H).await.unwrap().next_catalog_no;
    assert_eq!(next, 6);
    let created = vec![upsert("ahp-session:/6", next), upsert("ahp-session:/7", next + 1)];
    store
        .commit(
            T,
            H,
            &CommitBatch {
                catalog: created,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();

    let page2 = store
        .list_sessions(T, H, Some(&page1[1].cursor()), 2)
        .await
        .unwrap();
    assert_eq!(uris(&page2), ["ahp-session:/3", "ahp-session:/2"]);
    let page3 = store
        .list_sessions(T, H, Some(&page2[1].cursor()), 2)
        .await
        .unwrap();
    assert_eq!(uris(&page3), ["ahp-session:/1"]);
    assert!(store
        .list_sessions(T, H, Some(&page3[0].cursor()), 2)
        .await
        .unwrap()
        .is_empty());

    // Starting over shows the new sessions first.
    let all = store.list_sessions(T, H, None, 100).await.unwrap();
    let numbers: Vec<u64> = all.iter().map(|entry| entry.catalog_no).collect();
    assert_eq!(numbers, [7, 6, 5, 4, 3, 2, 1]);
    assert!(store.list_sessions(T, H, None, 0).await.unwrap().is_empty());
    let past_everything = CatalogCursor {
        modified_at: "9999".into(),
        catalog_no: u64::MAX,
    };
    assert_eq!(
        store
            .list_sessions(T, H, Some(&past_everything), 1)
            .await
            .unwrap()[0]
            .catalog_no,
        7
    );

    // A session modified later lists first, whatever its number.
    let touched = vec![CatalogChange::Upsert {
        uri: "ahp-session:/2".into(),
        catalog_no: 2,
        created_at: "2025-01-01T00:00:02Z".into(),
        modified_at: "2025-01-01T00:01:00Z".into(),
        summary: "{}".into(),
    }];
    store
        .commit(
            T,
            H,
            &CommitBatch {
                catalog: touched,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    let all = store.list_sessions(T, H, None, 100).await.unwrap();
    let numbers: Vec<u64> = all.iter().map(|entry| entry.catalog_no).collect();
    assert_eq!(numbers, [2, 7, 6, 5, 4, 3, 1]);
}

async fn removed_sessions_leave_the_list_and_their_numbers_are_not_reused(db: &TestDb) {
    let store = &db.store;
    let created = vec![
        upsert("ahp-session:/1", 1),
        upsert("ahp-session:/2", 2),
        upsert("ahp-session:/3", 3),
    ];
    store
        .commit(
            T,
            H,
            &CommitBatch {
                catalog: created,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    let removed = vec![
        CatalogChange::Remove {
            uri: "ahp-session:/3".into(),
        },
        CatalogChange::Remove {
            uri: "ahp-session:/2".into(),
        },
        CatalogChange::Remove {
            uri: "ahp-session:/never-existed".into(),
        },
    ];
    store
        .commit(
            T,
            H,
            &CommitBatch {
                catalog: removed,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        uris(&store.list_sessions(T, H, None, 10).await.unwrap()),
        ["ahp-session:/1"]
    );
    assert_eq!(store.load_host(T, H).await.unwrap().next_catalog_no, 4);

    // A summary change replaces the entry in place; changes to one URI in one batch apply in order.
    let changes = vec![
        CatalogChange::Upsert {
            uri: "ahp-session:/1".into(),
            catalog_no: 1,
            created_at: "2025-01-01T00:00:01Z".into(),
            modified_at: "2025-01-01T00:00:01Z".into(),
            summary: r#"{"title":"renamed"}"#.into(),
        },
        upsert("ahp-session:/4", 4),
        upsert("ahp-session:/5", 5),
        CatalogChange::Remove {
            uri: "ahp-session:/5".into(),
        },
        CatalogChange::Remove {
            uri: "ahp-session:/6".into(),
        },
        upsert("ahp-session:/6", 6),
    ];
    store
        .commit(
            T,
            H,
            &CommitBatch {
                catalog: changes,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    let listed = store.list_sessions(T, H, None, 10).await.unwrap();
    assert_eq!(
        uris(&listed),
        ["ahp-session:/6", "ahp-session:/4", "ahp-session:/1"]
    );
    assert_eq!(listed[2].summary, r#"{"title":"renamed"}"#);
    assert_eq!(store.load_host(T, H).await.unwrap().next_catalog_no, 7);
}

async fn compaction_keeps_channels_restorable_and_raises_the_log_floor(db: &TestDb) {
    let store = &db.store;
    let disposed = "ahp-chat:/gone";
    let aged = |seq: u64, channel: &str| LogEntry {
        at_ms: i64::try_from(seq).unwrap() * 100,
        ..entry(seq, channel)
    };
    let channels = [
        CHAT, SESSION, disposed, CHAT, CHAT, SESSION, CHAT, CHAT, disposed, CHAT,
    ];
    let log: Vec<LogEntry> = (1..=10)
        .map(|seq| aged(seq, channels[seq as usize - 1]))
        .collect();
    let batch = CommitBatch {
        last_seq: 10,
        log: log.clone(),
        snapshots: vec![snapshot(CHAT, Some(SESSION), 5), snapshot(SESSION, None, 2)],
        ..CommitBatch::default()
    };
    store.commit(T, H, &batch).await.unwrap();
    let other = CommitBatch {
        last_seq: 3,
        log: vec![aged(1, SESSION), aged(2, SESSION), aged(3, SESSION)],
        snapshots: vec![snapshot(SESSION, None, 3)],
        ..CommitBatch::default()
    };
    store.commit(T, "other", &other).await.unwrap();
    let chat_before = store.load_channel(T, H, CHAT).await.unwrap().unwrap();
    let session_before = store.load_channel(T, H, SESSION).await.unwrap().unwrap();

    // Rows 1..=7 are older than the cut-off. Removable: 1, 4, 5 (chat, covered by its snapshot at 5),
    // 2 (session, snapshot at 2), 3 (disposed channel); kept: 6 (session tail), 7 (chat tail). Plus all
    // three rows of the other host.
    assert_eq!(store.compact(750).await.unwrap(), 5 + 3);
    assert_eq!(
        store.load_host(T, H).await.unwrap(),
        HostRecord {
            last_seq: 10,
            log_floor: 5,
            next_catalog_no: 1
        }
    );
    assert_eq!(store.load_host(T, "other").await.unwrap().log_floor, 3);
    assert_eq!(
        store.load_channel(T, H, CHAT).await.unwrap().unwrap(),
        chat_before
    );
    assert_eq!(
        store.load_channel(T, H, SESSION).await.unwrap().unwrap(),
        session_before
    );
    let all = vec![CHAT.to_owned(), SESSION.to_owned(), disposed.to_owned()];
    assert_eq!(
        seqs(&store.log_after(T, H, 0, &all, 100).await.unwrap()),
        [6, 7, 8, 9, 10]
    );

    // Nothing more to do at the same cut-off.
    assert_eq!(store.compact(750).await.unwrap(), 0);
    assert_eq!(store.load_host(T, H).await.unwrap().log_floor, 5);

    // A newer chat snapshot lets its older tail go too; the session's tail after its snapshot stays.
    let newer = CommitBatch {
        snapshots: vec![snapshot(CHAT, Some(SESSION), 8)],
        ..CommitBatch::default()
    };
    store.commit(T, H, &newer).await.unwrap();
    assert_eq!(store.compact(10_000).await.unwrap(), 3); // 7, 8 (chat) and 9 (disposed)
    assert_eq!(store.load_host(T, H).await.unwrap().log_floor, 9);
    let chat = store.load_channel(T, H, CHAT).await.unwrap().unwrap();
    assert_eq!((chat.snapshot_seq, seqs(&chat.tail)), (8, vec![10]));
    assert_eq!(
        store.load_channel(T, H, SESSION).await.unwrap().unwrap(),
        session_before
    );
    assert_eq!(seqs(&store.log_after(T, H, 0, &all, 100).await.unwrap()), [6, 10]);
}

async fn tenants_and_hosts_are_isolated(db: &TestDb) {
    let store = &db.store;
    let tagged = |tenant: &str, seq: u64| LogEntry {
        envelope: format!(r#"{{"tenant":"{tenant}"}}"#),
        ..entry(seq, SESSION)
    };
    let state = |tenant: &str| format!(r#"{{"owner":"{tenant}"}}"#);
    let acme = CommitBatch {
        last_seq: 3,
        log: (1..=3).map(|seq| tagged("acme", seq)).collect(),
        snapshots: vec![
            SnapshotEntry {
                state: state("acme"),
                ..snapshot(SESSION, None, 1)
            },
            snapshot(CHAT, Some(SESSION), 1),
        ],
        catalog: vec![upsert(SESSION, 1)],
        ..CommitBatch::default()
    };
    let globex = CommitBatch {
        last_seq: 9,
        log: (1..=5).map(|seq| tagged("globex", seq)).collect(),
        snapshots: vec![SnapshotEntry {
            state: state("globex"),
            ..snapshot(SESSION, None, 2)
        }],
        catalog: vec![upsert(SESSION, 7)],
        ..CommitBatch::default()
    };
    store.commit("acme", H, &acme).await.unwrap();
    store.commit("globex", H, &globex).await.unwrap();

    for (tenant, last_seq, snapshot_seq, tail, catalog_no, chats) in [
        ("acme", 3, 1, vec![2, 3], 1, vec![CHAT]),
        ("globex", 9, 2, vec![3, 4, 5], 7, vec![]),
    ] {
        let host = store.load_host(tenant, H).await.unwrap();
        assert_eq!(
            (host.last_seq, host.next_catalog_no),
            (last_seq, catalog_no + 1),
            "{tenant}"
        );
        let channel = store.load_channel(tenant, H, SESSION).await.unwrap().unwrap();
        assert_eq!(
            (channel.snapshot_seq, channel.state.as_str()),
            (snapshot_seq, state(tenant).as_str())
        );
        assert_eq!(seqs(&channel.tail), tail);
        let replay = store
            .log_after(tenant, H, 0, &[SESSION.to_owned()], 100)
            .await
            .unwrap();
        assert!(
            replay.iter().all(|entry| entry.envelope.contains(tenant)),
            "{tenant}: {replay:?}"
        );
        let listed = store.list_sessions(tenant, H, None, 10).await.unwrap();
        assert_eq!(
            listed.iter().map(|entry| entry.catalog_no).collect::<Vec<_>>(),
            [catalog_no]
        );
        assert_eq!(store.chats_of(tenant, H, SESSION).await.unwrap(), chats);
    }
    // A tenant with nothing sees nothing, and another host of the same tenant is another space.
    for (tenant, host) in [("initech", H), ("acme", "other")] {
        assert_eq!(store.load_channel(tenant, host, SESSION).await.unwrap(), None);
        assert!(store
            .log_after(tenant, host, 0, &[SESSION.to_owned()], 100)
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .list_sessions(tenant, host, None, 10)
            .await
            .unwrap()
            .is_empty());
        assert!(store.chats_of(tenant, host, SESSION).await.unwrap().is_empty());
        assert_eq!(store.load_host(tenant, host).await.unwrap().last_seq, 0);
    }

    // Disposing and removing in one tenant leaves the other's rows alone; so does compacting.
    let dispose = CommitBatch {
        disposed: vec![SESSION.into()],
        catalog: vec![CatalogChange::Remove { uri: SESSION.into() }],
        ..CommitBatch::default()
    };
    store.commit("globex", H, &dispose).await.unwrap();
    assert_eq!(store.load_channel("globex", H, SESSION).await.unwrap(), None);
    assert!(store
        .list_sessions("globex", H, None, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.compact(i64::MAX).await.unwrap(), 5 + 1); // globex: all (disposed); acme: seq 1
    assert_eq!(store.load_host("globex", H).await.unwrap().log_floor, 5);
    assert_eq!(store.load_host("acme", H).await.unwrap().log_floor, 1);
    assert_eq!(
        seqs(
            &store
                .load_channel("acme", H, SESSION)
                .await
                .unwrap()
                .unwrap()
                .tail
        ),
        [2, 3]
    );
    assert_eq!(store.list_sessions("acme", H, None, 10).await.unwrap().len(), 1);
}

async fn migrate_is_idempotent_and_keeps_data(db: &TestDb) {
    let store = &db.store;
    store
        .commit(T, H, &log_batch(3, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let reopened = Store::connect(&db.url).await.unwrap();
    reopened.migrate().await.unwrap();
    assert_eq!(reopened.load_host(T, H).await.unwrap().last_seq, 3);
    assert_eq!(
        seqs(
            &reopened
                .log_after(T, H, 0, &[SESSION.to_owned()], 10)
                .await
                .unwrap()
        ),
        [1]
    );
    reopened.close().await;
}

async fn ten_thousand_log_rows_commit_in_one_call(db: &TestDb) {
    let store = &db.store;
    let channels: Vec<String> = (0..10).map(|i| format!("ahp-chat:/c{i}")).collect();
    let log: Vec<LogEntry> = (1..=10_000u64)
        .map(|seq| LogEntry {
            envelope: format!(
                r#"{{"serverSeq":{seq},"action":{{"type":"chat/delta","text":"{}"}}}}"#,
                "x".repeat(150)
            ),
            ..entry(seq, &channels[(seq % 10) as usize])
        })
        .collect();
    let snapshots = channels
        .iter()
        .map(|channel| snapshot(channel, Some(SESSION), 0))
        .collect();
    let batch = CommitBatch {
        last_seq: 10_000,
        log: log.clone(),
        snapshots,
        ..CommitBatch::default()
    };
    let started = std::time::Instant::now();
    store.commit(T, H, &batch).await.unwrap();
    eprintln!(
        "{:?}: 10,000 log rows committed in {:?}",
        store.backend(),
        started.elapsed()
    );

    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 10_000);
    assert_eq!(store.log_after(T, H, 0, &channels, 20_000).await.unwrap(), log);
    let restored = store.load_channel(T, H, &channels[3]).await.unwrap().unwrap();
    assert_eq!(restored.tail.len(), 1_000);
    assert!(restored.tail.iter().all(|entry| entry.seq % 10 == 3));
    assert_eq!(store.chats_of(T, H, SESSION).await.unwrap(), channels);
}

async fn a_failing_batch_writes_nothing(db: &TestDb) {
    let store = &db.store;
    store
        .commit(T, H, &log_batch(1, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    // Seq 1 is already logged: the INSERT fails after the counters were raised; all of it rolls back.
    let duplicate = CommitBatch {
        last_seq: 50,
        log: vec![entry(2, SESSION), entry(1, SESSION)],
        catalog: vec![upsert(SESSION, 9)],
        ..CommitBatch::default()
    };
    assert!(matches!(
        store.commit(T, H, &duplicate).await,
        Err(StoreError::Database(_))
    ));
    // A snapshot seq the database cannot hold fails after the log rows were inserted.
    let out_of_range = CommitBatch {
        last_seq: 60,
        log: vec![entry(2, SESSION)],
        snapshots: vec![snapshot(SESSION, None, u64::MAX)],
        ..CommitBatch::default()
    };
    assert!(matches!(
        store.commit(T, H, &out_of_range).await,
        Err(StoreError::OutOfRange { what: "seq", .. })
    ));

    assert_eq!(
        store.load_host(T, H).await.unwrap(),
        HostRecord {
            last_seq: 1,
            log_floor: 0,
            next_catalog_no: 1
        }
    );
    assert_eq!(
        seqs(&store.log_after(T, H, 0, &[SESSION.to_owned()], 10).await.unwrap()),
        [1]
    );
    assert_eq!(store.load_channel(T, H, SESSION).await.unwrap(), None);
    assert!(store.list_sessions(T, H, None, 10).await.unwrap().is_empty());
    // The store is still usable.
    store
        .commit(T, H, &log_batch(2, vec![entry(2, SESSION)]))
        .await
        .unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 2);
}

async fn raw_log_inserts_write_only_the_log(db: &TestDb) {
    let store = &db.store;
    store
        .insert_log_raw(T, H, (1..=3).map(|seq| entry(seq, CHAT)).collect())
        .await
        .unwrap();
    assert_eq!(
        seqs(&store.log_after(T, H, 0, &[CHAT.to_owned()], 10).await.unwrap()),
        [1, 2, 3]
    );
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 0);
}

// ---- Host ownership leases and fenced commits ----

const TTL: i64 = 1_000;

/// Every stored trace of a host: counters, the whole log, two channels' records, the catalogue, the chats.
async fn everything_of(store: &Store, tenant: &str, host: &str) -> String {
    let channels = vec![SESSION.to_owned(), CHAT.to_owned()];
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        store
            .client_binding(tenant, host, "deposed-client")
            .await
            .unwrap(),
        store
            .archived_turns(tenant, host, "relay-archive:deposed", 0, 10)
            .await
            .unwrap(),
        store.load_host(tenant, host).await.unwrap(),
        store.log_after(tenant, host, 0, &channels, 1_000).await.unwrap(),
        store.load_channel(tenant, host, SESSION).await.unwrap(),
        store.load_channel(tenant, host, CHAT).await.unwrap(),
        store.list_sessions(tenant, host, None, 100).await.unwrap(),
        store.chats_of(tenant, host, SESSION).await.unwrap(),
    )
}

fn fenced(result: Result<(), StoreError>) -> (u64, u64, Option<String>) {
    match result {
        Err(StoreError::Fenced {
            expected,
            found,
            holder,
        }) => (expected, found, holder),
        other => panic!("expected Fenced, got {other:?}"),
    }
}

async fn leases_are_acquired_renewed_released_and_expire(db: &TestDb) {
    let store = &db.store;
    assert_eq!(store.lease_of(T, H).await.unwrap(), None);

    // A free host: the first lease has epoch 1 and lasts ttl.
    let a = store
        .acquire_lease(T, H, "a", TTL, 10_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        a,
        Lease {
            tenant: T.into(),
            host: H.into(),
            owner: "a".into(),
            epoch: 1,
            expires_at_ms: 11_000
        }
    );
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(a.clone()));

    // Held by someone else: refused, and nothing changes.
    assert_eq!(store.acquire_lease(T, H, "b", TTL, 10_500).await.unwrap(), None);
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(a.clone()));

    // Acquiring one's own lease renews it and keeps the epoch; so does renew_lease.
    let a = store
        .acquire_lease(T, H, "a", TTL, 10_600)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((a.epoch, a.expires_at_ms), (1, 11_600));
    let a = store.renew_lease(&a, 2 * TTL, 10_900).await.unwrap().unwrap();
    assert_eq!((a.owner.as_str(), a.epoch, a.expires_at_ms), ("a", 1, 12_900));
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(a.clone()));

    // Held until the instant before expires_at_ms; free from it on.
    assert_eq!(store.acquire_lease(T, H, "b", TTL, 12_899).await.unwrap(), None);
    let b = store
        .acquire_lease(T, H, "b", TTL, 12_900)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.owner.as_str(), b.epoch, b.expires_at_ms), ("b", 2, 13_900));

    // The deposed owner can neither renew, re-acquire, nor release what it lost.
    assert_eq!(store.renew_lease(&a, TTL, 12_950).await.unwrap(), None);
    assert_eq!(store.acquire_lease(T, H, "a", TTL, 12_950).await.unwrap(), None);
    store.release_lease(&a).await.unwrap();
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(b.clone()));

    // Expired but not taken: still the owner's — renewing and re-acquiring both keep the epoch.
    let b = store.renew_lease(&b, TTL, 20_000).await.unwrap().unwrap();
    assert_eq!((b.epoch, b.expires_at_ms), (2, 21_000));
    let b = store
        .acquire_lease(T, H, "b", TTL, 30_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.epoch, b.expires_at_ms), (2, 31_000));
    // lease_of shows an expired lease as it is.
    assert_eq!(
        store.lease_of(T, H).await.unwrap().map(|l| l.expires_at_ms),
        Some(31_000)
    );

    // Released: free at once, long before it would have expired; the epoch is kept and the next acquire —
    // even by the same owner — increments it.
    store.release_lease(&b).await.unwrap();
    assert_eq!(store.lease_of(T, H).await.unwrap(), None);
    assert_eq!(store.renew_lease(&b, TTL, 30_001).await.unwrap(), None);
    store.release_lease(&b).await.unwrap(); // twice: nothing more happens
    let b = store
        .acquire_lease(T, H, "b", TTL, 30_002)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.epoch, b.expires_at_ms), (3, 31_002));
    store.release_lease(&b).await.unwrap();
    let c = store
        .acquire_lease(T, H, "c", TTL, 30_003)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((c.owner.as_str(), c.epoch), ("c", 4));

    // Reopening the store keeps the lease.
    let reopened = Store::connect(&db.url).await.unwrap();
    assert_eq!(reopened.lease_of(T, H).await.unwrap(), Some(c.clone()));
    assert_eq!(
        reopened.acquire_lease(T, H, "a", TTL, 30_004).await.unwrap(),
        None
    );
    reopened.close().await;

    // An expiry the database cannot hold is refused and changes nothing.
    assert!(matches!(
        store.renew_lease(&c, i64::MAX, 30_005).await,
        Err(StoreError::OutOfRange {
            what: "expires_at_ms",
            ..
        })
    ));
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(c));
}

async fn the_epoch_grows_at_every_change_of_owner_and_never_otherwise(db: &TestDb) {
    let store = &db.store;
    let owners = ["a", "b", "c"];
    let mut now = 1_000;
    let mut held: Option<Lease> = None;
    let mut changes_of_owner = 0;
    // A fixed pseudo-random walk of acquires, renewals, releases and expiries.
    for step in 0..60u64 {
        now += 100;
        let pick = (step * 7 + step / 3) as usize;
        let owner = owners[pick % owners.len()];
        match pick % 4 {
            0 => {
                if let Some(lease) = held.take() {
                    store.release_lease(&lease).await.unwrap();
                }
            }
            1 => now += TTL, // let the lease expire
            _ => {}
        }
        let before = store.lease_of(T, H).await.unwrap();
        let free = before
            .as_ref()
            .is_none_or(|lease| lease.owner == owner || lease.expires_at_ms <= now);
        let got = store.acquire_lease(T, H, owner, TTL, now).await.unwrap();
        assert_eq!(got.is_some(), free, "step {step}: {before:?}, {owner} at {now}");
        let Some(lease) = got else { continue };
        match &before {
            Some(previous) if previous.owner == owner => assert_eq!(lease.epoch, previous.epoch),
            _ => {
                changes_of_owner += 1;
                assert_eq!(lease.epoch, changes_of_owner, "step {step}");
            }
        }
        held = Some(lease);
    }
    assert!(
        changes_of_owner >= 10,
        "the walk changed owner only {changes_of_owner} times"
    );
}

async fn a_deposed_owner_cannot_commit_and_writes_nothing(db: &TestDb) {
    let store = &db.store;
    let a = store.acquire_lease(T, H, "a", TTL, 1_000).await.unwrap().unwrap();
    let first = CommitBatch {
        last_seq: 2,
        log: vec![entry(1, SESSION), entry(2, CHAT)],
        snapshots: vec![snapshot(SESSION, None, 1), snapshot(CHAT, Some(SESSION), 2)],
        catalog: vec![upsert(SESSION, 1)],
        ..CommitBatch::default()
    };
    store.commit_fenced(T, H, "a", a.epoch, &first).await.unwrap();
    // A slow owner whose lease lapsed (at 2,000) but which nobody took yet: its commit still goes through.
    store
        .commit_fenced(T, H, "a", a.epoch, &log_batch(3, vec![entry(3, SESSION)]))
        .await
        .unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 3);

    // b takes the expired lease: a is deposed.
    let b = store.acquire_lease(T, H, "b", TTL, 5_000).await.unwrap().unwrap();
    assert_eq!(b.epoch, 2);
    let before = everything_of(store, T, H).await;
    let everything = CommitBatch {
        last_seq: 50,
        log: vec![entry(4, SESSION), entry(5, CHAT)],
        snapshots: vec![
            snapshot(SESSION, None, 4),
            snapshot("ahp-chat:/c9", Some(SESSION), 5),
        ],
        catalog: vec![
            upsert("ahp-session:/s2", 2),
            CatalogChange::Remove { uri: SESSION.into() },
        ],
        disposed: vec![CHAT.into()],
        bindings: vec![relay_store::ClientBinding {
            client_id: "deposed-client".into(),
            subject: "mallory".into(),
            used_at_ms: 1_000,
        }],
        turns: vec![archived("relay-archive:deposed", 0, "t0")],
        contents: vec![relay_store::StoredContent {
            id: "deposed-content".into(),
            owner: "ahp-session:/s2".into(),
            content_type: "text/plain".into(),
            data: "aGk=".into(),
        }],
    };
    assert_eq!(
        fenced(store.commit_fenced(T, H, "a", a.epoch, &everything).await),
        (1, 2, Some("b".into()))
    );
    // The right epoch under the wrong name, and the right name under an old epoch, are refused too.
    assert_eq!(
        fenced(store.commit_fenced(T, H, "a", b.epoch, &everything).await),
        (2, 2, Some("b".into()))
    );
    assert_eq!(
        fenced(store.commit_fenced(T, H, "b", a.epoch, &everything).await),
        (1, 2, Some("b".into()))
    );
    assert_eq!(everything_of(store, T, H).await, before);
    assert_eq!(store.load_content(T, H, "deposed-content").await.unwrap(), None);
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(b.clone()));

    // The current owner commits, seeing everything the deposed one committed before it was deposed.
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 3);
    store
        .commit_fenced(T, H, "b", b.epoch, &everything)
        .await
        .unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 50);
    assert_eq!(
        store.load_content(T, H, "deposed-content").await.unwrap(),
        Some(("text/plain".to_string(), "aGk=".to_string()))
    );
    // A content goes with the session that owns it.
    store
        .commit_fenced(
            T,
            H,
            "b",
            b.epoch,
            &CommitBatch {
                last_seq: 50,
                disposed: vec!["ahp-session:/s2".into()],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(store.load_content(T, H, "deposed-content").await.unwrap(), None);
    assert_eq!(
        seqs(
            &store
                .log_after(T, H, 0, &[SESSION.to_owned(), CHAT.to_owned()], 10)
                .await
                .unwrap()
        ),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(
        uris(&store.list_sessions(T, H, None, 10).await.unwrap()),
        ["ahp-session:/s2"]
    );

    // After a release nobody can commit under the released epoch, not even its last owner.
    store.release_lease(&b).await.unwrap();
    let before = everything_of(store, T, H).await;
    assert_eq!(
        fenced(
            store
                .commit_fenced(T, H, "b", b.epoch, &log_batch(60, vec![entry(6, CHAT)]))
                .await
        ),
        (2, 2, None)
    );
    // A host never leased cannot be committed to with fencing.
    assert_eq!(
        fenced(
            store
                .commit_fenced(T, "unleased", "a", 1, &log_batch(1, vec![entry(1, CHAT)]))
                .await
        ),
        (1, 0, None)
    );
    assert_eq!(everything_of(store, T, H).await, before);
    assert_eq!(store.load_host(T, "unleased").await.unwrap().last_seq, 0);

    // A fenced commit that fails in its writes rolls the fencing back with them and leaves the lease intact.
    let c = store.acquire_lease(T, H, "c", TTL, 6_000).await.unwrap().unwrap();
    let duplicate = log_batch(70, vec![entry(7, CHAT), entry(1, SESSION)]);
    assert!(matches!(
        store.commit_fenced(T, H, "c", c.epoch, &duplicate).await,
        Err(StoreError::Database(_))
    ));
    assert_eq!(everything_of(store, T, H).await, before);
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(c.clone()));
    store
        .commit_fenced(T, H, "c", c.epoch, &log_batch(7, vec![entry(7, CHAT)]))
        .await
        .unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 50);
    assert_eq!(store.lease_of(T, H).await.unwrap(), Some(c));
}

async fn concurrent_acquirers_of_one_host_have_exactly_one_winner(db: &TestDb) {
    const RACERS: usize = 8;
    let mut now = 1_000;
    for round in 1..=10u64 {
        // Round 1 races for a never-leased host; later rounds for one whose lease just expired (or, every
        // third round, was released).
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let store = db.store.clone();
                let barrier = barrier.clone();
                let owner = format!("shard-{round}-{i}");
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.acquire_lease(T, H, &owner, TTL, now).await.unwrap()
                })
            })
            .collect();
        let mut winners = Vec::new();
        for racer in racers {
            winners.extend(racer.await.unwrap());
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let winner = winners.remove(0);
        assert_eq!(winner.epoch, round, "round {round}");
        assert_eq!(db.store.lease_of(T, H).await.unwrap(), Some(winner.clone()));
        if round % 3 == 0 {
            db.store.release_lease(&winner).await.unwrap();
        } else {
            now = winner.expires_at_ms;
        }
    }
}

/// With the fenced commit between its check and its writes (held up by a lock on the host's row), an acquire
/// by another owner waits for the commit to end: the commit cannot be overtaken by a change of owner.
async fn an_acquire_cannot_slip_between_the_fencing_check_and_the_writes(db: &TestDb) {
    let store = &db.store;
    let a = store.acquire_lease(T, H, "a", TTL, 1_000).await.unwrap().unwrap();
    store
        .commit_fenced(T, H, "a", a.epoch, &log_batch(1, vec![entry(1, CHAT)]))
        .await
        .unwrap();

    let mut blocker = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    match store.backend() {
        // Locks the hosts row, which a commit writes right after its fencing check.
        Backend::Postgres => {
            blocker.execute("BEGIN").await.unwrap();
            blocker
                .execute(
                    sqlx::query("UPDATE hosts SET log_floor = log_floor WHERE tenant = $1 AND host = $2")
                        .bind(T)
                        .bind(H),
                )
                .await
                .unwrap();
        }
        // Takes the database's write lock, which the fencing check itself needs.
        Backend::Sqlite => {
            blocker.execute("BEGIN IMMEDIATE").await.unwrap();
        }
    }
    let committing = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .commit_fenced(T, H, "a", 1, &log_batch(2, vec![entry(2, CHAT)]))
                .await
        })
    };
    wait_for_lock_waiters(db, 1).await;
    // a's lease has expired: b may take it — once the commit is over.
    let acquiring = {
        let store = store.clone();
        tokio::spawn(async move { store.acquire_lease(T, H, "b", TTL, 5_000).await })
    };
    wait_for_lock_waiters(db, 2).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!committing.is_finished() && !acquiring.is_finished());
    blocker.execute("COMMIT").await.unwrap();
    blocker.close().await.unwrap();

    let committed = committing.await.unwrap();
    let b = acquiring.await.unwrap().unwrap().unwrap();
    assert_eq!((b.owner.as_str(), b.epoch), ("b", 2));
    let logged = seqs(&store.log_after(T, H, 0, &[CHAT.to_owned()], 10).await.unwrap());
    match store.backend() {
        // The commit locked the lease row first, so it finished before the acquire could change the lease.
        Backend::Postgres => {
            committed.unwrap();
            assert_eq!(logged, [1, 2]);
        }
        // Either one got the write lock first; both orders are consistent.
        Backend::Sqlite => match committed {
            Ok(()) => assert_eq!(logged, [1, 2]),
            Err(error) => {
                assert_eq!(fenced(Err(error)), (1, 2, Some("b".into())));
                assert_eq!(logged, [1]);
            }
        },
    }
    // From now on a is fenced off.
    assert_eq!(
        fenced(
            store
                .commit_fenced(T, H, "a", 1, &log_batch(3, vec![entry(3, CHAT)]))
                .await
        ),
        (1, 2, Some("b".into()))
    );
}

/// Waits until `count` sessions of the test database wait for a lock (Postgres); on SQLite, where a waiter
/// is invisible, gives it time to start waiting.
async fn wait_for_lock_waiters(db: &TestDb, count: i64) {
    if db.store.backend() == Backend::Sqlite {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        return;
    }
    // A connection of its own, outside any transaction: pg_stat_activity is read once per transaction.
    let mut observer = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut observer)
        .await
        .unwrap();
        if waiting >= count {
            observer.close().await.unwrap();
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{count} sessions never waited for a lock");
}

async fn orphaned_hosts_lists_released_and_expired_leases_only(db: &TestDb) {
    let store = &db.store;
    let take = |tenant: &'static str, host: &'static str, owner: &'static str, now: i64| async move {
        store
            .acquire_lease(tenant, host, owner, TTL, now)
            .await
            .unwrap()
            .unwrap()
    };
    assert!(store.orphaned_hosts(0, 10).await.unwrap().is_empty());
    take(T, "held", "a", 5_000).await; // until 6,000
    take(T, "expired-late", "a", 2_000).await; // until 3,000
    take(T, "expired-early", "b", 1_000).await; // until 2,000
    take("globex", "held", "c", 1_500).await; // until 2,500: another tenant's host of the same name
    let released = take(T, "released", "b", 5_000).await;
    store.release_lease(&released).await.unwrap();
    // A host with counters but never leased has no owner to lose.
    store.load_host(T, "never-leased").await.unwrap();
    let pair = |tenant: &str, host: &str| (tenant.to_owned(), host.to_owned());

    // Released first, then most overdue first.
    assert_eq!(
        store.orphaned_hosts(5_500, 10).await.unwrap(),
        [
            pair(T, "released"),
            pair(T, "expired-early"),
            pair("globex", "held"),
            pair(T, "expired-late"),
        ]
    );
    assert_eq!(
        store.orphaned_hosts(2_000, 10).await.unwrap(),
        [pair(T, "released"), pair(T, "expired-early")]
    );
    assert_eq!(store.orphaned_hosts(5_500, 2).await.unwrap().len(), 2);
    assert!(store.orphaned_hosts(5_500, 0).await.unwrap().is_empty());
    // Expired exactly at expires_at_ms.
    assert!(store
        .orphaned_hosts(6_000, 10)
        .await
        .unwrap()
        .contains(&pair(T, "held")));

    // Taking an orphan (or its owner renewing in time) takes it off the list.
    take(T, "released", "c", 5_500).await;
    take(T, "expired-late", "a", 5_500).await;
    assert_eq!(
        store.orphaned_hosts(5_500, 10).await.unwrap(),
        [pair(T, "expired-early"), pair("globex", "held")]
    );
}

async fn leases_are_isolated_between_tenants_and_hosts(db: &TestDb) {
    let store = &db.store;
    let acme = store
        .acquire_lease("acme", H, "a", TTL, 1_000)
        .await
        .unwrap()
        .unwrap();
    // The same host name in another tenant, and another host of the same tenant, are leased independently.
    let globex = store
        .acquire_lease("globex", H, "b", TTL, 1_000)
        .await
        .unwrap()
        .unwrap();
    let other = store
        .acquire_lease("acme", "other", "b", TTL, 1_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((acme.epoch, globex.epoch, other.epoch), (1, 1, 1));
    assert_eq!(
        store.acquire_lease("globex", H, "a", TTL, 1_500).await.unwrap(),
        None
    );
    assert_eq!(store.lease_of("acme", H).await.unwrap(), Some(acme.clone()));
    assert_eq!(store.lease_of("globex", H).await.unwrap(), Some(globex.clone()));
    assert_eq!(store.lease_of("initech", H).await.unwrap(), None);

    // A lease fences only its own host.
    assert_eq!(
        fenced(
            store
                .commit_fenced(
                    "globex",
                    H,
                    "a",
                    acme.epoch,
                    &log_batch(1, vec![entry(1, SESSION)])
                )
                .await
        ),
        (1, 1, Some("b".into()))
    );
    store
        .commit_fenced("acme", H, "a", acme.epoch, &log_batch(1, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    assert_eq!(store.load_host("globex", H).await.unwrap().last_seq, 0);

    // Releasing or taking over in one tenant leaves the others alone.
    store.release_lease(&acme).await.unwrap();
    assert_eq!(store.lease_of("acme", H).await.unwrap(), None);
    assert_eq!(store.lease_of("globex", H).await.unwrap(), Some(globex.clone()));
    assert_eq!(store.lease_of("acme", "other").await.unwrap(), Some(other));
    let taken = store
        .acquire_lease("acme", H, "c", TTL, 1_600)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.epoch, 2);
    assert_eq!(
        store
            .renew_lease(&globex, TTL, 1_700)
            .await
            .unwrap()
            .map(|l| l.epoch),
        Some(1)
    );
    // A lease handle naming another tenant renews nothing there.
    let forged = Lease {
        tenant: "globex".into(),
        ..taken.clone()
    };
    assert_eq!(store.renew_lease(&forged, TTL, 1_700).await.unwrap(), None);
    store.release_lease(&forged).await.unwrap();
    assert_eq!(
        store.lease_of("globex", H).await.unwrap().map(|l| l.owner),
        Some("b".into())
    );
    assert_eq!(
        store.orphaned_hosts(1_800, 10).await.unwrap(),
        Vec::<(String, String)>::new()
    );
}

#[test]
fn test_database_urls_keep_credentials_and_parameters() {
    assert_eq!(
        with_database("postgres://u:p@h:5/db?sslmode=disable", "t"),
        "postgres://u:p@h:5/t?sslmode=disable"
    );
    assert_eq!(
        with_database("postgres://u@127.0.0.1:5432", "t"),
        "postgres://u@127.0.0.1:5432/t"
    );
}

#[tokio::test]
async fn sqlite_creates_the_file_and_its_directory_and_journals_with_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/data/relay.db");
    let store = Store::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
        .commit(T, H, &log_batch(1, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    assert!(path.exists());
    assert!(
        path.with_file_name("relay.db-wal").exists(),
        "no write-ahead log next to the database"
    );
    store.close().await;
}

/// Across operations, and across a failed commit: a failed transaction's connection is closed on a file
/// store, but an in-memory database is its one connection, and closing it would lose everything.
#[tokio::test]
async fn sqlite_in_memory_keeps_its_data_across_operations() {
    let store = Store::connect("sqlite::memory:").await.unwrap();
    store.migrate().await.unwrap();
    store
        .commit(T, H, &log_batch(4, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    // Seq 1 again: the log's primary key refuses it.
    assert!(store
        .commit(T, H, &log_batch(5, vec![entry(1, SESSION)]))
        .await
        .is_err());
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 4);
    assert_eq!(
        store
            .log_after(T, H, 0, &[SESSION.to_owned()], 10)
            .await
            .unwrap()
            .len(),
        1
    );
    store.close().await;
}

#[tokio::test]
async fn unsupported_urls_are_refused_without_echoing_them() {
    let refused = Store::connect("mysql://user:secret@host/db").await;
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("mysql") && !message.contains("secret"),
        "{message}"
    );
}

async fn ping_answers_while_the_store_is_reachable(db: &TestDb) {
    db.store.ping().await.unwrap();
    let other = Store::connect(&db.url).await.unwrap();
    other.ping().await.unwrap();
    other.close().await;
    assert!(other.ping().await.is_err(), "a closed store is not reachable");
    db.store.ping().await.unwrap();
}

async fn renewing_an_owners_leases_renews_exactly_what_it_still_holds(db: &TestDb) {
    let store = &db.store;
    assert!(store.renew_leases_of("a", TTL, 10_000).await.unwrap().is_empty());
    let h1 = store
        .acquire_lease(T, "h1", "a", TTL, 10_000)
        .await
        .unwrap()
        .unwrap();
    let h2 = store
        .acquire_lease(T, "h2", "a", TTL, 10_000)
        .await
        .unwrap()
        .unwrap();
    let other_tenant = store
        .acquire_lease("other", "h1", "a", TTL, 10_000)
        .await
        .unwrap()
        .unwrap();
    store
        .acquire_lease(T, "h3", "b", TTL, 10_000)
        .await
        .unwrap()
        .unwrap();
    // h2 lapses and is taken by b; h1 lapses but nobody takes it.
    store
        .acquire_lease(T, "h2", "b", TTL, 11_000)
        .await
        .unwrap()
        .unwrap();

    let mut renewed = store.renew_leases_of("a", TTL, 11_500).await.unwrap();
    renewed.sort_by(|x, y| (&x.tenant, &x.host).cmp(&(&y.tenant, &y.host)));
    let expected = vec![
        Lease {
            expires_at_ms: 12_500,
            ..h1.clone()
        },
        Lease {
            expires_at_ms: 12_500,
            ..other_tenant
        },
    ];
    assert_eq!(
        renewed, expected,
        "h1 (expired, not taken) and the other tenant's h1; not h2"
    );
    assert_eq!(
        store.lease_of(T, "h1").await.unwrap().map(|l| l.expires_at_ms),
        Some(12_500)
    );
    // b's leases are untouched, and the lost h2 is b's at a new epoch.
    let h2_now = store.lease_of(T, "h2").await.unwrap().unwrap();
    assert_eq!(
        (h2_now.owner.as_str(), h2_now.epoch, h2_now.expires_at_ms),
        ("b", h2.epoch + 1, 12_000)
    );
    assert_eq!(
        store.lease_of(T, "h3").await.unwrap().map(|l| l.expires_at_ms),
        Some(11_000)
    );
    // Released leases are not renewed.
    store
        .release_lease(&Lease {
            expires_at_ms: 12_500,
            ..h1
        })
        .await
        .unwrap();
    assert_eq!(store.renew_leases_of("a", TTL, 12_000).await.unwrap().len(), 1);
}

async fn a_channel_disposed_then_created_again_in_one_batch_stays_loadable(db: &TestDb) {
    let store = &db.store;
    store
        .commit(
            T,
            H,
            &CommitBatch {
                last_seq: 1,
                snapshots: vec![snapshot(SESSION, None, 1)],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    // One batch: the old channel is disposed, then a new one is created under the same URI.
    let recreated = snapshot(SESSION, None, 3);
    store
        .commit(
            T,
            H,
            &CommitBatch {
                last_seq: 3,
                disposed: vec![SESSION.into()],
                snapshots: vec![recreated.clone()],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    let loaded = store.load_channel(T, H, SESSION).await.unwrap();
    let loaded = loaded.expect("the re-created channel must still be loadable");
    assert_eq!(loaded.snapshot_seq, 3);
    assert_eq!(loaded.state, recreated.state);
}

async fn a_client_id_keeps_its_first_subject(db: &TestDb) {
    let store = &db.store;
    let bind = |client_id: &str, subject: &str| CommitBatch {
        bindings: vec![relay_store::ClientBinding {
            client_id: client_id.into(),
            subject: subject.into(),
            used_at_ms: 1_000,
        }],
        ..CommitBatch::default()
    };
    assert_eq!(store.client_binding(T, H, "laptop").await.unwrap(), None);
    store.commit(T, H, &bind("laptop", "ana")).await.unwrap();
    store.commit(T, H, &bind("laptop", "bob")).await.unwrap();
    assert_eq!(
        store.client_binding(T, H, "laptop").await.unwrap().as_deref(),
        Some("ana")
    );
    // per host and tenant
    assert_eq!(store.client_binding(T, "other", "laptop").await.unwrap(), None);
    assert_eq!(store.client_binding("other", H, "laptop").await.unwrap(), None);
}

async fn stored_bytes_count_a_tenants_log_snapshots_and_client_bindings(db: &TestDb) {
    let store = &db.store;
    assert_eq!(store.stored_bytes(T).await.unwrap(), 0);
    let log = vec![entry(1, SESSION), entry(2, CHAT)];
    let shot = snapshot(SESSION, None, 2);
    let expected = log.iter().map(|e| e.envelope.len()).sum::<usize>() + shot.state.len();
    let batch = CommitBatch {
        last_seq: 2,
        log,
        snapshots: vec![shot],
        ..CommitBatch::default()
    };
    store.commit(T, H, &batch).await.unwrap();
    // Another host of the tenant counts; another tenant does not.
    store
        .commit(T, "other", &log_batch(1, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    store
        .commit("someone-else", H, &log_batch(1, vec![entry(1, SESSION)]))
        .await
        .unwrap();
    let other_host = entry(1, SESSION).envelope.len();
    assert_eq!(
        store.stored_bytes(T).await.unwrap(),
        u64::try_from(expected + other_host).unwrap()
    );
    // Multi-byte text counts in bytes.
    let mut wide = snapshot(CHAT, Some(SESSION), 3);
    wide.state = "\u{e9}".repeat(10);
    store
        .commit(
            T,
            H,
            &CommitBatch {
                last_seq: 3,
                snapshots: vec![wide],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        store.stored_bytes(T).await.unwrap(),
        u64::try_from(expected + other_host + 20).unwrap()
    );
    // Client bindings count too (a client can make many): host, clientId and subject.
    store
        .commit(
            T,
            H,
            &CommitBatch {
                last_seq: 3,
                bindings: vec![relay_store::ClientBinding {
                    client_id: "laptop-7".into(),
                    subject: "ana".into(),
                    used_at_ms: 1_000,
                }],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        store.stored_bytes(T).await.unwrap(),
        u64::try_from(expected + other_host + 20 + H.len() + "laptop-7".len() + "ana".len()).unwrap()
    );
}

async fn bindings_unused_past_the_retention_are_pruned_and_used_ones_kept(db: &TestDb) {
    let store = &db.store;
    let bind = |client_id: &str, subject: &str, used_at_ms: i64| CommitBatch {
        bindings: vec![relay_store::ClientBinding {
            client_id: client_id.into(),
            subject: subject.into(),
            used_at_ms,
        }],
        ..CommitBatch::default()
    };
    store.commit(T, H, &bind("stale", "ana", 1_000)).await.unwrap();
    store.commit(T, H, &bind("kept", "ana", 1_000)).await.unwrap();
    // Used again later (by its owner): its use is noted, its subject unchanged even if another names it.
    store.commit(T, H, &bind("kept", "ana", 9_000)).await.unwrap();
    store.commit(T, H, &bind("kept", "bob", 9_500)).await.unwrap();
    // An older use recorded late does not turn the clock back.
    store.commit(T, H, &bind("kept", "ana", 2_000)).await.unwrap();
    store.commit(T, H, &bind("fresh", "bob", 8_000)).await.unwrap();

    let removed = store.compact(5_000).await.unwrap();
    assert_eq!(
        removed, 1,
        "only the stale binding (and no log rows: there are none)"
    );
    assert_eq!(store.client_binding(T, H, "stale").await.unwrap(), None);
    assert_eq!(
        store.client_binding(T, H, "kept").await.unwrap().as_deref(),
        Some("ana")
    );
    assert_eq!(
        store.client_binding(T, H, "fresh").await.unwrap().as_deref(),
        Some("bob")
    );
    // A pruned clientId is free again.
    store.commit(T, H, &bind("stale", "bob", 10_000)).await.unwrap();
    assert_eq!(
        store.client_binding(T, H, "stale").await.unwrap().as_deref(),
        Some("bob")
    );
    // A binding whose use was never noted (a shard of the release before it was kept, still running during a
    // rolling upgrade, wrote it without the column) is not stale: the prune stamps it used now and keeps it.
    let mut raw = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    raw.execute(
        "INSERT INTO client_bindings (tenant, host, client_id, subject, last_used_ms) \
         VALUES ('acme', 'default', 'old-writer', 'olga', 0)",
    )
    .await
    .unwrap();
    // Many stale ones go in several short statements, all of them.
    raw.execute(
        "INSERT INTO client_bindings (tenant, host, client_id, subject, last_used_ms) \
         SELECT 'acme', 'default', 'stale-' || n, 'ana', 1 FROM ( \
           WITH RECURSIVE numbers(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM numbers WHERE n < 12000) \
           SELECT n FROM numbers) AS many",
    )
    .await
    .unwrap();
    assert_eq!(store.compact(5_000).await.unwrap(), 12_000);
    assert_eq!(
        store.client_binding(T, H, "old-writer").await.unwrap().as_deref(),
        Some("olga")
    );
    assert_eq!(store.client_binding(T, H, "stale-11999").await.unwrap(), None);
    assert_eq!(store.compact(5_000).await.unwrap(), 0, "stamped as used now");
}

fn archived(archive: &str, turn_no: u64, turn_id: &str) -> ArchivedTurn {
    ArchivedTurn {
        archive: archive.into(),
        turn_no,
        turn_id: turn_id.into(),
        turn: format!("{{\"id\":\"{turn_id}\"}}"),
    }
}

async fn archived_turns_are_read_by_range_and_found_by_id_and_go_with_their_key(db: &TestDb) {
    let store = &db.store;
    let key = "relay-archive:ahp-chat:/c1";
    let other = "relay-archive:ahp-chat:/c2";
    let mut turns: Vec<ArchivedTurn> = (0..1_000).map(|n| archived(key, n, &format!("t{n}"))).collect();
    turns.push(archived(other, 0, "t0"));
    // The same index twice in one batch: the later wins.
    turns.push(archived(key, 7, "t7-again"));
    store
        .commit(
            T,
            H,
            &CommitBatch {
                last_seq: 1,
                turns,
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    let page = store.archived_turns(T, H, key, 5, 10).await.unwrap();
    let numbers: Vec<u64> = page.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, [5, 6, 7, 8, 9]);
    assert_eq!(page[2].1, "{\"id\":\"t7-again\"}");
    // Within a byte budget: the newest rows that fit, always the newest; their length asked without them.
    let row = "{\"id\":\"t8\"}".len() as u64;
    let newest = store
        .archived_turns_within(T, H, key, 5, 10, 2 * row)
        .await
        .unwrap();
    let numbers: Vec<u64> = newest.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, [8, 9]);
    let one = store.archived_turns_within(T, H, key, 5, 10, 1).await.unwrap();
    assert_eq!(one.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [9]);
    assert_eq!(
        store.archived_turns_length(T, H, key, 8, 10).await.unwrap(),
        2 * row
    );
    assert_eq!(
        store
            .archived_turns_length(T, H, key, 5_000, 6_000)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store.archived_turns(T, H, key, 998, 2_000).await.unwrap().len(),
        2
    );
    assert_eq!(
        store
            .archived_turn_position(T, H, key, "t500", 1_000)
            .await
            .unwrap(),
        Some(500)
    );
    assert_eq!(
        store
            .archived_turn_position(T, H, key, "t500", 500)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .archived_turn_position(T, H, key, "t7", 1_000)
            .await
            .unwrap(),
        None
    );
    // Another tenant or host sees none of it.
    assert!(store
        .archived_turns("other", H, key, 0, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .archived_turns(T, "other", key, 0, 10)
        .await
        .unwrap()
        .is_empty());
    // A text search reads no row out: an id in one archive, not in another; LIKE's wildcards are literal.
    let keys = [key.to_string(), other.to_string()];
    assert!(store
        .archived_turns_contain(T, H, &keys, "t7-again")
        .await
        .unwrap());
    assert!(store
        .archived_turns_contain(T, H, &keys, "\"t999\"")
        .await
        .unwrap());
    assert!(!store.archived_turns_contain(T, H, &keys, "t1000").await.unwrap());
    assert!(!store
        .archived_turns_contain(T, H, &[other.to_string()], "t7")
        .await
        .unwrap());
    assert!(
        !store
            .archived_turns_contain(T, H, &keys, "t_-again")
            .await
            .unwrap(),
        "_ is not a wildcard"
    );
    assert!(
        !store
            .archived_turns_contain(T, H, &keys, "t%again")
            .await
            .unwrap(),
        "% is not a wildcard"
    );
    assert!(!store
        .archived_turns_contain("other", H, &keys, "t7")
        .await
        .unwrap());
    // Deleting the key drops its archive, and a batch that drops and rewrites it keeps what it wrote.
    store
        .commit(
            T,
            H,
            &CommitBatch {
                last_seq: 2,
                disposed: vec![key.into()],
                turns: vec![archived(key, 0, "fresh")],
                ..CommitBatch::default()
            },
        )
        .await
        .unwrap();
    let left = store.archived_turns(T, H, key, 0, 2_000).await.unwrap();
    assert_eq!(left, vec![(0, "{\"id\":\"fresh\"}".to_string())]);
    assert_eq!(store.archived_turns(T, H, other, 0, 10).await.unwrap().len(), 1);
    // Archived turns count toward the tenant's stored bytes (they are all it stores here).
    assert_eq!(store.stored_bytes(T).await.unwrap(), 25);
}

/// During a rolling upgrade (or a rollback) the previous release starts on a schema the next one migrated
/// further: a migration it does not know is left alone, and the store opens.
async fn a_store_a_newer_release_migrated_further_still_opens(db: &TestDb) {
    let mut raw = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(9_999_i64)
    .bind("from a newer release")
    .bind(true)
    .bind(vec![0_u8; 48])
    .bind(0_i64)
    .execute(&mut raw)
    .await
    .unwrap();
    db.store.migrate().await.expect("the store opens");
}

/// On SQLite every write of the process (commits, compaction, leases, a host's first load) takes one turn, so
/// none meets another's transaction in SQLite's busy handler: while the turn is held, each waits, and reads
/// go on. On Postgres, which writes hosts in parallel, holding writes holds nothing.
async fn every_write_waits_while_writes_are_held_and_reads_go_on(db: &TestDb) {
    use std::time::Duration;

    let store = &db.store;
    let aged = |seq: u64| LogEntry {
        at_ms: 1,
        ..entry(seq, CHAT)
    };
    let batch = CommitBatch {
        last_seq: 2,
        log: vec![aged(1), aged(2)],
        snapshots: vec![snapshot(CHAT, None, 2)],
        ..CommitBatch::default()
    };
    store.commit(T, H, &batch).await.unwrap();

    let held = store.hold_writes().await;
    let compaction = store.compact(i64::MAX);
    let other = log_batch(1, vec![entry(1, CHAT)]);
    let commit = store.commit(T, "other", &other);
    let lease = store.acquire_lease(T, "leased", "owner", TTL, 0);
    let first_load = store.load_host(T, "new");
    tokio::pin!(compaction, commit, lease, first_load);
    // On SQLite each must still be waiting after this long, though it takes milliseconds when nothing holds
    // it; on Postgres each must be done within the other (generous, for a loaded machine).
    let on_sqlite = store.backend() == Backend::Sqlite;
    let wait = if on_sqlite {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(20)
    };
    assert_eq!(
        tokio::time::timeout(wait, &mut compaction).await.is_err(),
        on_sqlite,
        "compaction waits for held writes on SQLite only"
    );
    assert_eq!(
        tokio::time::timeout(wait, &mut commit).await.is_err(),
        on_sqlite,
        "a commit waits for held writes on SQLite only"
    );
    let lease_asked = std::time::Instant::now();
    assert_eq!(
        tokio::time::timeout(wait, &mut lease).await.is_err(),
        on_sqlite,
        "a lease waits for held writes on SQLite only"
    );
    assert_eq!(
        tokio::time::timeout(wait, &mut first_load).await.is_err(),
        on_sqlite,
        "a host's first load (which creates its row) waits for held writes on SQLite only"
    );
    // Reads are not held, nor is a host's load once its row exists; and nothing was compacted yet.
    let floor_while_held = store.load_host(T, H).await.unwrap().log_floor;
    assert_eq!(floor_while_held, if on_sqlite { 0 } else { 2 });
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 2);
    assert!(store.load_channel(T, H, CHAT).await.unwrap().is_some());
    let lease_waited = i64::try_from(lease_asked.elapsed().as_millis()).unwrap();
    drop(held);

    if on_sqlite {
        // They took their turns in the order they asked (a mutex hands the turn on): all must be polled.
        let (compacted, committed, leased, loaded) = tokio::join!(compaction, commit, lease, first_load);
        assert_eq!(compacted.unwrap(), 2);
        committed.unwrap();
        // Asked at time 0, written at least `lease_waited` later: it lasts its full time from then.
        let leased = leased.unwrap().unwrap();
        assert!(
            leased.expires_at_ms >= TTL + lease_waited,
            "a lease that waited {lease_waited} ms for its turn expires at {} (ttl {TTL})",
            leased.expires_at_ms
        );
        assert_eq!(loaded.unwrap().last_seq, 0);
    }
    assert_eq!(store.load_host(T, "other").await.unwrap().last_seq, 1);
    assert_eq!(store.load_host(T, H).await.unwrap().log_floor, 2);

    // Pruning clientId bindings is a write too: with no log rows to compact, a compaction waits for it alone.
    let stale = CommitBatch {
        bindings: vec![relay_store::ClientBinding {
            client_id: "stale".into(),
            subject: "ana".into(),
            used_at_ms: 1,
        }],
        ..CommitBatch::default()
    };
    store.commit(T, H, &stale).await.unwrap();
    let held = store.hold_writes().await;
    let prune = store.compact(500);
    tokio::pin!(prune);
    assert_eq!(
        tokio::time::timeout(wait, &mut prune).await.is_err(),
        on_sqlite,
        "pruning bindings waits for held writes on SQLite only"
    );
    assert_eq!(
        store.client_binding(T, H, "stale").await.unwrap().is_some(),
        on_sqlite
    );
    drop(held);
    if on_sqlite {
        assert_eq!(prune.await.unwrap(), 1);
    }
    assert_eq!(store.client_binding(T, H, "stale").await.unwrap(), None);
}

/// On Postgres a commit thread's commits (plain and fenced) go through connections of its own, opened on it
/// (so its runtime drives their sockets), named `ahp-relay-commits` for the database's operators; commits made
/// anywhere else go through the store's pool. Each commit thread here commits once and then goes on driving its
/// runtime until told to stop, so its connection stays open (given back to its pool) while it is counted.
#[tokio::test]
async fn on_postgres_a_commit_threads_commits_go_through_connections_of_its_own() {
    let Some(db) = TestDb::postgres("commit_thread_connections").await else {
        eprintln!("skipped: DATABASE_URL not set");
        return;
    };
    let store = &db.store;
    let mut observer = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    let mut commit_connections = async || -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'ahp-relay-commits'",
        )
        .fetch_one(&mut observer)
        .await
        .unwrap()
    };
    store
        .commit(T, H, &log_batch(1, vec![entry(1, CHAT)]))
        .await
        .unwrap();
    assert_eq!(
        commit_connections().await,
        0,
        "off a commit thread, through the store's pool"
    );

    let lease = store
        .acquire_lease(T, "fenced", "owner", TTL, 0)
        .await
        .unwrap()
        .expect("a free host's lease");
    // A commit thread that commits once, says so, and drives its runtime until it is told to stop.
    let commit_thread = |fenced: bool| {
        let store = store.clone();
        let (committed, done) = tokio::sync::oneshot::channel::<()>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            relay_store::mark_commit_thread();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if fenced {
                    let batch = log_batch(1, vec![entry(1, SESSION)]);
                    store
                        .commit_fenced(T, "fenced", "owner", lease.epoch, &batch)
                        .await
                        .unwrap();
                } else {
                    store
                        .commit(T, H, &log_batch(2, vec![entry(2, CHAT)]))
                        .await
                        .unwrap();
                }
                committed.send(()).unwrap();
                let _ = stopped.await;
            });
        });
        (done, stop, thread)
    };
    let (done, stop_fenced, fenced) = commit_thread(true);
    done.await.unwrap();
    assert_eq!(
        commit_connections().await,
        1,
        "a fenced commit, through the connection its commit thread opened"
    );
    let (done, stop_plain, plain) = commit_thread(false);
    done.await.unwrap();
    assert_eq!(
        commit_connections().await,
        2,
        "a plain commit on another commit thread, through a connection of that thread's"
    );
    stop_fenced.send(()).unwrap();
    stop_plain.send(()).unwrap();
    fenced.join().unwrap();
    plain.join().unwrap();
    assert_eq!(store.load_host(T, H).await.unwrap().last_seq, 2);
    assert_eq!(store.load_host(T, "fenced").await.unwrap().last_seq, 1);
    observer.close().await.unwrap();
    db.finish().await;
}
