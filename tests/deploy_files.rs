//! Keeps the deployment files honest: `docker-compose.yml`, `deploy/Dockerfile`, `.dockerignore` and the
//! Helm chart in `helm/ahp-relay/` are checked against the real `ahp-relay` binary (the output of
//! `ahp-relay <subcommand> --help`) and against the HTTP routers' sources, so a renamed flag, a misspelt
//! environment variable, a port that drifted from its listen address or a probe path that nothing serves
//! fails here rather than in a cluster. Every failure lists each problem found, one per line.
//!
//! How the files are read (no Docker engine and no Helm are needed):
//! - `docker-compose.yml`, `Chart.yaml` and `values.yaml` are parsed as YAML (compose's `<<` merge keys
//!   applied).
//! - Helm templates (`templates/*.yaml`) are rendered away line by line, then parsed as YAML: a line
//!   holding nothing but template actions (`{{- if … }}`, `{{- end }}`, `{{- include … | nindent 4 }}`,
//!   `{{- toYaml … }}`) is dropped; elsewhere `{{ .Values.a.b }}` (optionally piped through `int`,
//!   `toString` or `quote`) becomes that scalar from values.yaml, `{{ include "NAME" … }}` becomes
//!   `INCLUDE(NAME)` and any other action becomes `TEMPLATED`. So every branch of an `if`/`with` is kept,
//!   and whatever `toYaml` or a line-level `include` would emit (labels, resources, security contexts) is
//!   not seen.
//! - `deploy/Dockerfile` is read as instructions (continuation lines joined); `ENTRYPOINT`/`CMD` as JSON.
//!
//! The relay processes checked: compose services built from deploy/Dockerfile, chart containers whose
//! image is `include "ahp-relay.image"`, the Dockerfile's default `CMD`, and the `… -- ahp-relay …`
//! command lines of NOTES.txt (those only for subcommand and flags).
//!
//! Checked:
//! 1. every subcommand exists, and every `--flag` given to it is listed by `ahp-relay <sub> --help`;
//! 2. every environment variable given to a relay process is listed by `ahp-relay <sub> --help`
//!    (`[env: NAME]`), or is in [`LIBRARY_ENV`] and the crate that reads it is in Cargo.lock, or is in
//!    [`EXPANSION_ONLY_ENV`] and used as `$(NAME)` by another variable of the same container;
//! 3. ports: each listen address a process ends up with (`--listen`, `--grpc-listen`, `--http-listen`:
//!    flag, else environment, else the default `--help` shows) is not loopback; compose's container ports
//!    and the chart's containerPorts are such listen ports (and the chart declares every one);
//!    healthchecks, probes and `prometheus.io/port` target an HTTP listen address (`--listen` or
//!    `--http-listen`), not gRPC; the Dockerfile's `EXPOSE` equals the set of listen ports in use;
//! 4. the HTTP paths of healthchecks, probes and `prometheus.io/path` appear as string literals in the
//!    router sources of the process serving them ([`route_sources`]);
//! 5. compose wiring: Postgres and Redis with healthchecks; at least two shards and two gateways built
//!    from deploy/Dockerfile with the repository root as context; every URL setting names a compose
//!    service that the process waits for until healthy; each gateway lists every shard at its gRPC port;
//!    each shard advertises its own service name and gRPC port; healthcheck programs are installed in the
//!    image; no host port is published twice;
//! 6. chart wiring: Chart.yaml's fields; every `.Values.…` reference exists in values.yaml and every
//!    `include` is defined; the gateway Deployment, Service and autoscaling/v2 HPA, the shard StatefulSet
//!    and its headless Service, ConfigMaps and a Secret exist; Services select a workload and target its
//!    declared ports; liveness `/healthz` and readiness `/readyz`; resources with requests and limits in
//!    values.yaml; secret keys exist in the chart's Secret; each shard advertises its pod's name under the
//!    headless Service at its gRPC port, and the gateways' shard URL helper uses that Service and port;
//! 7. the Dockerfile: builder on the workspace's rust-version, `cargo build --release --locked -p
//!    ahp-relay`, a slim runtime with CA certificates, a non-root user, `ENTRYPOINT ["ahp-relay"]`;
//!    `.dockerignore` excludes `target/`.
//!
//! Not checked: that the image builds or the containers start; what `toYaml` or line-level `include`
//! blocks render (labels, resources, the gateways' shard URL list itself); that `--shard` accepts a
//! comma-separated list (clap's help cannot say); that values parse (durations, URLs) beyond ports;
//! Kubernetes schemas.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde::Deserialize;
use serde_yaml_ng::Value;

/// Environment variables read by libraries rather than by clap: the variable and the crate (as named in
/// Cargo.lock) that reads it. Setting one is only honest while that crate is built into the binary.
const LIBRARY_ENV: &[(&str, &str)] = &[
    ("RUST_LOG", "tracing-subscriber"),
    ("OTEL_SERVICE_NAME", "opentelemetry_sdk"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "opentelemetry-otlp"),
];

/// Variables set only so that Kubernetes can expand `$(NAME)` in another variable; the relay never reads
/// them.
const EXPANSION_ONLY_ENV: &[&str] = &["POD_NAME"];

/// Options holding listen addresses, and which of them serve HTTP (health, readiness, metrics, WebSockets).
const LISTEN_OPTIONS: &[&str] = &["listen", "grpc-listen", "http-listen"];
const HTTP_LISTEN_OPTIONS: &[&str] = &["listen", "http-listen"];

