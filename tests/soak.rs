//! The soak of issue 34 (acceptance 1): a long chat of large agent replies, a fork and a restart, with the
//! relay's memory held to a stated bound and every snapshot and page within its byte budget. It has a test
//! binary of its own so it runs alone (it keeps both cores busy for about 12 minutes).

mod support;

use serde_json::json;
use support::*;

/// Issue 34, acceptance 1: the soak. 2,000 turns whose agent replies 2 MiB each (4 GiB through the relay, on
/// default budgets) in one chat and a fork of its first turns (every 20th turn goes to the fork; a fork of
/// the whole long chat is refused, saying so), then a restart that loads both back.
/// The relay's peak RSS stays within 192 MiB above its idle size throughout — the host's budgets (a 64 MiB
/// replay buffer, a 16 MiB pending batch, a 16 MiB reply, 8 MiB of live turns for each of the two chats) come
/// to 112 MiB, the rest is the allocator's — and a new device's `subscribe` and `fetchTurns` pages stay within
/// the reply budget (16 MiB) and the live chat's budget (`--retained-turn-bytes`, 8 MiB) before and after the
/// restart. `AHP_SOAK_TURNS` shortens it for a local try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_2000_turns_of_2_mib_with_a_fork_and_a_restart_stays_within_its_memory_bound() {
    const MIB: u64 = 1024 * 1024;
    const BOUND: u64 = 192 * MIB;
    let turns: usize = std::env::var("AHP_SOAK_TURNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let agents = scripted_agents_file();
    // The default output rate (1 MiB/s) would make this an hour: only the byte budgets may slow it here.
    let text = std::fs::read_to_string(&agents.file).expect("agents file");
    std::fs::write(
        &agents.file,
        format!("{text}\n[quotas]\noutput_bytes_per_second = 4294967296\n"),
    )
    .expect("agents file");
    let data = tempfile::tempdir().expect("data");
    let flags = ["--agents", agents.file.to_str().expect("path")];
    let relay = Relay::start_in(data.path(), &flags).await;
    let (client, _) = relay.client("soak").await;
    ready_session(&client, "scripted", "soak", json!({}))
        .await
        .expect("ready");
    let chat = "ahp-chat:/soak".to_string();
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    let idle = relay.memory().0;
    let reply = "sh: head -c 2097152 /dev/zero | tr '\\0' x";
    // Three turns (6 MiB, all live), then a fork of them: from here on every 20th turn goes to the fork.
    for n in 0..3 {
        client
            .dispatch(chat.clone(), turn_started(&format!("t{n}"), reply))
            .await
            .expect("dispatch");
        collect_until(&mut sub, is_turn_complete).await;
    }
    let fork = "ahp-chat:/soak-fork".to_string();
    let fork_at = |target: &str, turn: String| {
        json!({"channel": "ahp-session:/soak", "chat": target,
            "source": {"kind": "fork", "chat": chat, "turnId": turn}})
    };
    let _: serde_json::Value = client
        .request("createChat", fork_at(&fork, "t2".to_string()))
        .await
        .expect("fork");
    let (_, _, mut fork_sub) = subscribe_chat(&client, &fork).await;
    let started = std::time::Instant::now();
    let mut last_in_chat = String::new();
    for n in 3..turns {
        let id = format!("t{n}");
        let (target, target_sub) = if n % 20 == 0 {
            (&fork, &mut fork_sub)
        } else {
            last_in_chat = id.clone();
            (&chat, &mut sub)
        };
        client
            .dispatch(target.clone(), turn_started(&id, reply))
            .await
            .expect("dispatch");
        let seen = collect_until(target_sub, is_turn_complete).await;
        if n == 3 {
            let streamed: usize = seen
                .iter()
                .map(|e| serde_json::to_vec(e).expect("json").len())
                .sum();
            assert!(streamed > 2 * MIB as usize, "a turn of {streamed} bytes");
        }
        if (n + 1) % 100 == 0 {
            let (rss, peak) = relay.memory();
            eprintln!(
                "after {} turns ({:?}): RSS {} MiB, peak {} MiB, idle {} MiB",
                n + 1,
                started.elapsed(),
                rss / MIB,
                peak / MIB,
                idle / MIB
            );
        }
    }
    // A fork copies its turns into one action, so it is bounded too: a fork of the whole long chat is refused,
    // saying why, and changes nothing.
    let refused = client
        .request::<_, serde_json::Value>("createChat", fork_at("ahp-chat:/soak-whole", last_in_chat))
        .await
        .expect_err("a fork of every turn");
    assert!(
        format!("{refused:?}").contains("a fork copies at most"),
        "{refused:?}"
    );
    let peak = relay.memory().1;
    eprintln!(
        "{turns} turns of 2 MiB and a fork in {:?}: peak RSS {} MiB above idle ({} MiB)",
        started.elapsed(),
        peak.saturating_sub(idle) / MIB,
        idle / MIB
    );
    assert!(
        peak.saturating_sub(idle) <= BOUND,
        "the relay's peak RSS rose {} MiB above idle over {turns} turns of 2 MiB and a fork",
        peak.saturating_sub(idle) / MIB
    );
    client.shutdown().await;
    new_device_within_budgets(&relay, &chat).await;
    new_device_within_budgets(&relay, &fork).await;
    // Loaded back: the restarted relay restores both chats within the same bound.
    let mut relay = relay;
    relay.kill().await;
    let relay = Relay::start_in(data.path(), &flags).await;
    let idle = relay.memory().0;
    new_device_within_budgets(&relay, &chat).await;
    new_device_within_budgets(&relay, &fork).await;
    let (client, _) = relay.client("after-restart").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("after", reply))
        .await
        .expect("dispatch after the restart");
    collect_until(&mut sub, is_turn_complete).await;
    let peak = relay.memory().1;
    eprintln!(
        "restored and one more turn: peak RSS {} MiB above idle",
        peak.saturating_sub(idle) / MIB
    );
    assert!(
        peak.saturating_sub(idle) <= BOUND,
        "the restored relay's peak RSS rose {} MiB above idle",
        peak.saturating_sub(idle) / MIB
    );
}
