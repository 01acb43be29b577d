//! `ahp-relay chat`: a terminal client built on the official `ahp` client crate.
//!
//! It owns the interactive loop: it creates a session and chat (or joins one with `--session`), reads prompts
//! and `/commands` from stdin, dispatches them as chat actions, prints what the relay streams back, and survives
//! a dropped connection by reconnecting with backoff. The connection lives in [`link`], the local chat state and
//! its transcript in [`view`], and the meaning of a typed line in [`command`].
//!
//! Besides the transcript lines of [`view`], it prints `session: <uri>`, `chat: <uri>` and `[ready]` once
//! subscribed, and `[disconnected] reconnecting…` / `[reconnected]` around a dropped connection (all on stdout;
//! hints and retry errors go to stderr).

mod command;
mod link;
mod view;

use std::path::PathBuf;
use std::time::Duration;

use ahp::{ClientEvent, SubscriptionEvent};
use ahp_types::actions::StateAction;
use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};

use command::Command;
use link::{ChatGone, Endpoint, Link, Resumed};
use view::ChatView;

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Arguments of `ahp-relay chat`.
#[derive(clap::Args)]
pub struct ChatArgs {
    /// WebSocket URL of the relay.
    #[arg(long, env = "AHP_RELAY_URL", default_value = "ws://127.0.0.1:7878/v1/ws")]
    pub url: String,
    /// Access token; default: a dev token minted from the secret in --data-dir.
    #[arg(long, env = "AHP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Join this session instead of creating one.
    #[arg(long)]
    pub session: Option<String>,
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    pub data_dir: PathBuf,
    /// Client id sent in `initialize` and `reconnect`; default: `chat-<uuid>`.
    #[arg(long)]
    pub client_id: Option<String>,
    /// Agent provider of a new session.
    #[arg(long, default_value = "demo")]
    pub provider: String,
    /// At the end of stdin, wait until no turn is running (and none of ours is pending) before exiting.
    #[arg(long)]
    pub wait_idle: bool,
}

pub async fn run(args: ChatArgs) -> anyhow::Result<()> {
    let endpoint = Endpoint {
        url: authorized_url(&args)?,
        client_id: args
            .client_id
            .clone()
            .unwrap_or_else(|| format!("chat-{}", uuid::Uuid::new_v4())),
    };
    let mut chat = Chat::start(endpoint, &args).await?;
    let result = chat.run(args.wait_idle).await;
    chat.link.client.shutdown().await;
    result
}

/// `--url` with the access token: `--token`, else one already in the URL, else a freshly minted dev token.
fn authorized_url(args: &ChatArgs) -> anyhow::Result<String> {
    if let Some(token) = &args.token {
        return Ok(link::with_access_token(&args.url, token));
    }
    if link::has_access_token(&args.url) {
        return Ok(args.url.clone());
    }
    let secret = crate::secret::load_or_create(crate::secret::SecretSource {
        explicit: None,
        file: None,
        data_dir: &args.data_dir,
    })?;
    let claims = relay_gateway::auth::Claims::new(
        "dev",
        "dev-user",
        relay_core::Role::Admin,
        None,
        Duration::from_secs(86_400),
    );
    let token = relay_gateway::auth::mint_hs256(&secret, &claims).context("minting a dev token")?;
    Ok(link::with_access_token(&args.url, &token))
}

/// A running chat client.
struct Chat {
    endpoint: Endpoint,
    session: String,
    chat: String,
    link: Link,
    view: ChatView<std::io::Stdout>,
}

/// Whether to keep reading input.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Quit,
}

impl Chat {
    /// Connects, creates or joins the session, subscribes to its chat and prints `session:` / `chat:` / `[ready]`.
    async fn start(endpoint: Endpoint, args: &ChatArgs) -> anyhow::Result<Self> {
        let (link, server_seq) = endpoint.open().await?;
        let client = &link.client;
        let session = match &args.session {
            Some(uri) => uri.clone(),
            None => link::create_session(client, &args.provider).await?,
        };
        let session_snapshot = link::subscribe(client, &session).await?;
        let chat = match link::chat_to_join(&session_snapshot)? {
            Some(uri) => uri,
            None => link::create_chat(client, &session).await?,
        };
        let (state, from_seq) = link::chat_state(link::subscribe(client, &chat).await?)?;

        println!("session: {session}");
        println!("chat: {chat}");
        eprintln!("join from another terminal: ahp-relay chat --session {session}");
        eprintln!("{}", command::HELP);
        let mut view = ChatView::new(session.clone(), chat.clone(), state, from_seq, std::io::stdout());
        view.saw_seq(server_seq);
        view.on_snapshot(session_snapshot);
        view.line("[ready]");
        Ok(Self {
            endpoint,
            session,
            chat,
            link,
            view,
        })
    }