/// Where the routes of each HTTP-serving subcommand are declared (files, or folders searched for `*.rs`).
fn route_sources(sub: &str) -> Option<&'static [&'static str]> {
    match sub {
        // `serve` mounts the gateway's router too.
        "gateway" | "serve" => Some(&["services/gateway/src/server.rs"]),
        // The shard's HTTP server (--http-listen) may live with the shard, its gRPC server or the binary.
        "shard" => Some(&["services/shard/src", "services/rpc/src", "services/relay/src"]),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------------
// The binary's own description of itself.

/// One option of `ahp-relay <sub> --help`.
#[derive(Debug)]
struct HelpOption {
    long: String,
    env: Option<String>,
    default: Option<String>,
}

/// The options of one subcommand.
#[derive(Debug)]
struct Help {
    options: Vec<HelpOption>,
}

impl Help {
    fn option(&self, long: &str) -> Option<&HelpOption> {
        self.options.iter().find(|option| option.long == long)
    }

    fn reads_env(&self, name: &str) -> bool {
        self.options
            .iter()
            .any(|option| option.env.as_deref() == Some(name))
    }
}

/// `ahp-relay <sub> --help`, parsed (cached); `None` when the binary has no such subcommand. The environment
/// is cleared so that variables set around the test (DATABASE_URL, …) do not show up in the output.
fn help(sub: &str) -> Option<&'static Help> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<&'static Help>>>> = OnceLock::new();
    if sub.is_empty() || sub.starts_with('-') {
        return None;
    }
    let mut cache = CACHE.get_or_init(Default::default).lock().expect("help cache");
    *cache.entry(sub.to_string()).or_insert_with(|| {
        let output = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .args([sub, "--help"])
            .env_clear()
            .output()
            .expect("running ahp-relay");
        output.status.success().then(|| {
            let help: &'static Help =
                Box::leak(Box::new(parse_help(&String::from_utf8_lossy(&output.stdout))));
            help
        })
    })
}

/// Reads clap's help: an option starts on a line indented by at most 6 spaces with `-`; its description,
/// `[env: NAME=]` and `[default: …]` follow on the same or the following lines.
fn parse_help(text: &str) -> Help {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with('-') && indent <= 6 {
            let long = trimmed
                .split(|c: char| c.is_whitespace() || matches!(c, ',' | '<' | '=' | '['))
                .find_map(|token| token.strip_prefix("--"))
                .unwrap_or("")
                .to_string();
            entries.push((long, trimmed.to_string()));
        } else if let Some((_, body)) = entries.last_mut() {
            body.push(' ');
            body.push_str(trimmed);
        }
    }
    let bracket = |body: &str, tag: &str, stop: &[char]| {
        body.find(tag).map(|at| {
            let rest = &body[at + tag.len()..];
            rest[..rest.find(stop).unwrap_or(rest.len())].to_string()
        })
    };
    Help {
        options: entries
            .into_iter()
            .map(|(long, body)| HelpOption {
                env: bracket(&body, "[env: ", &['=', ']']),
                default: bracket(&body, "[default: ", &[']']),
                long,
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Reading the files.

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_root().join(relative))
        .unwrap_or_else(|error| panic!("reading {relative}: {error}"))
}

fn parse_yaml(relative: &str, text: &str) -> Value {
    let mut value: Value =
        serde_yaml_ng::from_str(text).unwrap_or_else(|error| panic!("{relative} is not valid YAML: {error}"));
    value
        .apply_merge()
        .unwrap_or_else(|error| panic!("{relative}: merge keys: {error}"));
    value
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// A value for a message, or `nothing`.
fn shown(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "nothing".to_string(), |value| value.to_string())
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |value, key| value.get(*key))?
        .as_str()
}

fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map_or(&[], Vec::as_slice)
}

/// `host:port` (or `[v6]:port`).
fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    Some((
        host.trim_start_matches('[').trim_end_matches(']'),
        port.parse().ok()?,
    ))
}

/// `scheme://host[:port][/path]` → (host, port, path).
fn parse_url(url: &str) -> Option<(String, Option<u16>, String)> {
    let url = url.trim_matches(|c| c == '"' || c == '\'');
    let (_, rest) = url.split_once("://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = match split_host_port(authority) {
        Some((host, port)) => (host.to_string(), Some(port)),
        None => (authority.to_string(), None),
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    Some((
        host,
        port,
        if path.is_empty() {
            "/".to_string()
        } else {
            path.to_string()
        },
    ))
}

// ---------------------------------------------------------------------------------------------------------
// Relay processes, as the deployment files start them.

#[derive(Debug, Clone)]
enum PortRef {
    Number(u16),
    Name(String),
}

/// An HTTP endpoint a deployment file expects a process to serve.
#[derive(Debug)]
struct Probe {
    what: String,
    path: Option<String>,
    port: PortRef,
}

/// One `ahp-relay` process as a deployment file starts it.
#[derive(Debug, Default)]
struct Process {
    origin: String,
    /// Subcommand first, then its arguments.
    args: Vec<String>,
    /// Environment variables in order; `None` for values taken from a Secret or the pod's fields.
    env: Vec<(String, Option<String>)>,
    /// Ports the container publishes or declares (name, number).
    container_ports: Vec<(Option<String>, u16)>,
    /// Whether every listen port must be declared among `container_ports` (Kubernetes containerPorts).
    declares_all_ports: bool,
    probes: Vec<Probe>,
}

impl Process {
    fn sub(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    fn flags(&self) -> impl Iterator<Item = &str> {
        self.args
            .iter()
            .filter_map(|arg| arg.strip_prefix("--"))
            .map(|flag| flag.split('=').next().unwrap_or(flag))
    }

    fn flag_value(&self, long: &str) -> Option<String> {
        let flag = format!("--{long}");
        let mut args = self.args.iter();
        while let Some(arg) = args.next() {
            if *arg == flag {
                return args.next().cloned();
            }
            if let Some(value) = arg.strip_prefix(&format!("{flag}=")) {
                return Some(value.to_string());
            }
        }
        None
    }

    fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
    }

    /// The value the process ends up with for `option`: flag, else environment, else default.
    fn setting(&self, option: &HelpOption) -> Option<String> {
        self.flag_value(&option.long)
            .or_else(|| {
                option
                    .env
                    .as_deref()
                    .and_then(|env| self.env_value(env))
                    .map(str::to_string)
            })
            .or_else(|| option.default.clone())
    }

    /// (option, address) of every listen address the process has.
    fn listen_addresses(&self, help: &Help) -> Vec<(String, String)> {
        LISTEN_OPTIONS
            .iter()
            .filter_map(|long| help.option(long))
            .filter_map(|option| Some((option.long.clone(), self.setting(option)?)))
            .collect()
    }

    fn port_named(&self, name: &str) -> Option<u16> {
        self.container_ports
            .iter()
            .find(|(port_name, _)| port_name.as_deref() == Some(name))
            .map(|(_, n)| *n)
    }
}

const COMPOSE: &str = "docker-compose.yml";
const DOCKERFILE: &str = "deploy/Dockerfile";
const CHART: &str = "helm/ahp-relay";

fn compose() -> Value {
    parse_yaml(COMPOSE, &read(COMPOSE))
}

fn compose_services(compose: &Value) -> Vec<(String, &Value)> {
    compose
        .get("services")
        .and_then(Value::as_mapping)
        .expect("docker-compose.yml has services")
        .iter()
        .map(|(name, service)| (scalar(name).unwrap_or_default(), service))
        .collect()
}

fn is_relay_service(service: &Value) -> bool {
    str_at(service, &["build", "dockerfile"]) == Some(DOCKERFILE)
}

/// `command:` as a list of words (list form, or a string split at whitespace).
fn words(value: &Value) -> Vec<String> {
    match value {
        Value::String(text) => text.split_whitespace().map(str::to_string).collect(),
        Value::Sequence(items) => items.iter().filter_map(scalar).collect(),
        _ => Vec::new(),
    }
}

fn compose_processes(compose: &Value) -> Vec<Process> {
    let mut processes = Vec::new();
    for (name, service) in compose_services(compose) {
        if !is_relay_service(service) {
            continue;
        }
        let origin = format!("{COMPOSE} service {name}");
        let env = match service.get("environment") {
            Some(Value::Mapping(map)) => map
                .iter()
                .map(|(key, value)| (scalar(key).unwrap_or_default(), scalar(value)))
                .collect(),
            Some(Value::Sequence(items)) => items
                .iter()
                .filter_map(scalar)
                .map(|item| match item.split_once('=') {
                    Some((key, value)) => (key.to_string(), Some(value.to_string())),
                    None => (item, None),
                })
                .collect(),
            _ => Vec::new(),
        };
        let container_ports = seq(&service["ports"])
            .iter()
            .filter_map(|port| match port {
                Value::Mapping(_) => port.get("target").and_then(scalar),
                other => scalar(other).map(|text| {
                    let text = text.split('/').next().unwrap_or(&text).to_string();
                    text.rsplit(':').next().unwrap_or(&text).to_string()
                }),
            })
            .filter_map(|port| port.parse().ok())
            .map(|port| (None, port))
            .collect();
        let probes = healthcheck_words(service)
            .iter()
            .filter(|word| word.contains("://"))
            .filter_map(|word| parse_url(word))
            .map(|(_, port, path)| Probe {
                what: "healthcheck".to_string(),
                path: Some(path),
                port: PortRef::Number(port.unwrap_or(80)),
            })
            .collect();
        processes.push(Process {
            origin,
            args: words(&service["command"]),
            env,
            container_ports,
            declares_all_ports: false,
            probes,
        });
    }
    processes
}

/// The words of a compose healthcheck's `test`, without `CMD` / `CMD-SHELL`.
fn healthcheck_words(service: &Value) -> Vec<String> {
    words(&service["healthcheck"]["test"])
        .iter()
        .skip_while(|word| *word == "CMD" || *word == "CMD-SHELL")
        .flat_map(|word| word.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// One Dockerfile instruction, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn dockerfile() -> Vec<Instruction> {
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in read(DOCKERFILE).lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let (keyword, args) = pending.split_once(char::is_whitespace).unwrap_or((&pending, ""));
        instructions.push(Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_string(),
        });
        pending.clear();
    }
    instructions
}

