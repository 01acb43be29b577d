//! Two gateways' quotas sharing one real Redis (`REDIS_URL`; skipped without it, which `scripts/test` always
//! sets): a tenant's connection cap and its message rate hold across both, not per gateway.

use std::sync::Arc;
use std::time::Duration;

use relay_gateway::quotas::TenantQuotas;
use relay_gateway::shared_quotas::SharedQuotas;

mod support;
use support::{limits, unique_tenant};

/// Two gateways' quotas on the Redis at `REDIS_URL`, with their Redis handles.
async fn two_gateways() -> Option<[(Arc<TenantQuotas>, Arc<SharedQuotas>); 2]> {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("skipped: REDIS_URL not set");
        return None;
    };
    let mut gateways = Vec::new();
    for _ in 0..2 {
        let shared = SharedQuotas::connect(&url).await.expect("redis");
        let quotas = TenantQuotas::new(limits());
        quotas.share(shared.clone());
        gateways.push((quotas, shared));
    }
    gateways.try_into().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_connection_cap_holds_across_gateways() {
    let Some([(a, _), (b, _)]) = two_gateways().await else {
        return;
    };
    let tenant = unique_tenant();
    let first = a
        .admit_everywhere(&tenant, false)
        .await
        .expect("one on gateway a");
    let _second = b
        .admit_everywhere(&tenant, false)
        .await
        .expect("one on gateway b");
    assert!(a.admit_everywhere(&tenant, false).await.is_none(), "a third on a");
    assert!(b.admit_everywhere(&tenant, false).await.is_none(), "a third on b");
    assert!(
        b.admit_everywhere(&unique_tenant(), false).await.is_some(),
        "another tenant is not held back"
    );
    // A connection closing on a frees its slot for b (released in the background: bounded wait).
    drop(first);
    let started = std::time::Instant::now();
    let _third = loop {
        if let Some(permit) = b.admit_everywhere(&tenant, false).await {
            break permit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the slot was never freed"
        );
        tokio::task::yield_now().await;
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_rate_holds_across_gateways() {
    let Some([(a, a_redis), (b, b_redis)]) = two_gateways().await else {
        return;
    };
    let tenant = unique_tenant();
    let _on_a = a.admit_everywhere(&tenant, false).await.expect("admit on a");
    let _on_b = b.admit_everywhere(&tenant, false).await.expect("admit on b");
    // Both gateways have met: each knows where the other's counters stand.
    a.exchange_usage(&a_redis).await.expect("exchange");
    b.exchange_usage(&b_redis).await.expect("exchange");
    // The tenant's whole burst goes through gateway a…
    let mut on_a = a.connection_bucket();
    for _ in 0..5 {
        assert_eq!(a.message_delay(&tenant, &mut on_a, 1), Duration::ZERO);
    }
    a.exchange_usage(&a_redis).await.expect("exchange");
    b.exchange_usage(&b_redis).await.expect("exchange");
    // …so its next message through gateway b waits at the tenant's rate.
    let wait = b.message_delay(&tenant, &mut b.connection_bucket(), 1);
    assert!(wait >= Duration::from_millis(50), "{wait:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_moving_to_another_gateway_brings_its_debt() {
    let Some([(a, a_redis), (b, b_redis)]) = two_gateways().await else {
        return;
    };
    let tenant = unique_tenant();
    // On gateway a only: the whole burst and as much again in debt.
    let on_a = a.admit_everywhere(&tenant, false).await.expect("admit on a");
    a.exchange_usage(&a_redis).await.expect("exchange");
    let mut bucket = a.connection_bucket();
    for _ in 0..10 {
        a.message_delay(&tenant, &mut bucket, 1);
    }
    a.exchange_usage(&a_redis).await.expect("exchange");
    drop(on_a);
    // It reconnects to gateway b, which never had it: b learns the debt at its first exchange.
    let _on_b = b.admit_everywhere(&tenant, false).await.expect("admit on b");
    b.exchange_usage(&b_redis).await.expect("exchange");
    let wait = b.message_delay(&tenant, &mut b.connection_bucket(), 1);
    assert!(wait >= Duration::from_millis(300), "{wait:?}");
}

/// Issue 34 (4): a tenant's usage hash keeps the fields of gateways that still report it, not of every
/// gateway ever seen (an autoscaler's churn): one that has not reported for a minute is removed at the next
/// exchange, while one that just reported stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_gateways_fields_leave_the_tenants_usage() {
    use relay_gateway::shared_quotas::{Report, GATEWAY_GONE_MS};
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("skipped: REDIS_URL not set");
        return;
    };
    let tenant = unique_tenant();
    let key = format!("ahp-relay:quota:{{{tenant}}}:usage");
    let client = redis::Client::open(url.as_str()).expect("client");
    let mut redis = client.get_multiplexed_async_connection().await.expect("redis");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(&["ghost:m", "7", "ghost:b", "70", "ghost:om", "0", "ghost:ob", "0"])
        .arg("ghost:ot")
        .arg(now - GATEWAY_GONE_MS - 1_000)
        .arg(&["alive:m", "3", "alive:b", "30", "alive:om", "0", "alive:ob", "0"])
        .arg("alive:ot")
        .arg(now)
        .query_async(&mut redis)
        .await
        .expect("hset");
    let gateway = SharedQuotas::connect(&url).await.expect("redis");
    let theirs = gateway
        .exchange(&[(tenant.clone(), Report::default())])
        .await
        .expect("exchange");
    assert_eq!(theirs.len(), 1);
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .expect("hgetall");
    assert!(
        !fields.keys().any(|field| field.starts_with("ghost:")),
        "{fields:?}"
    );
    assert!(
        fields.contains_key("alive:m") && fields.contains_key("alive:ot"),
        "{fields:?}"
    );
}
