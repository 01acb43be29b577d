//! Reading the deployment files for tests/deploy_files.rs: the binary's `--help` output parsed into
//! options, docker-compose.yml, deploy/Dockerfile and the Helm chart (templates rendered the simple way the
//! test's module docs describe), and the relay processes they start.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde::Deserialize;
use serde_yaml_ng::Value;

/// Options holding listen addresses, and which of them serve HTTP (health, readiness, metrics, WebSockets).
pub const LISTEN_OPTIONS: &[&str] = &["listen", "grpc-listen", "http-listen"];
pub const HTTP_LISTEN_OPTIONS: &[&str] = &["listen", "http-listen"];

// ---------------------------------------------------------------------------------------------------------
// The binary's own description of itself.

/// One option of `ahp-relay <sub> --help`.
#[derive(Debug)]
pub struct HelpOption {
    pub long: String,
    pub env: Option<String>,
    pub default: Option<String>,
}

/// The options of one subcommand.
#[derive(Debug)]
pub struct Help {
    pub options: Vec<HelpOption>,
}

impl Help {
    pub fn option(&self, long: &str) -> Option<&HelpOption> {
        self.options.iter().find(|option| option.long == long)
    }

    pub fn reads_env(&self, name: &str) -> bool {
        self.options
            .iter()
            .any(|option| option.env.as_deref() == Some(name))
    }
}

/// `ahp-relay <sub> --help`, parsed (cached); `None` when the binary has no such subcommand. The environment
/// is cleared so that variables set around the test (DATABASE_URL, …) do not show up in the output.
pub fn help(sub: &str) -> Option<&'static Help> {
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
pub fn parse_help(text: &str) -> Help {
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

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_root().join(relative))
        .unwrap_or_else(|error| panic!("reading {relative}: {error}"))
}

pub fn parse_yaml(relative: &str, text: &str) -> Value {
    let mut value: Value =
        serde_yaml_ng::from_str(text).unwrap_or_else(|error| panic!("{relative} is not valid YAML: {error}"));
    value
        .apply_merge()
        .unwrap_or_else(|error| panic!("{relative}: merge keys: {error}"));
    value
}

pub fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// A value for a message, or `nothing`.
pub fn shown(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "nothing".to_string(), |value| value.to_string())
}

pub fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |value, key| value.get(*key))?
        .as_str()
}

pub fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map_or(&[], Vec::as_slice)
}

/// `host:port` (or `[v6]:port`).
pub fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    Some((
        host.trim_start_matches('[').trim_end_matches(']'),
        port.parse().ok()?,
    ))
}