/// The instructions of the last stage (from its `FROM` on).
fn final_stage(instructions: &[Instruction]) -> &[Instruction] {
    let start = instructions
        .iter()
        .rposition(|instruction| instruction.keyword == "FROM")
        .unwrap_or(0);
    &instructions[start..]
}

fn json_words(args: &str) -> Option<Vec<String>> {
    serde_json::from_str(args).ok()
}

fn dockerfile_process(instructions: &[Instruction]) -> Process {
    let stage = final_stage(instructions);
    let last = |keyword: &str| {
        stage
            .iter()
            .rev()
            .find(|instruction| instruction.keyword == keyword)
    };
    let mut env = Vec::new();
    for instruction in stage.iter().filter(|instruction| instruction.keyword == "ENV") {
        let args = instruction.args.as_str();
        if args
            .split_whitespace()
            .next()
            .is_some_and(|first| first.contains('='))
        {
            for pair in args.split_whitespace() {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                env.push((key.to_string(), Some(value.trim_matches('"').to_string())));
            }
        } else if let Some((key, value)) = args.split_once(char::is_whitespace) {
            env.push((key.to_string(), Some(value.trim().to_string())));
        }
    }
    Process {
        origin: format!("{DOCKERFILE} CMD"),
        args: last("CMD")
            .and_then(|cmd| json_words(&cmd.args))
            .unwrap_or_default(),
        env,
        ..Process::default()
    }
}

/// The chart: values, raw template texts and the rendered manifests.
struct Chart {
    values: Value,
    /// (file name, text) of every file in templates/, including _helpers.tpl and NOTES.txt.
    texts: Vec<(String, String)>,
    /// (file name, manifest) of every YAML document the templates render to.
    docs: Vec<(String, Value)>,
}

fn chart() -> Chart {
    let values = parse_yaml(
        &format!("{CHART}/values.yaml"),
        &read(&format!("{CHART}/values.yaml")),
    );
    let dir = repo_root().join(CHART).join("templates");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    let texts: Vec<(String, String)> = names
        .into_iter()
        .map(|name| (name.clone(), read(&format!("{CHART}/templates/{name}"))))
        .collect();
    let mut docs = Vec::new();
    for (name, text) in texts
        .iter()
        .filter(|(name, _)| name.ends_with(".yaml") || name.ends_with(".yml"))
    {
        let rendered = render_template(text, &values);
        for document in serde_yaml_ng::Deserializer::from_str(&rendered) {
            let doc = Value::deserialize(document).unwrap_or_else(|error| {
                panic!("templates/{name} does not render to YAML: {error}\n{rendered}")
            });
            if !doc.is_null() {
                docs.push((name.clone(), doc));
            }
        }
    }
    Chart { values, texts, docs }
}

/// Renders a template the simple way described in the module docs.
fn render_template(text: &str, values: &Value) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut rendered = String::new();
        let mut literal = String::new();
        let mut rest = line;
        let mut had_action = false;
        while let Some(start) = rest.find("{{") {
            let Some(length) = rest[start + 2..].find("}}") else {
                break;
            };
            rendered.push_str(&rest[..start]);
            literal.push_str(&rest[..start]);
            let action =
                rest[start + 2..start + 2 + length].trim_matches(|c: char| c == '-' || c.is_whitespace());
            rendered.push_str(&render_action(action, values));
            had_action = true;
            rest = &rest[start + 2 + length + 2..];
        }
        rendered.push_str(rest);
        literal.push_str(rest);
        if had_action && literal.trim().is_empty() {
            continue;
        }
        out.push_str(&rendered);
        out.push('\n');
    }
    out
}