    /// Reads stdin and the relay's events until `/quit` or the end of input (with `wait_idle`: and an idle chat).
    async fn run(&mut self, wait_idle: bool) -> anyhow::Result<()> {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut stdin_open = true;
        loop {
            if !stdin_open && self.view.is_idle() {
                return Ok(());
            }
            tokio::select! {
                line = lines.next_line(), if stdin_open => match line {
                    Ok(Some(line)) => {
                        if self.on_line(&line).await? == Flow::Quit {
                            return Ok(());
                        }
                    }
                    Ok(None) | Err(_) => {
                        stdin_open = false;
                        if !wait_idle {
                            return Ok(());
                        }
                    }
                },
                event = self.link.events.recv() => match event {
                    Some(event) => self.on_event(event),
                    None => self.reconnect().await?,
                },
            }
        }
    }

    fn on_event(&mut self, event: ClientEvent) {
        if let SubscriptionEvent::Action(envelope) = event.event {
            self.view.on_envelope(&envelope);
        }
    }

    async fn on_line(&mut self, line: &str) -> anyhow::Result<Flow> {
        let state = &self.view.state;
        let action = match command::parse(line) {
            Command::Nothing => None,
            Command::Quit => return Ok(Flow::Quit),
            Command::Help => return Ok(self.note(command::HELP)),
            Command::Unknown(text) => {
                return Ok(self.note(&format!("unknown command {text}; {}", command::HELP)))
            }
            Command::Prompt(text) => return self.send_prompt(&text).await.map(|()| Flow::Continue),
            Command::Approve => {
                Some(command::confirm_tool_call(state, true).ok_or("no tool call is waiting for approval"))
            }
            Command::Deny => {
                Some(command::confirm_tool_call(state, false).ok_or("no tool call is waiting for approval"))
            }
            Command::Answer(text) => Some(command::answer_input(state, &text).ok_or("no input is requested")),
            Command::Cancel => Some(command::cancel_turn(state).ok_or("no turn is running")),
        };
        match action {
            Some(Ok(action)) => {
                self.dispatch(action).await?;
            }
            Some(Err(why)) => eprintln!("{why}"),
            None => {}
        }
        Ok(Flow::Continue)
    }

    fn note(&self, text: &str) -> Flow {
        eprintln!("{text}");
        Flow::Continue
    }

    /// Starts a turn, or queues the prompt when a turn is already running (or one of ours is on its way).
    async fn send_prompt(&mut self, text: &str) -> anyhow::Result<()> {
        let id = uuid::Uuid::new_v4().to_string();
        let busy = !self.view.is_idle();
        let action = command::prompt(text, id.clone(), busy, jiff::Timestamp::now());
        if self.dispatch(action).await? {
            self.view.expect_echo(id);
        }
        Ok(())
    }

    /// Sends an action on the chat; if the connection is gone, reconnects and sends it once more.
    /// Returns whether it was sent.
    async fn dispatch(&mut self, action: StateAction) -> anyhow::Result<bool> {
        if self
            .link
            .client
            .dispatch(self.chat.clone(), action.clone())
            .await
            .is_ok()
        {
            return Ok(true);
        }
        self.reconnect().await?;
        match self.link.client.dispatch(self.chat.clone(), action).await {
            Ok(_) => Ok(true),
            Err(error) => {
                eprintln!("[error] not sent: {error}");
                Ok(false)
            }
        }
    }

    /// Replaces the dropped connection, retrying with backoff; fails only if the chat is gone for good.
    async fn reconnect(&mut self) -> anyhow::Result<()> {
        self.view.line("[disconnected] reconnecting…");
        let mut delay = FIRST_RETRY;
        loop {
            tokio::time::sleep(delay).await;
            let last_seen = self.view.last_seen();
            match self.endpoint.resume(last_seen, &self.session, &self.chat).await {
                Ok((link, resumed)) => {
                    self.link = link;
                    self.view.line("[reconnected]");
                    self.catch_up(resumed);
                    return Ok(());
                }
                Err(error) if error.is::<ChatGone>() => return Err(error),
                Err(error) => {
                    delay = (delay * 2).min(MAX_RETRY);
                    eprintln!("[disconnected] {}; retrying in {delay:?}", error.root_cause());
                }
            }
        }
    }

    fn catch_up(&mut self, resumed: Resumed) {
        match resumed {
            Resumed::Replay(envelopes) => envelopes
                .iter()
                .for_each(|envelope| self.view.on_envelope(envelope)),
            Resumed::Snapshots(snapshots, server_seq) => {
                if let Some(seq) = server_seq {
                    self.view.saw_seq(seq);
                }
                snapshots
                    .into_iter()
                    .for_each(|snapshot| self.view.on_snapshot(snapshot));
            }
        }
    }
}
