//! A device of a shared chat in the multi-process tests: its client, its subscription, and every envelope it
//! has seen, so that after moves and resumes a test can check nothing was lost or repeated.

use ahp::client::{SessionSubscription, SubscriptionEvent};
use ahp_types::commands::ReconnectResult;
use ahp_types::state::ChatState;
use ahp_types::ActionEnvelope;
use relay_core::Role;

use super::*;

/// One device: its client, subscription, and every envelope it has seen of the chat.
pub struct Device {
    pub name: &'static str,
    pub client: ahp::Client,
    pub sub: SessionSubscription,
    pub state: ChatState,
    pub from: u64,
    pub seen: Vec<ActionEnvelope>,
}

impl Device {
    pub async fn join(gateway: &Relay, tenant: &str, name: &'static str, chat: &str) -> Device {
        let (client, _) = gateway.client_as(tenant, name, Role::Member, name).await;
        let (state, from, sub) = subscribe_chat(&client, chat).await;
        Device {
            name,
            client,
            sub,
            state,
            from,
            seen: Vec::new(),
        }
    }

    pub fn last_seen(&self) -> u64 {
        self.seen.last().map_or(self.from, |e| e.server_seq)
    }

    /// Read envelopes until the connection ends (the gateway closed it: the host moved).
    pub async fn read_until_closed(&mut self) {
        loop {
            match tokio::time::timeout(PATIENCE, self.sub.recv())
                .await
                .expect("the connection was not closed after its shard went away")
            {
                Some(SubscriptionEvent::Action(env)) => self.seen.push(env),
                Some(_) => continue,
                None => return,
            }
        }
    }

    /// Reconnect through `gateway` from the last envelope seen; returns when the replay arrived.
    pub async fn resume(&mut self, gateway: &Relay, tenant: &str, chat: &str) {
        let client = gateway
            .connect_host("default", tenant, self.name, Role::Member)
            .await;
        let sub = client.attach_subscription(chat).await;
        let ReconnectResult::Replay(replay) = client
            .reconnect(self.name.into(), self.last_seen() as i64, vec![chat.to_string()])
            .await
            .expect("reconnect")
        else {
            panic!("{}: expected an exact replay after the move", self.name);
        };
        self.seen.extend(replay.actions);
        self.client = client;
        self.sub = sub;
    }

    pub async fn read_until(&mut self, done: impl Fn(&ActionEnvelope) -> bool) {
        if self.seen.iter().any(&done) {
            return;
        }
        self.seen.extend(collect_until(&mut self.sub, done).await);
    }

    pub fn reduced(&self) -> ChatState {
        reduce_chat(self.state.clone(), self.from, &self.seen)
    }
}

/// `seen`'s envelopes after `seq`, as JSON.
pub fn after(seen: &[ActionEnvelope], seq: u64) -> serde_json::Value {
    json(&seen.iter().filter(|e| e.server_seq > seq).collect::<Vec<_>>())
}

pub fn is_turn_end(env: &ActionEnvelope) -> bool {
    is_turn_complete(env) || matches!(env.action, ahp_types::actions::StateAction::ChatError(_))
}