fn render_action(action: &str, values: &Value) -> String {
    const CONTROL: &[&str] = &["if ", "else", "end", "with ", "range ", "define ", "block ", "/*"];
    if CONTROL.iter().any(|keyword| action.starts_with(keyword))
        || (action.starts_with('$') && action.contains('='))
    {
        return String::new();
    }
    let mut stages = action.split('|').map(str::trim);
    let first = stages.next().unwrap_or("");
    let functions: Vec<&str> = stages.collect();
    let text = if let Some(name) = first
        .strip_prefix("include \"")
        .and_then(|rest| rest.split('"').next())
    {
        format!("INCLUDE({name})")
    } else if let Some(path) = first
        .strip_prefix("$.Values.")
        .or_else(|| first.strip_prefix(".Values."))
    {
        let plain = functions
            .iter()
            .all(|function| matches!(*function, "quote" | "int" | "int64" | "toString"));
        values_lookup(values, path)
            .filter(|_| plain)
            .and_then(scalar)
            .unwrap_or_else(|| "TEMPLATED".into())
    } else {
        "TEMPLATED".to_string()
    };
    if functions.contains(&"quote") {
        format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        text
    }
}

fn values_lookup<'a>(values: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .try_fold(values, |value, key| value.as_mapping()?.get(key))
}

fn kind(doc: &Value) -> &str {
    str_at(doc, &["kind"]).unwrap_or("")
}

fn name(doc: &Value) -> &str {
    str_at(doc, &["metadata", "name"]).unwrap_or("")
}

fn component(labels: &Value) -> Option<&str> {
    labels.get("app.kubernetes.io/component").and_then(Value::as_str)
}

const WORKLOADS: &[&str] = &["Deployment", "StatefulSet", "DaemonSet", "Job"];
const RELAY_IMAGE: &str = "INCLUDE(ahp-relay.image)";

/// The relay containers of the chart's workloads, with the problems met reading them.
fn helm_processes(chart: &Chart) -> (Vec<Process>, Vec<String>) {
    let mut processes = Vec::new();
    let mut problems = Vec::new();
    for (file, doc) in chart
        .docs
        .iter()
        .filter(|(_, doc)| WORKLOADS.contains(&kind(doc)))
    {
        let template = &doc["spec"]["template"];
        let annotations = &template["metadata"]["annotations"];
        let pod = &template["spec"];
        let containers = seq(&pod["containers"]).iter().chain(seq(&pod["initContainers"]));
        for container in containers.filter(|container| str_at(container, &["image"]) == Some(RELAY_IMAGE)) {
            let container_name = str_at(container, &["name"]).unwrap_or("?");
            let origin = format!(
                "{CHART}/templates/{file} {} container {container_name}",
                kind(doc)
            );
            let mut args = words(&container["command"]);
            if args.first().is_some_and(|program| program == "ahp-relay") {
                args.remove(0);
            }
            args.extend(words(&container["args"]));
            let mut env = Vec::new();
            for source in seq(&container["envFrom"]) {
                if let Some(map_name) = str_at(source, &["configMapRef", "name"]) {
                    let found = chart
                        .docs
                        .iter()
                        .find(|(_, doc)| kind(doc) == "ConfigMap" && name(doc) == map_name);
                    match found.and_then(|(_, doc)| doc["data"].as_mapping()) {
                        Some(data) => env.extend(
                            data.iter()
                                .map(|(key, value)| (scalar(key).unwrap_or_default(), scalar(value))),
                        ),
                        None => problems.push(format!(
                            "{origin}: envFrom names ConfigMap {map_name}, which the chart does not define"
                        )),
                    }
                }
                if source.get("secretRef").is_some() {
                    problems.push(format!(
                        "{origin}: envFrom secretRef hides which variables are set; use env with secretKeyRef"
                    ));
                }
            }
            for variable in seq(&container["env"]) {
                let value = variable.get("value").and_then(scalar);
                env.push((str_at(variable, &["name"]).unwrap_or("").to_string(), value));
            }
            let container_ports = seq(&container["ports"])
                .iter()
                .filter_map(|port| {
                    let number = port
                        .get("containerPort")
                        .and_then(Value::as_u64)
                        .and_then(|n| u16::try_from(n).ok());
                    if number.is_none() {
                        problems.push(format!(
                            "{origin}: containerPort {} is not a port number",
                            shown(port.get("containerPort").and_then(scalar))
                        ));
                    }
                    Some((str_at(port, &["name"]).map(str::to_string), number?))
                })
                .collect();
            let mut probes: Vec<Probe> = ["livenessProbe", "readinessProbe", "startupProbe"]
                .iter()
                .filter_map(|probe| {
                    let get = container.get(*probe)?.get("httpGet")?;
                    let port = match get.get("port")? {
                        Value::Number(number) => {
                            PortRef::Number(number.as_u64().and_then(|n| u16::try_from(n).ok())?)
                        }
                        other => PortRef::Name(scalar(other)?),
                    };
                    Some(Probe {
                        what: probe.to_string(),
                        path: str_at(get, &["path"]).map(str::to_string),
                        port,
                    })
                })
                .collect();
            if let Some(port) = annotations.get("prometheus.io/port").and_then(scalar) {
                match port.parse() {
                    Ok(port) => probes.push(Probe {
                        what: "prometheus.io annotations".to_string(),
                        path: annotations.get("prometheus.io/path").and_then(scalar),
                        port: PortRef::Number(port),
                    }),
                    Err(_) => problems.push(format!(
                        "{origin}: prometheus.io/port {port:?} is not a port number"
                    )),
                }
            }
            processes.push(Process {
                origin,
                args,
                env,
                container_ports,
                declares_all_ports: true,
                probes,
            });
        }
    }
    (processes, problems)
}

/// `… -- ahp-relay <sub> --flags` command lines of NOTES.txt (subcommand and flags only).
fn notes_processes(chart: &Chart) -> Vec<Process> {
    let notes = chart
        .texts
        .iter()
        .find(|(name, _)| name == "NOTES.txt")
        .map_or("", |(_, text)| text.as_str());
    notes
        .lines()
        .enumerate()
        .filter_map(|(index, line)| {
            let (_, command) = line.split_once("-- ahp-relay ")?;
            Some(Process {
                origin: format!("{CHART}/templates/NOTES.txt line {}", index + 1),
                args: command.split_whitespace().map(str::to_string).collect(),
                ..Process::default()
            })
        })
        .collect()
}

fn all_processes() -> Vec<Process> {
    let chart = chart();
    let mut processes = compose_processes(&compose());
    processes.extend(helm_processes(&chart).0);
    processes.push(dockerfile_process(&dockerfile()));
    processes.extend(notes_processes(&chart));
    processes
}

/// Fails with every problem, one per line, in first-seen order without repeats.
fn assert_no_problems(what: &str, problems: Vec<String>) {
    let mut seen = BTreeSet::new();
    let problems: Vec<String> = problems
        .into_iter()
        .filter(|problem| seen.insert(problem.clone()))
        .collect();
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  - {}\n",
        problems.len(),
        problems.join("\n  - ")
    );
}

// ---------------------------------------------------------------------------------------------------------
// The checks.

