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
//!    image; no host port is published twice; a runner service lists every shard, names the shards' agents
//!    file, has a workspaces volume and CPU and memory limits;
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

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml_ng::Value;

#[path = "deploy_files/files.rs"]
mod files;

use files::*;

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

/// Where the routes of each HTTP-serving subcommand are declared (files, or folders searched for `*.rs`).
fn route_sources(sub: &str) -> Option<&'static [&'static str]> {
    match sub {
        // `serve` mounts the gateway's router too.
        "gateway" | "serve" => Some(&["services/gateway/src/server.rs"]),
        "runner" => Some(&["services/relay/src/runner.rs"]),
        // The shard's HTTP server (--http-listen) may live with the shard, its gRPC server or the binary.
        "shard" => Some(&["services/shard/src", "services/rpc/src", "services/relay/src"]),
        _ => None,
    }
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
    // The internal link runs with identity assertions: every shard has the gateways' public key, every gateway
    // the private one (made by the `identity-keys` init service).
    let sets = |process: &Process, name: &str| process.env.iter().any(|(key, _)| key == name);
    for shard in &shards {
        if !sets(shard, "AHP_RELAY_IDENTITY_VERIFYING_KEY") {
            problems.push(format!("{}: no AHP_RELAY_IDENTITY_VERIFYING_KEY", shard.origin));
        }
    }
    for gateway in &gateways {
        if !sets(gateway, "AHP_RELAY_IDENTITY_SIGNING_KEY") {
            problems.push(format!("{}: no AHP_RELAY_IDENTITY_SIGNING_KEY", gateway.origin));
        }
    }
    if !processes.iter().any(|process| process.sub() == "identity-keys") {
        problems.push(format!(
            "{COMPOSE}: no identity-keys service makes the link's keys"
        ));
    }
    // And over TLS (issue 34): every shard serves a certificate (made by the `internal-tls` init service, which
    // it waits for), and every process that calls the shards trusts its CA and reaches them over https://.
    let setting = |process: &Process, name: &str| {
        process
            .env
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.clone())
    };
    // A named volume mounted where the image has no directory is made owned by root, and the image's user
    // cannot write there: every such mount point of the relay's image is made (for its user) in the image.
    let made_in_image: String = final_stage(&dockerfile())
        .iter()
        .filter(|instruction| instruction.keyword == "RUN")
        .map(|instruction| instruction.args.clone())
        .collect();
    for (name, service) in &services {
        if str_at(service, &["build", "target"]).is_some() || str_at(service, &["build", "context"]).is_none()
        {
            continue;
        }
        for mount in seq(&service["volumes"]).iter().filter_map(scalar) {
            let mut parts = mount.split(':');
            let (Some(source), Some(target)) = (parts.next(), parts.next()) else {
                continue;
            };
            let named = !source.starts_with('.') && !source.starts_with('/');
            if named
                && !mount.ends_with(":ro")
                && !made_in_image.split_whitespace().any(|word| word == target)
            {
                problems.push(format!(
                    "{COMPOSE}: {name} writes to volume {source} at {target}, which {DOCKERFILE} does not make for its user"
                ));
            }
        }
    }
    if !processes.iter().any(|process| process.sub() == "internal-tls") {
        problems.push(format!(
            "{COMPOSE}: no internal-tls service makes the link's certificates"
        ));
    }
    for shard in &shards {
        for variable in ["AHP_RELAY_INTERNAL_TLS_CERT", "AHP_RELAY_INTERNAL_TLS_KEY"] {
            if !sets(shard, variable) {
                problems.push(format!(
                    "{}: no {variable}: the shard serves plaintext",
                    shard.origin
                ));
            }
        }
        if depends_on(services[&service_name(shard)], "internal-tls").as_deref()
            != Some("service_completed_successfully")
        {
            problems.push(format!("{}: does not wait for internal-tls", shard.origin));
        }
    }
    for caller in processes
        .iter()
        .filter(|process| matches!(process.sub(), "gateway" | "runner"))
    {
        let urls = setting(caller, "AHP_RELAY_SHARD_URL").unwrap_or_default();
        if urls.is_empty() || urls.split(',').any(|url| !url.starts_with("https://")) {
            problems.push(format!(
                "{}: reaches the shards at {urls:?}, not over https://",
                caller.origin
            ));
        }
        if !sets(caller, "AHP_RELAY_INTERNAL_TLS_CA") {
            problems.push(format!(
                "{}: no AHP_RELAY_INTERNAL_TLS_CA to check the shards with",
                caller.origin
            ));
        }
        if sets(caller, "AHP_RELAY_INTERNAL_TLS_KEY") {
            problems.push(format!("{}: holds a TLS key it has no use for", caller.origin));
        }
    }
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
                } else if networks_of(service).is_disjoint(&networks_of(services[&host])) {
                    problems.push(format!(
                        "{}: {variable} names {host}, but they share no network",
                        process.origin
                    ));
                }
            }
        }
    }
    for shard in &shards {
        let name = service_name(shard);
        // https:// when the shard serves TLS (a certificate of its own).
        let scheme = if sets(shard, "AHP_RELAY_INTERNAL_TLS_CERT") {
            "https"
        } else {
            "http"
        };
        let expected = grpc_port(shard).map(|port| format!("{scheme}://{name}:{port}"));
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
    let runners: Vec<&Process> = processes
        .iter()
        .filter(|process| process.sub() == "runner")
        .collect();
    if runners.is_empty() {
        problems.push(format!(
            "{COMPOSE}: no runner service (agents must not run in the shards)"
        ));
    }
    let agents_file = |process: &Process| process.env_value("AHP_RELAY_AGENTS").map(str::to_string);
    for runner in &runners {
        let service = services[&service_name(runner)];
        // Agents run arbitrary code: their container reaches the shards and nothing of the store or the bus.
        for data in ["postgres", "redis"] {
            if let Some(data_service) = services.get(data) {
                if !networks_of(service).is_disjoint(&networks_of(data_service)) {
                    problems.push(format!(
                        "{}: the runner (agents' code) shares a network with {data}",
                        runner.origin
                    ));
                }
            }
        }
        if agents_file(runner).is_none()
            || shards
                .iter()
                .any(|shard| agents_file(shard) != agents_file(runner))
        {
            problems.push(format!(
                "{}: AHP_RELAY_AGENTS must name the same agents file as every shard's",
                runner.origin
            ));
        }
        if !seq(&service["volumes"])
            .iter()
            .filter_map(scalar)
            .any(|volume| volume.ends_with("/workspaces"))
        {
            problems.push(format!("{}: no volume for the agents' workspaces", runner.origin));
        }
        for limit in ["cpus", "memory"] {
            if str_at(service, &["deploy", "resources", "limits", limit]).is_none() {
                problems.push(format!("{}: no deploy.resources.limits.{limit}", runner.origin));
            }
        }
    }
    for gateway in gateways.iter().chain(&runners) {
        let urls = help(gateway.sub())
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
            // The scheme is the one the gateways' shard URLs use (https with internal TLS).
            let expected_prefix = format!("INCLUDE(ahp-relay.grpcScheme)://$(POD_NAME).{service_name}.");
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

/// Secrets in docker-compose.yml are required (`${VAR:?…}`), never defaulted (`${VAR:-…}` would run a
/// deployment on a secret everyone can read in this repository), and the gateways publish on loopback only.
#[test]
fn compose_requires_its_secrets_and_publishes_on_loopback() {
    let text = read(COMPOSE);
    let mut problems = Vec::new();
    for secret in [
        "AHP_RELAY_JWT_SECRET",
        "AHP_RELAY_INTERNAL_SECRET",
        "AHP_RELAY_RUNNER_SECRET",
        "REDIS_PASSWORD",
        "POSTGRES_PASSWORD",
    ] {
        if text.contains(&format!("${{{secret}:-")) || text.contains(&format!("${{{secret}-")) {
            problems.push(format!("{COMPOSE}: {secret} has a default value"));
        }
        if !text.contains(&format!("${{{secret}:?")) {
            problems.push(format!(
                "{COMPOSE}: {secret} is not required with ${{{secret}:?…}}"
            ));
        }
    }
    let compose = compose();
    for (name, service) in compose_services(&compose) {
        for port in seq(&service["ports"]).iter().filter_map(scalar) {
            if !port.starts_with("127.0.0.1:") {
                problems.push(format!("{COMPOSE}: {name} publishes {port} on every interface"));
            }
        }
    }
    assert_no_problems("docker-compose.yml secrets", problems);
}

/// Issue 22: agents run sandboxed and never see a relay secret. The runner image has bubblewrap; the relay's
/// own secrets (JWT, internal, runner) reach every process as files, never as environment variables, in
/// compose and in the chart; compose lets only the runner use user namespaces; the chart's runners have no
/// service-account token, may take a VM-backed runtime class, and may reach only the shards, DNS and public
/// addresses (not the cloud metadata service); the container image prints no admin token; and every agents
/// file shipped is one the relay accepts (no deployment-wide credential without `shared_credentials`).
#[test]
fn agents_are_sandboxed_and_relay_secrets_are_files() {
    const RELAY_SECRETS: &[&str] = &[
        "AHP_RELAY_JWT_SECRET",
        "AHP_RELAY_INTERNAL_SECRET",
        "AHP_RELAY_RUNNER_SECRET",
    ];
    let mut problems = Vec::new();

    // The Dockerfile.
    let instructions = dockerfile();
    let runner_stage: Vec<&Instruction> = instructions
        .iter()
        .skip_while(|instruction| {
            !(instruction.keyword == "FROM" && instruction.args.ends_with(" AS runner"))
        })
        .take_while(|instruction| instruction.keyword != "FROM" || instruction.args.ends_with(" AS runner"))
        .collect();
    if !runner_stage.iter().any(|instruction| {
        instruction.keyword == "RUN"
            && instruction.args.contains("apt-get install")
            && instruction
                .args
                .split_whitespace()
                .any(|word| word == "bubblewrap")
    }) {
        problems.push(format!(
            "{DOCKERFILE}: the runner stage does not install bubblewrap"
        ));
    }
    if !final_stage(&instructions).iter().any(|instruction| {
        instruction.keyword == "ENV" && instruction.args.contains("AHP_RELAY_NO_DEV_TOKEN=true")
    }) {
        problems.push(format!(
            "{DOCKERFILE}: the runtime image does not set AHP_RELAY_NO_DEV_TOKEN=true"
        ));
    }

    // docker-compose.yml.
    let compose = compose();
    let services: BTreeMap<String, &Value> = compose_services(&compose).into_iter().collect();
    for process in compose_processes(&compose) {
        let service_name = process.origin.rsplit(' ').next().unwrap_or("").to_string();
        let service = services[&service_name];
        let secrets: Vec<String> = seq(&service["secrets"])
            .iter()
            .filter_map(|secret| {
                str_at(secret, &["source"])
                    .map(str::to_string)
                    .or_else(|| scalar(secret))
            })
            .collect();
        for (variable, value) in &process.env {
            if RELAY_SECRETS.contains(&variable.as_str()) {
                problems.push(format!(
                    "{}: {variable} is an environment variable; give it as a file",
                    process.origin
                ));
            }
            let Some(secret) = variable
                .strip_suffix("_FILE")
                .filter(|name| RELAY_SECRETS.contains(name))
                .and(value.as_deref())
            else {
                continue;
            };
            let named = secret.strip_prefix("/run/secrets/").unwrap_or("");
            if !secrets.iter().any(|listed| listed == named) {
                problems.push(format!(
                    "{}: {variable} is {secret}, which is not one of its compose secrets ({secrets:?})",
                    process.origin
                ));
            }
        }
        if process.sub() == "runner" {
            let options: Vec<String> = seq(&service["security_opt"]).iter().filter_map(scalar).collect();
            if !options.iter().any(|option| option == "seccomp=unconfined") {
                problems.push(format!(
                    "{}: the runner's sandboxes need user namespaces (security_opt seccomp=unconfined)",
                    process.origin
                ));
            }
        } else if !seq(&service["security_opt"]).is_empty() {
            problems.push(format!(
                "{}: only the runner may loosen its container's security",
                process.origin
            ));
        }
    }

    // The chart.
    let chart = chart();
    for (file, text) in &chart.texts {
        for secret in ["jwt-secret", "internal-secret", "runner-secret"] {
            if text.contains(&format!("key: {secret}")) && text.contains("secretKeyRef") {
                let near = text.match_indices(&format!("key: {secret}")).any(|(at, _)| {
                    text[..at]
                        .rsplit("- name:")
                        .next()
                        .is_some_and(|item| item.contains("secretKeyRef"))
                });
                if near {
                    problems.push(format!(
                        "{CHART}/templates/{file}: {secret} is given as an environment variable"
                    ));
                }
            }
        }
    }
    let (processes, _) = helm_processes(&chart);
    for process in &processes {
        for (variable, _) in &process.env {
            if RELAY_SECRETS.contains(&variable.as_str()) {
                problems.push(format!(
                    "{}: {variable} is an environment variable; give it as a file",
                    process.origin
                ));
            }
        }
    }
    let runner = chart
        .docs
        .iter()
        .map(|(_, doc)| doc)
        .find(|doc| kind(doc) == "Deployment" && component(&doc["metadata"]["labels"]) == Some("runner"));
    match runner {
        Some(runner) => {
            let pod = &runner["spec"]["template"]["spec"];
            if pod["automountServiceAccountToken"].as_bool() != Some(false) {
                problems.push(format!("{CHART}: runner pods mount a service-account token"));
            }
            if pod.get("runtimeClassName").is_none() {
                problems.push(format!("{CHART}: runner pods cannot take a runtimeClassName"));
            }
            // Its root filesystem is read-only: bubblewrap and tools need a writable /tmp.
            let tmp_mounted = seq(&pod["containers"]).iter().all(|container| {
                seq(&container["volumeMounts"])
                    .iter()
                    .any(|mount| scalar(&mount["mountPath"]).as_deref() == Some("/tmp"))
            });
            if !tmp_mounted {
                problems.push(format!("{CHART}: the runner has no writable /tmp"));
            }
        }
        None => problems.push(format!("{CHART}: no runner Deployment")),
    }
    let runner_text = chart
        .texts
        .iter()
        .find(|(name, _)| name == "runner-deployment.yaml")
        .map_or("", |(_, text)| text.as_str());
    if !runner_text.contains(".Values.runner.runtimeClassName") {
        problems.push(format!(
            "{CHART}: the runner's runtimeClassName does not come from values.yaml"
        ));
    }
    let policy =
        chart.docs.iter().map(|(_, doc)| doc).find(|doc| {
            kind(doc) == "NetworkPolicy" && component(&doc["metadata"]["labels"]) == Some("runner")
        });
    let egress_types = policy
        .map(|policy| {
            seq(&policy["spec"]["policyTypes"])
                .iter()
                .filter_map(scalar)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if !egress_types.iter().any(|kind| kind == "Egress") {
        problems.push(format!(
            "{CHART}: the runners' NetworkPolicy does not restrict egress"
        ));
    }
    let excluded: Vec<String> = values_lookup(&chart.values, "runner.egress.excludedCidrs")
        .map(|cidrs| seq(cidrs).iter().filter_map(scalar).collect())
        .unwrap_or_default();
    for needed in ["169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] {
        if !excluded.iter().any(|cidr| cidr == needed) {
            problems.push(format!(
                "{CHART}/values.yaml: runner.egress.excludedCidrs leaves out {needed}"
            ));
        }
    }

    // The agents files shipped.
    let toml_in_values = values_lookup(&chart.values, "agents.toml")
        .and_then(scalar)
        .unwrap_or_default();
    for (origin, text) in [
        (
            "deploy/agents.example.toml".to_string(),
            read("deploy/agents.example.toml"),
        ),
        (
            "deploy/agents.compose.toml".to_string(),
            read("deploy/agents.compose.toml"),
        ),
        (format!("{CHART}/values.yaml agents.toml"), toml_in_values),
    ] {
        if let Err(error) = relay_runner::acp::AgentsFile::parse(std::path::Path::new(&origin), &text) {
            problems.push(format!("{origin}: {error}"));
        }
    }
    assert_no_problems("sandboxed agents and secret files", problems);
}

/// The networks a compose service joins (`default` when it names none).
fn networks_of(service: &Value) -> BTreeSet<String> {
    match &service["networks"] {
        Value::Sequence(items) => items.iter().filter_map(scalar).collect(),
        Value::Mapping(map) => map.keys().filter_map(scalar).collect(),
        _ => BTreeSet::from(["default".to_string()]),
    }
}