/// `scheme://host[:port][/path]` → (host, port, path).
pub fn parse_url(url: &str) -> Option<(String, Option<u16>, String)> {
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
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// An HTTP endpoint a deployment file expects a process to serve.
#[derive(Debug)]
pub struct Probe {
    pub what: String,
    pub path: Option<String>,
    pub port: PortRef,
}

/// One `ahp-relay` process as a deployment file starts it.
#[derive(Debug, Default)]
pub struct Process {
    pub origin: String,
    /// Subcommand first, then its arguments.
    pub args: Vec<String>,
    /// Environment variables in order; `None` for values taken from a Secret or the pod's fields.
    pub env: Vec<(String, Option<String>)>,
    /// Ports the container publishes or declares (name, number).
    pub container_ports: Vec<(Option<String>, u16)>,
    /// Whether every listen port must be declared among `container_ports` (Kubernetes containerPorts).
    pub declares_all_ports: bool,
    pub probes: Vec<Probe>,
}

impl Process {
    pub fn sub(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    pub fn flags(&self) -> impl Iterator<Item = &str> {
        self.args
            .iter()
            .filter_map(|arg| arg.strip_prefix("--"))
            .map(|flag| flag.split('=').next().unwrap_or(flag))
    }

    pub fn flag_value(&self, long: &str) -> Option<String> {
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

    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
    }

    /// The value the process ends up with for `option`: flag, else environment, else default.
    pub fn setting(&self, option: &HelpOption) -> Option<String> {
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
    pub fn listen_addresses(&self, help: &Help) -> Vec<(String, String)> {
        LISTEN_OPTIONS
            .iter()
            .filter_map(|long| help.option(long))
            .filter_map(|option| Some((option.long.clone(), self.setting(option)?)))
            .collect()
    }

    pub fn port_named(&self, name: &str) -> Option<u16> {
        self.container_ports
            .iter()
            .find(|(port_name, _)| port_name.as_deref() == Some(name))
            .map(|(_, n)| *n)
    }
}

pub const COMPOSE: &str = "docker-compose.yml";
pub const DOCKERFILE: &str = "deploy/Dockerfile";
pub const CHART: &str = "helm/ahp-relay";

pub fn compose() -> Value {
    parse_yaml(COMPOSE, &read(COMPOSE))
}

pub fn compose_services(compose: &Value) -> Vec<(String, &Value)> {
    compose
        .get("services")
        .and_then(Value::as_mapping)
        .expect("docker-compose.yml has services")
        .iter()
        .map(|(name, service)| (scalar(name).unwrap_or_default(), service))
        .collect()
}

pub fn is_relay_service(service: &Value) -> bool {
    str_at(service, &["build", "dockerfile"]) == Some(DOCKERFILE)
}

/// `command:` as a list of words (list form, or a string split at whitespace).
pub fn words(value: &Value) -> Vec<String> {
    match value {
        Value::String(text) => text.split_whitespace().map(str::to_string).collect(),
        Value::Sequence(items) => items.iter().filter_map(scalar).collect(),
        _ => Vec::new(),
    }
}

pub fn compose_processes(compose: &Value) -> Vec<Process> {
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
pub fn healthcheck_words(service: &Value) -> Vec<String> {
    words(&service["healthcheck"]["test"])
        .iter()
        .skip_while(|word| *word == "CMD" || *word == "CMD-SHELL")
        .flat_map(|word| word.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// One Dockerfile instruction, continuation lines joined.
#[derive(Debug)]
pub struct Instruction {
    pub keyword: String,
    pub args: String,
}

pub fn dockerfile() -> Vec<Instruction> {
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
pub fn final_stage(instructions: &[Instruction]) -> &[Instruction] {
    let start = instructions
        .iter()
        .rposition(|instruction| instruction.keyword == "FROM")
        .unwrap_or(0);
    &instructions[start..]
}

pub fn json_words(args: &str) -> Option<Vec<String>> {
    serde_json::from_str(args).ok()
}

pub fn dockerfile_process(instructions: &[Instruction]) -> Process {
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
pub struct Chart {
    pub values: Value,
    /// (file name, text) of every file in templates/, including _helpers.tpl and NOTES.txt.
    pub texts: Vec<(String, String)>,
    /// (file name, manifest) of every YAML document the templates render to.
    pub docs: Vec<(String, Value)>,
}

pub fn chart() -> Chart {
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
pub fn render_template(text: &str, values: &Value) -> String {
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

pub fn render_action(action: &str, values: &Value) -> String {
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

pub fn values_lookup<'a>(values: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .try_fold(values, |value, key| value.as_mapping()?.get(key))
}

pub fn kind(doc: &Value) -> &str {
    str_at(doc, &["kind"]).unwrap_or("")
}

pub fn name(doc: &Value) -> &str {
    str_at(doc, &["metadata", "name"]).unwrap_or("")
}

pub fn component(labels: &Value) -> Option<&str> {
    labels.get("app.kubernetes.io/component").and_then(Value::as_str)
}

pub const WORKLOADS: &[&str] = &["Deployment", "StatefulSet", "DaemonSet", "Job"];
pub const RELAY_IMAGE: &str = "INCLUDE(ahp-relay.image)";
/// The runners' image: the same binary, built with what agents need (the Dockerfile's `runner` target).
pub const RUNNER_IMAGE: &str = "INCLUDE(ahp-relay.runnerImage)";

/// The relay containers of the chart's workloads, with the problems met reading them.
pub fn helm_processes(chart: &Chart) -> (Vec<Process>, Vec<String>) {
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
        let relay_image =
            |container: &&Value| matches!(str_at(container, &["image"]), Some(RELAY_IMAGE | RUNNER_IMAGE));
        for container in containers.filter(relay_image) {
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
pub fn notes_processes(chart: &Chart) -> Vec<Process> {
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

pub fn all_processes() -> Vec<Process> {
    let chart = chart();
    let mut processes = compose_processes(&compose());
    processes.extend(helm_processes(&chart).0);
    processes.push(dockerfile_process(&dockerfile()));
    processes.extend(notes_processes(&chart));
    processes
}

/// Fails with every problem, one per line, in first-seen order without repeats.
pub fn assert_no_problems(what: &str, problems: Vec<String>) {
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

/// The text of a source file, or of every `*.rs` file under a folder.
pub fn rust_sources(relative: &str) -> Vec<String> {
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
pub fn depends_on(service: &Value, other: &str) -> Option<String> {
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