#[test]
fn subcommands_and_flags_exist() {
    let mut problems = Vec::new();
    for process in all_processes() {
        let sub = process.sub();
        let Some(help) = help(sub) else {
            problems.push(format!(
                "{}: `ahp-relay {sub}` is not a subcommand of the binary",
                process.origin
            ));
            continue;
        };
        for flag in process.flags() {
            if help.option(flag).is_none() {
                problems.push(format!("{}: `ahp-relay {sub}` has no --{flag}", process.origin));
            }
        }
    }
    assert_no_problems("subcommands and flags", problems);
}

#[test]
fn environment_variables_are_read() {
    let lock = read("Cargo.lock");
    let in_lock = |krate: &str| lock.lines().any(|line| line == format!("name = \"{krate}\""));
    let mut problems = Vec::new();
    for process in all_processes() {
        let sub = process.sub();
        let Some(help) = help(sub) else { continue };
        for (name, _) in &process.env {
            if help.reads_env(name) {
                continue;
            }
            if let Some((_, krate)) = LIBRARY_ENV.iter().find(|(variable, _)| variable == name) {
                if !in_lock(krate) {
                    problems.push(format!(
                        "{}: {name} is read by the crate {krate}, which is not in Cargo.lock",
                        process.origin
                    ));
                }
                continue;
            }
            if EXPANSION_ONLY_ENV.contains(&name.as_str()) {
                let expansion = format!("$({name})");
                if !process
                    .env
                    .iter()
                    .any(|(_, value)| value.as_deref().is_some_and(|v| v.contains(&expansion)))
                {
                    problems.push(format!(
                        "{}: {name} is set for $({name}) expansion, but nothing uses it",
                        process.origin
                    ));
                }
                continue;
            }
            problems.push(format!(
                "{}: `ahp-relay {sub}` does not read {name} (not in `ahp-relay {sub} --help`)",
                process.origin
            ));
        }
    }
    assert_no_problems("environment variables", problems);
}

#[test]
fn ports_match_listen_addresses() {
    let mut problems = Vec::new();
    let mut used_ports = BTreeSet::new();
    for process in all_processes() {
        let sub = process.sub();
        let Some(help) = help(sub) else { continue };
        let listens = process.listen_addresses(help);
        let describe = listens
            .iter()
            .map(|(long, address)| format!("--{long} {address}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut ports = BTreeMap::new();
        for (long, address) in &listens {
            match split_host_port(address) {
                Some((host, port)) => {
                    if host == "localhost" || host.starts_with("127.") || host == "::1" {
                        problems.push(format!(
                            "{}: --{long} is {address}, a loopback address unreachable from outside",
                            process.origin
                        ));
                    }
                    ports.insert(port, long.as_str());
                    used_ports.insert(port);
                }
                None => problems.push(format!(
                    "{}: --{long} is {address:?}, not host:port",
                    process.origin
                )),
            }
        }
        for (port_name, port) in &process.container_ports {
            if !ports.contains_key(port) {
                let label = port_name
                    .as_deref()
                    .map_or(String::new(), |name| format!(" ({name})"));
                problems.push(format!(
                    "{}: container port {port}{label} is not where `ahp-relay {sub}` listens ({describe})",
                    process.origin
                ));
            }
        }
        if process.declares_all_ports {
            for (port, long) in &ports {
                if !process
                    .container_ports
                    .iter()
                    .any(|(_, declared)| declared == port)
                {
                    problems.push(format!(
                        "{}: --{long} binds port {port}, but no containerPort declares it",
                        process.origin
                    ));
                }
            }
        }
        for probe in &process.probes {
            let port = match &probe.port {
                PortRef::Number(port) => *port,
                PortRef::Name(name) => match process.port_named(name) {
                    Some(port) => port,
                    None => {
                        problems.push(format!(
                            "{}: {} targets port {name:?}, which is not declared",
                            process.origin, probe.what
                        ));
                        continue;
                    }
                },
            };
            if !ports
                .get(&port)
                .is_some_and(|long| HTTP_LISTEN_OPTIONS.contains(long))
            {
                problems.push(format!(
                    "{}: {} targets port {port}: no HTTP listen address of `ahp-relay {sub}` ({describe})",
                    process.origin, probe.what
                ));
            }
        }
    }
    let exposed: BTreeSet<u16> = dockerfile()
        .iter()
        .filter(|instruction| instruction.keyword == "EXPOSE")
        .flat_map(|instruction| {
            instruction
                .args
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|port| port.split('/').next().and_then(|port| port.parse().ok()))
        .collect();
    for port in exposed.difference(&used_ports) {
        problems.push(format!(
            "{DOCKERFILE}: EXPOSE {port}, but no process of the deployments listens there"
        ));
    }
    for port in used_ports.difference(&exposed) {
        problems.push(format!(
            "{DOCKERFILE}: processes listen on port {port}, which is not in EXPOSE"
        ));
    }
    assert_no_problems("ports", problems);
}

#[test]
fn probe_paths_are_served() {
    // (sub, path) → where it is used.
    let mut uses: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for process in all_processes() {
        for probe in &process.probes {
            match &probe.path {
                Some(path) => uses
                    .entry((process.sub().to_string(), path.clone()))
                    .or_default()
                    .push(format!("{} {}", process.origin, probe.what)),
                None => problems.push(format!("{}: {} has no path", process.origin, probe.what)),
            }
        }
    }
    for ((sub, path), users) in uses {
        let Some(sources) = route_sources(&sub) else {
            problems.push(format!(
                "`ahp-relay {sub}` serves no HTTP that this test knows of (used by: {})",
                users.join("; ")
            ));
            continue;
        };
        let literal = format!("\"{path}\"");
        if !sources
            .iter()
            .any(|source| rust_sources(source).iter().any(|text| text.contains(&literal)))
        {
            problems.push(format!(
                "{path} is not routed by `ahp-relay {sub}` (no {literal} in {}); used by: {}",
                sources.join(", "),
                users.join("; ")
            ));
        }
    }
    assert_no_problems("HTTP paths", problems);
}

/// The text of a source file, or of every `*.rs` file under a folder.
fn rust_sources(relative: &str) -> Vec<String> {
    let path = repo_root().join(relative);
    if path.is_file() {
        return vec![read(relative)];
    }
    let mut texts = Vec::new();
    let mut folders = vec![path];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                texts.push(std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    texts
}

/// How `service` waits for `other` (`service_started` when listed without a condition).
fn depends_on(service: &Value, other: &str) -> Option<String> {
    match service.get("depends_on")? {
        Value::Mapping(map) => map.get(other).map(|entry| {
            str_at(entry, &["condition"])
                .unwrap_or("service_started")
                .to_string()
        }),
        Value::Sequence(items) => items
            .iter()
            .any(|item| item.as_str() == Some(other))
            .then(|| "service_started".to_string()),
        _ => None,
    }
}

#[test]
fn compose_wiring() {
    let compose = compose();
    let services: BTreeMap<String, &Value> = compose_services(&compose).into_iter().collect();
    let processes = compose_processes(&compose);
    let runtime_installs: String = final_stage(&dockerfile())
        .iter()
        .filter(|instruction| instruction.keyword == "RUN" && instruction.args.contains("apt-get install"))
        .map(|instruction| instruction.args.clone())
        .collect();
    let mut problems = Vec::new();

    for (service, image) in [("postgres", "postgres:"), ("redis", "redis:")] {
        match services.get(service) {
            Some(definition) => {
                if !str_at(definition, &["image"]).is_some_and(|name| name.starts_with(image)) {
                    problems.push(format!(
                        "{COMPOSE}: service {service} does not run an {image}… image"
                    ));
                }
                if definition.get("healthcheck").is_none() {
                    problems.push(format!("{COMPOSE}: service {service} has no healthcheck"));
                }
            }
            None => problems.push(format!("{COMPOSE}: no {service} service")),
        }
    }
    let service_name = |process: &Process| process.origin.rsplit(' ').next().unwrap_or("").to_string();
    let shards: Vec<&Process> = processes
        .iter()
        .filter(|process| process.sub() == "shard")
        .collect();
    let gateways: Vec<&Process> = processes
        .iter()
        .filter(|process| process.sub() == "gateway")
        .collect();
    if shards.len() < 2 || gateways.len() < 2 {
        problems.push(format!(
            "{COMPOSE}: {} shard and {} gateway services built from {DOCKERFILE}; two of each are expected",
            shards.len(),
            gateways.len()
        ));
    }
    let grpc_port = |process: &Process| {
        let option = help("shard")?.option("grpc-listen")?;
        split_host_port(&process.setting(option)?).map(|(_, port)| port)
    };

    let mut host_ports = BTreeMap::new();
    for process in &processes {
        let name = service_name(process);
        let service = services[&name];
        if str_at(service, &["build", "context"]) != Some(".") {
            problems.push(format!(
                "{}: build context must be the repository root (.), as {DOCKERFILE} copies it",
                process.origin
            ));
        }
        if matches!(process.sub(), "shard" | "gateway" | "serve") {
            match healthcheck_words(service).first() {
                None => problems.push(format!(
                    "{}: a long-running process without a healthcheck",
                    process.origin
                )),
                Some(program) if !runtime_installs.split_whitespace().any(|word| word == program) => problems
                    .push(format!(
                        "{}: healthcheck runs {program}, which {DOCKERFILE}'s runtime stage does not install",
                        process.origin
                    )),
                Some(_) => {}
            }
        }
        for port in seq(&service["ports"]).iter().filter_map(scalar) {
            let parts: Vec<&str> = port.split(':').collect();
            if parts.len() >= 2 {
                let host = parts[parts.len() - 2].to_string();
                if let Some(other) = host_ports.insert(host.clone(), name.clone()) {
                    problems.push(format!(
                        "{COMPOSE}: host port {host} is published by both {other} and {name}"
                    ));
                }
            }
        }
        // Every URL setting names a service this one waits for (its own advertise URL excepted).
        for (variable, value) in &process.env {
            let Some(value) = value else { continue };
            if !value.contains("://") || variable == "AHP_RELAY_ADVERTISE_URL" {
                continue;
            }
            for url in value.split(',') {
                let Some((host, _, _)) = parse_url(url) else {
                    continue;
                };
                if !services.contains_key(&host) {
                    problems.push(format!(
                        "{}: {variable} names {host}, which is not a service",
                        process.origin
                    ));
                } else if depends_on(service, &host).as_deref() != Some("service_healthy") {
                    problems.push(format!(
                        "{}: {variable} names {host}, but the service does not wait for it (service_healthy)",
                        process.origin
                    ));
                }
            }
        }
    }
    for shard in &shards {
        let name = service_name(shard);
        let expected = grpc_port(shard).map(|port| format!("http://{name}:{port}"));
        let advertised = shard.env_value("AHP_RELAY_ADVERTISE_URL").map(str::to_string);
        if advertised.is_none() || advertised != expected {
            problems.push(format!(
                "{}: AHP_RELAY_ADVERTISE_URL is {}; others reach this shard at {}",
                shard.origin,
                shown(advertised),
                shown(expected)
            ));
        }
    }
    for gateway in &gateways {
        let urls = help("gateway")
            .and_then(|help| help.option("shard"))
            .and_then(|option| gateway.setting(option))
            .unwrap_or_default();
        let listed: Vec<(String, Option<u16>)> = urls
            .split(',')
            .filter_map(parse_url)
            .map(|(host, port, _)| (host, port))
            .collect();
        for shard in &shards {
            let name = service_name(shard);
            match listed.iter().find(|(host, _)| *host == name) {
                None => problems.push(format!(
                    "{}: the shard URLs ({urls}) leave out {name}",
                    gateway.origin
                )),
                Some((_, port)) if *port != grpc_port(shard) => problems.push(format!(
                    "{}: lists {name} at port {}, but it serves gRPC on {}",
                    gateway.origin,
                    shown(*port),
                    shown(grpc_port(shard))
                )),
                Some(_) => {}
            }
        }
        for (host, _) in &listed {
            if !shards.iter().any(|shard| service_name(shard) == *host) {
                problems.push(format!(
                    "{}: shard URL host {host} is not a shard service",
                    gateway.origin
                ));
            }
        }
    }
    assert_no_problems("docker-compose.yml wiring", problems);
}

#[test]
fn helm_chart_wiring() {
    let chart = chart();
    let (processes, mut problems) = helm_processes(&chart);
    let chart_yaml = parse_yaml(
        &format!("{CHART}/Chart.yaml"),
        &read(&format!("{CHART}/Chart.yaml")),
    );
    for (field, expected) in [
        ("apiVersion", Some("v2")),
        ("name", Some("ahp-relay")),
        ("version", None),
        ("appVersion", None),
    ] {
        let value = chart_yaml.get(field).and_then(scalar);
        if value.is_none() || (expected.is_some() && value.as_deref() != expected) {
            problems.push(format!(
                "{CHART}/Chart.yaml: {field} is {}, expected {}",
                shown(value),
                expected.unwrap_or("a value")
            ));
        }
    }

    // References into values.yaml and named templates.
    let all_text: String = chart
        .texts
        .iter()
        .map(|(_, text)| text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    for (file, text) in &chart.texts {
        for (at, marker) in text.match_indices(".Values.") {
            let path: String = text[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect();
            let path = path.trim_end_matches('.');
            if values_lookup(&chart.values, path).is_none() {
                problems.push(format!(
                    "{CHART}/templates/{file}: .Values.{path} is not in values.yaml"
                ));
            }
        }
        for marker in ["include \"", "template \""] {
            for (at, _) in text.match_indices(marker) {
                let name = text[at + marker.len()..].split('"').next().unwrap_or("");
                if !all_text.contains(&format!("define \"{name}\"")) {
                    problems.push(format!(
                        "{CHART}/templates/{file}: {marker}{name}\" is not defined"
                    ));
                }
            }
        }
    }

    // The objects the chart must have.
    let find = |wanted_kind: &str, wanted_component: Option<&str>| {
        chart.docs.iter().map(|(_, doc)| doc).find(|doc| {
            kind(doc) == wanted_kind
                && wanted_component.is_none_or(|wanted| component(&doc["metadata"]["labels"]) == Some(wanted))
        })
    };
    for (file, doc) in &chart.docs {
        if str_at(doc, &["apiVersion"]).is_none() || kind(doc).is_empty() || name(doc).is_empty() {
            problems.push(format!(
                "{CHART}/templates/{file}: a manifest without apiVersion, kind or metadata.name"
            ));
        }
    }
    let deployment = find("Deployment", Some("gateway"));
    let statefulset = find("StatefulSet", Some("shard"));
    for (what, found) in [
        ("a gateway Deployment", deployment.is_some()),
        ("a gateway Service", find("Service", Some("gateway")).is_some()),
        ("a shard StatefulSet", statefulset.is_some()),
        ("a ConfigMap", find("ConfigMap", None).is_some()),
        ("a Secret", find("Secret", None).is_some()),
    ] {
        if !found {
            problems.push(format!("{CHART}: no {what}"));
        }
    }
    match find("HorizontalPodAutoscaler", Some("gateway")) {
        Some(hpa) => {
            if str_at(hpa, &["apiVersion"]) != Some("autoscaling/v2") {
                problems.push(format!("{CHART}: the gateway HPA is not autoscaling/v2"));
            }
            let target = (
                str_at(hpa, &["spec", "scaleTargetRef", "kind"]),
                str_at(hpa, &["spec", "scaleTargetRef", "name"]),
            );
            if target != (Some("Deployment"), deployment.map(name)) {
                problems.push(format!(
                    "{CHART}: the gateway HPA scales {target:?}, not the gateway Deployment"
                ));
            }
        }
        None => problems.push(format!("{CHART}: no HorizontalPodAutoscaler for the gateways")),
    }

    // Services select a workload and target its declared ports.
    for service in chart
        .docs
        .iter()
        .map(|(_, doc)| doc)
        .filter(|doc| kind(doc) == "Service")
    {
        let wanted = component(&service["spec"]["selector"]);
        let workload = chart.docs.iter().map(|(_, doc)| doc).find(|doc| {
            WORKLOADS.contains(&kind(doc))
                && wanted.is_some()
                && component(&doc["spec"]["template"]["metadata"]["labels"]) == wanted
        });
        let Some(workload) = workload else {
            problems.push(format!(
                "{CHART}: Service {} selects no workload of the chart (component {wanted:?})",
                name(service)
            ));
            continue;
        };
        let declared: Vec<(Option<String>, u64)> = seq(&workload["spec"]["template"]["spec"]["containers"])
            .iter()
            .flat_map(|container| seq(&container["ports"]))
            .map(|port| {
                (
                    str_at(port, &["name"]).map(str::to_string),
                    port["containerPort"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        for port in seq(&service["spec"]["ports"]) {
            let target = port.get("targetPort").or_else(|| port.get("port"));
            let matches = match target {
                Some(Value::Number(number)) => declared
                    .iter()
                    .any(|(_, declared)| Some(*declared) == number.as_u64()),
                Some(Value::String(port_name)) => declared
                    .iter()
                    .any(|(name, _)| name.as_deref() == Some(port_name)),
                _ => false,
            };
            if !matches {
                problems.push(format!(
                    "{CHART}: Service {} targets port {}, which {} does not declare",
                    name(service),
                    shown(target.and_then(scalar)),
                    name(workload)
                ));
            }
        }
    }

    // Probes, resources and secrets of every relay container.
    let secret_keys: Vec<String> = find("Secret", None)
        .and_then(|secret| secret["stringData"].as_mapping().or(secret["data"].as_mapping()))
        .map(|data| data.keys().filter_map(scalar).collect())
        .unwrap_or_default();
    if values_lookup(&chart.values, "existingSecret").is_none() {
        problems.push(format!("{CHART}/values.yaml: no existingSecret"));
    }
    for (file, doc) in chart
        .docs
        .iter()
        .filter(|(_, doc)| WORKLOADS.contains(&kind(doc)))
    {
        for container in seq(&doc["spec"]["template"]["spec"]["containers"]) {
            let container_name = str_at(container, &["name"]).unwrap_or("?");
            let origin = format!("{CHART}/templates/{file} container {container_name}");
            for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
                if str_at(container, &[probe, "httpGet", "path"]) != Some(path) {
                    problems.push(format!("{origin}: {probe} must GET {path}"));
                }
            }
            let resources = values_lookup(&chart.values, &format!("{container_name}.resources"));
            let filled = |part: &str| {
                resources
                    .and_then(|resources| resources.get(part))
                    .and_then(Value::as_mapping)
                    .is_some_and(|map| !map.is_empty())
            };
            if container.get("resources").is_none() || !filled("requests") || !filled("limits") {
                problems.push(format!(
                    "{origin}: resources must come from values.yaml {container_name}.resources \
                     with requests and limits"
                ));
            }
            for variable in seq(&container["env"]) {
                let Some(reference) = variable
                    .get("valueFrom")
                    .and_then(|from| from.get("secretKeyRef"))
                else {
                    continue;
                };
                let key = str_at(reference, &["key"]).unwrap_or("");
                if str_at(reference, &["name"]) != Some("INCLUDE(ahp-relay.secretName)") {
                    problems.push(format!(
                        "{origin}: secretKeyRef {key} must name the Secret through ahp-relay.secretName"
                    ));
                }
                if !secret_keys.iter().any(|known| known == key) {
                    problems.push(format!(
                        "{origin}: secret key {key} is not in the chart's Secret ({secret_keys:?})"
                    ));
                }
            }
        }
    }

    // Shards advertise their pod's DNS name under the headless Service; gateways dial those names.
    if let Some(statefulset) = statefulset {
        let service_name = str_at(statefulset, &["spec", "serviceName"]).unwrap_or("");
        let headless = chart
            .docs
            .iter()
            .map(|(_, doc)| doc)
            .find(|doc| kind(doc) == "Service" && name(doc) == service_name);
        if headless.and_then(|service| str_at(service, &["spec", "clusterIP"])) != Some("None") {
            problems.push(format!(
                "{CHART}: the shard StatefulSet's serviceName {service_name} is not a headless Service"
            ));
        }
        if name(statefulset) != "INCLUDE(ahp-relay.shardServiceName)" || service_name != name(statefulset) {
            problems.push(format!(
                "{CHART}: the shard StatefulSet and its Service must be named ahp-relay.shardServiceName, \
                 which ahp-relay.shardUrls builds pod names from"
            ));
        }
        for process in processes.iter().filter(|process| process.sub() == "shard") {
            let position = |variable: &str| process.env.iter().position(|(name, _)| name == variable);
            let advertise = process.env_value("AHP_RELAY_ADVERTISE_URL").unwrap_or("");
            let grpc = process.port_named("grpc");
            let expected_prefix = format!("http://$(POD_NAME).{service_name}.");
            if !advertise.starts_with(&expected_prefix)
                || grpc.is_none_or(|port| !advertise.ends_with(&format!(":{port}")))
            {
                problems.push(format!(
                    "{}: AHP_RELAY_ADVERTISE_URL {advertise:?} must be {expected_prefix}...:{}",
                    process.origin,
                    shown(grpc)
                ));
            }
            if position("POD_NAME").is_none() || position("POD_NAME") > position("AHP_RELAY_ADVERTISE_URL") {
                problems.push(format!(
                    "{}: POD_NAME must be defined before AHP_RELAY_ADVERTISE_URL to expand",
                    process.origin
                ));
            }
        }
    }
    let helpers = chart
        .texts
        .iter()
        .find(|(name, _)| name == "_helpers.tpl")
        .map_or("", |(_, text)| text.as_str());
    let shard_urls = helpers
        .split("define \"ahp-relay.shardUrls\"")
        .nth(1)
        .and_then(|rest| rest.split("define \"").next());
    if !shard_urls.is_some_and(|body| {
        body.contains(".Values.shard.grpcPort") && body.contains("ahp-relay.shardServiceName")
    }) {
        problems.push(format!(
            "{CHART}/templates/_helpers.tpl: ahp-relay.shardUrls must build URLs from \
             ahp-relay.shardServiceName and .Values.shard.grpcPort"
        ));
    }
    for process in processes.iter().filter(|process| process.sub() == "gateway") {
        if process.env_value("AHP_RELAY_SHARD_URL") != Some("INCLUDE(ahp-relay.shardUrls)") {
            problems.push(format!(
                "{}: AHP_RELAY_SHARD_URL must be include \"ahp-relay.shardUrls\"",
                process.origin
            ));
        }
    }
    assert_no_problems("Helm chart wiring", problems);
}

#[test]
fn dockerfile_builds_and_runs_the_binary() {
    let instructions = dockerfile();
    let mut problems = Vec::new();
    let manifest = read("Cargo.toml");
    let rust_version = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("rust-version = "))
        .map(|version| version.trim_matches('"').to_string())
        .expect("the workspace's rust-version");
    let builder = instructions
        .iter()
        .find(|instruction| instruction.keyword == "FROM")
        .map_or("", |from| from.args.as_str());
    let tag_ok = builder
        .strip_prefix(&format!("rust:{rust_version}"))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ' ', '.']));
    if !tag_ok {
        problems.push(format!(
            "{DOCKERFILE}: the builder is {builder:?}, not rust:{rust_version} (the workspace's rust-version)"
        ));
    }
    let runs: Vec<String> = instructions
        .iter()
        .filter(|instruction| instruction.keyword == "RUN")
        .map(|instruction| instruction.args.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    if !runs
        .iter()
        .any(|run| run.contains("cargo build --release --locked -p ahp-relay"))
    {
        problems.push(format!(
            "{DOCKERFILE}: no `cargo build --release --locked -p ahp-relay`"
        ));
    }
    let stage = final_stage(&instructions);
    let runtime = stage.first().map_or("", |from| from.args.as_str());
    let distroless = runtime.starts_with("gcr.io/distroless/cc");
    let slim_debian = runtime.starts_with("debian:") && runtime.contains("slim");
    if !slim_debian && !distroless {
        problems.push(format!(
            "{DOCKERFILE}: the runtime stage is {runtime:?}, not debian:*-slim or distroless cc"
        ));
    }
    let installs = |package: &str| {
        stage.iter().any(|instruction| {
            instruction.keyword == "RUN"
                && instruction.args.contains("apt-get install")
                && instruction.args.split_whitespace().any(|word| word == package)
        })
    };
    if !distroless && !installs("ca-certificates") {
        problems.push(format!(
            "{DOCKERFILE}: the runtime stage does not install ca-certificates"
        ));
    }
    match stage
        .iter()
        .rev()
        .find(|instruction| instruction.keyword == "USER")
    {
        Some(user) => {
            let account = user.args.split(':').next().unwrap_or("");
            if account == "root" || account == "0" {
                problems.push(format!("{DOCKERFILE}: the runtime runs as root ({})", user.args));
            }
        }
        None => problems.push(format!(
            "{DOCKERFILE}: the runtime stage sets no USER (it would run as root)"
        )),
    }
    let entrypoint = stage
        .iter()
        .rev()
        .find(|instruction| instruction.keyword == "ENTRYPOINT");
    if entrypoint.and_then(|entrypoint| json_words(&entrypoint.args)) != Some(vec!["ahp-relay".to_string()]) {
        problems.push(format!("{DOCKERFILE}: ENTRYPOINT must be [\"ahp-relay\"]"));
    }
    let on_path = stage.iter().any(|instruction| {
        instruction.keyword == "COPY"
            && instruction.args.starts_with("--from=")
            && [
                "/usr/local/bin/ahp-relay",
                "/usr/bin/ahp-relay",
                "/usr/local/bin/",
                "/usr/bin/",
            ]
            .iter()
            .any(|target| instruction.args.ends_with(target))
    });
    if !on_path {
        problems.push(format!(
            "{DOCKERFILE}: the runtime stage does not copy ahp-relay into /usr/local/bin or /usr/bin"
        ));
    }
    let ignore = read(".dockerignore");
    if !ignore
        .lines()
        .map(str::trim)
        .any(|line| matches!(line, "target" | "target/" | "/target" | "/target/"))
    {
        problems.push(".dockerignore does not exclude target/".to_string());
    }
    assert_no_problems("Dockerfile", problems);
}
